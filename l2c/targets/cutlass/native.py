"""The steady state of a served CUTLASS call in one C++ function: the call signature, one hash lookup, the output's
allocation and the planned launch, without Python in between.

Measured on the H200's host (`benchmarks/results/evidence_s13/served_path_h200.json`), a served `l2c.matmul` of a
small shape cost 22.5 us of host time against torch.matmul's 18.0: the Python around the launch (the signature,
the lookup, the checks, `a.new_empty`, ctypes) was 9-10 us of it, and in the `call` protocol every microsecond is
a few percent of a small GEMM's figure. `ServedCalls` is a table per dispatcher of the CUTLASS call plans that
already served a plain eager call (l2c.targets.cutlass.kernel, `launcher`): keyed like `l2c.kernel.call_signature`
(shapes, strides, dtypes and devices of A, B and the bias) plus the asked activation, each holding the plan's C
struct (shim.py, a reference to its Python object too) and the output's shape and dtype.
`matmul(a, b, bias, activation, device, stream)` and `linear(x, weight, ...)` (B = weight^T, any leading
dimensions of x) return the output, or None where the table has no such call, autograd records it, a pointer is
not 16-byte aligned, the current device is not the plan's or the launch returns an error: the caller's Python path
then decides, as for any call.

The extension is C++ source compiled once per machine with the host C++ compiler against the running torch
(its headers and libraries) into the build cache, keyed by its text, the compiler and torch's version. It is built
off the calling thread (`start_build`); until it is loaded, and wherever it cannot be built, served calls take the
Python path. `L2C_NATIVE_CALL=0` keeps them there.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Optional

from ... import cache, settings
from . import shim

# the activation argument of a plain call, as the key holds it (None: no activation)
ACTIVATIONS = {None: 0, "none": 0, "relu": 1, "gelu": 2, "silu": 3}

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <unordered_map>

namespace py = pybind11;

extern "C" {
""" + shim.PLAN_STRUCT + r"""
}

namespace {

constexpr int kKeyLength = 19;   // A's 6 words, B's 6, the bias's 6, the activation
using Key = std::array<int64_t, kKeyLength>;

struct KeyHash {
  size_t operator()(Key const& key) const {
    uint64_t h = 1469598103934665603ull;   // FNV-1a over the words
    for (int64_t v : key) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

struct Entry {
  l2c_call_plan const* plan;
  py::object owner;            // the Python object holding the plan's struct: kept alive by the table
  int64_t rows, cols;          // the output as allocated (transposed back when `transposed`)
  at::ScalarType dtype;
  bool transposed;
  int64_t device;
};

int64_t device_word(at::Tensor const& t) {
  return static_cast<int64_t>(t.device().type()) * 1024 + t.device().index();
}

// A: (M, K) and B: (K, N) given as sizes and strides (B of a linear call is weight^T, read off the weight).
Key make_key(at::Tensor const& a, int64_t b_rows, int64_t b_cols, int64_t b_row_stride, int64_t b_col_stride,
             at::Tensor const& b, c10::optional<at::Tensor> const& bias, int64_t activation) {
  Key key{};
  key[0] = a.size(0); key[1] = a.size(1); key[2] = a.stride(0); key[3] = a.stride(1);
  key[4] = static_cast<int64_t>(a.scalar_type()); key[5] = device_word(a);
  key[6] = b_rows; key[7] = b_cols; key[8] = b_row_stride; key[9] = b_col_stride;
  key[10] = static_cast<int64_t>(b.scalar_type()); key[11] = device_word(b);
  if (bias.has_value()) {
    at::Tensor const& c = *bias;
    key[12] = 1; key[13] = c.dim(); key[14] = c.dim() == 1 ? c.size(0) : -1; key[15] = c.dim() == 1 ? c.stride(0) : -1;
    key[16] = static_cast<int64_t>(c.scalar_type()); key[17] = device_word(c);
  }
  key[18] = activation;
  return key;
}

bool records_grad(at::Tensor const& a, at::Tensor const& b, c10::optional<at::Tensor> const& bias) {
  return at::GradMode::is_enabled() &&
         (a.requires_grad() || b.requires_grad() || (bias.has_value() && bias->requires_grad()));
}

class ServedCalls {
 public:
  void add(at::Tensor const& a, at::Tensor const& b, c10::optional<at::Tensor> const& bias, int64_t activation,
           py::object plan, int64_t plan_address, at::Tensor const& out_template, bool transposed, int64_t device) {
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && out_template.dim() == 2, "2-D operands only");
    Key key = make_key(a, b.size(0), b.size(1), b.stride(0), b.stride(1), b, bias, activation);
    entries_[key] = Entry{reinterpret_cast<l2c_call_plan const*>(plan_address), plan, out_template.size(0),
                          out_template.size(1), out_template.scalar_type(), transposed, device};
  }

  py::object matmul(at::Tensor const& a, at::Tensor const& b, c10::optional<at::Tensor> const& bias,
                    int64_t activation, int64_t device, int64_t stream) const {
    if (a.dim() != 2 || b.dim() != 2 || records_grad(a, b, bias)) {
      return py::none();
    }
    Key key = make_key(a, b.size(0), b.size(1), b.stride(0), b.stride(1), b, bias, activation);
    return launch(key, a, b, bias, device, stream);
  }

  py::object linear(at::Tensor const& x, at::Tensor const& weight, c10::optional<at::Tensor> const& bias,
                    int64_t activation, int64_t device, int64_t stream) const {
    if (x.dim() < 2 || weight.dim() != 2 || !x.is_contiguous() || records_grad(x, weight, bias)) {
      return py::none();
    }
    int64_t k = x.size(-1);
    at::Tensor a = x.dim() == 2 ? x : x.view({-1, k});
    Key key = make_key(a, weight.size(1), weight.size(0), weight.stride(1), weight.stride(0), weight, bias,
                       activation);
    py::object out = launch(key, a, weight, bias, device, stream);
    if (out.is_none() || x.dim() == 2) {
      return out;
    }
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = weight.size(0);
    return py::cast(out.cast<at::Tensor>().view(shape));
  }

  size_t size() const { return entries_.size(); }

 private:
  py::object launch(Key const& key, at::Tensor const& a, at::Tensor const& b, c10::optional<at::Tensor> const& bias,
                    int64_t device, int64_t stream) const {
    auto found = entries_.find(key);
    if (found == entries_.end()) {
      return py::none();
    }
    Entry const& e = found->second;
    uintptr_t pa = reinterpret_cast<uintptr_t>(a.data_ptr());
    uintptr_t pb = reinterpret_cast<uintptr_t>(b.data_ptr());
    uintptr_t pbias = bias.has_value() ? reinterpret_cast<uintptr_t>(bias->data_ptr()) : 0;
    if (((pa | pb | pbias) & 15) != 0 || device != e.device) {
      return py::none();
    }
    at::Tensor out = at::empty({e.rows, e.cols}, a.options().dtype(e.dtype));
    l2c_call_plan const* p = e.plan;
    int status = p->run(a.data_ptr(), b.data_ptr(), nullptr, bias.has_value() ? bias->data_ptr() : nullptr,
                        out.data_ptr(), p->m, p->n, p->k, p->batch, p->lda, p->batch_stride_a, p->ldb,
                        p->batch_stride_b, p->ldc, p->batch_stride_c, p->ldd, p->batch_stride_d, p->workspace,
                        p->workspace_bytes, reinterpret_cast<void*>(stream));
    if (status != 0) {
      return py::none();   // the Python path calls again and reports the library's own message
    }
    return py::cast(e.transposed ? out.t() : out);
  }

  std::unordered_map<Key, Entry, KeyHash> entries_;
};

}  // namespace

PYBIND11_MODULE(L2C_MODULE_NAME, m) {
  py::class_<ServedCalls>(m, "ServedCalls")
      .def(py::init<>())
      .def("add", &ServedCalls::add)
      .def("matmul", &ServedCalls::matmul)
      .def("linear", &ServedCalls::linear)
      .def("size", &ServedCalls::size);
}
"""

_lock = threading.Lock()
_done = threading.Event()   # set once the build finished, loaded or not
_module = None              # the loaded extension
_failure: Optional[str] = None
_started = False


def enabled() -> bool:
    return (settings.value("L2C_NATIVE_CALL") or "1") != "0"


def find_cxx_compiler() -> Optional[str]:
    """$CXX, else c++, else g++; None when there is none."""
    return shim.find_host_compiler("CXX", "c++", "g++")


def _compile(compiler: str, folder: Path, name: str) -> Path:
    import torch
    from torch.utils import cpp_extension
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    library = folder / f"{name}{suffix}"
    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    libs = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    with tempfile.TemporaryDirectory(dir=folder, prefix=f".{name}.") as work:
        cpp, so = Path(work) / "served_calls.cpp", Path(work) / f"served{suffix}"
        cpp.write_text(SOURCE)
        errors = ""
        for std in ("-std=c++20", "-std=c++17"):   # what this torch's headers ask for, else the older standard
            done = subprocess.run(
                [compiler, "-O2", "-shared", "-fPIC", std, "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                 f"-DL2C_MODULE_NAME={name}", *includes, str(cpp), "-o", str(so),
                 *[f"-L{p}" for p in libs], *[f"-Wl,-rpath,{p}" for p in libs],
                 "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"],
                capture_output=True, text=True)
            if done.returncode == 0:
                os.replace(so, library)
                return library
            errors = (done.stdout + done.stderr).strip()
        raise OSError(f"{compiler} failed: {errors[-800:]}")


def _load() -> None:
    """Build (or find in the cache) and import the extension; records why not on failure."""
    global _module, _failure
    try:
        import torch
        compiler = find_cxx_compiler()
        if compiler is None:
            raise OSError("no C++ compiler ($CXX, c++ or g++)")
        digest = cache.content_hash(SOURCE, compiler, torch.__version__, sys.version)[:20]
        name = f"l2c_served_calls_{digest}"
        library = cache.cache_dir("native") / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
        with cache.locked(library):
            if not library.exists():
                _compile(compiler, library.parent, name)
        spec = importlib.util.spec_from_file_location(name, library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _module = module
    except (OSError, ImportError) as err:
        _failure = str(err)
        warnings.warn(f"l2c: served CUTLASS calls keep the Python path (the C++ served-call table did not build: "
                      f"{_failure[:300]})")
    finally:
        _done.set()


def _claim() -> bool:
    """True for the one caller that is to build."""
    global _started
    with _lock:
        if _started or not enabled():
            return False
        _started = True
        return True


def start_build() -> None:
    """Build the extension on a background thread (once per process); no caller waits for it."""
    if _claim():
        threading.Thread(target=_load, name="l2c-native-call", daemon=True).start()


def build_now(timeout: Optional[float] = None) -> bool:
    """Build and load the extension on this thread, or wait for the build under way (`l2c warmup`, tests); True
    when it is loaded."""
    if _claim():
        _load()
    elif enabled():
        _done.wait(timeout)
    return _module is not None


def new_table():
    """A fresh `ServedCalls` table, or None while the extension is not loaded (or cannot be)."""
    return _module.ServedCalls() if _module is not None else None


def failure() -> Optional[str]:
    """Why the extension did not build, or None."""
    return _failure
