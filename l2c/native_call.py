"""The dispatcher's eager call in one C++ function: the first test, torch's fallback and the served CUTLASS plans,
without Python in between.

Measured on the H200's host, a call `l2c.matmul` sends to torch cost 1.7-2.6 us more than torch.matmul itself
(the Python of the first test: a few dict lookups, `b.shape`, b's layout, the fallback counter), and a
served call's Python around its plan (the signature, the current device and stream, ctypes) 6-10 us; in the `call`
protocol every microsecond is a few percent of a small GEMM's figure.

`CallTable` (one per dispatcher) holds two maps:
- the first test: per (dtype of A, form, B's extents) the Ms an entry serves there, as closed spans. Forms are
  `a @ b` with b row-major or not (`l2c.matmul`, keyed by b's (K, N)) and nn.Linear's `x @ weight^T` (keyed by the
  weight's (N, K)). An unknown key is asked of a Python resolver once (the dispatcher's `served_kn` / `served_nk`,
  which work the dispatch rule out), then remembered; an M outside the spans runs torch (`at::matmul`,
  `at::linear`) right there, as torch.matmul and F.linear would;
- the served plans: the CUTLASS call plans that already served a plain eager call
  (l2c.targets.cutlass.kernel, `launcher`), keyed like `l2c.kernel.call_signature` (shapes, strides, dtypes and
  devices of A, B and the bias) plus the asked activation, each holding the plan's C struct (shim.py, a reference
  to its Python object too) and the output's shape and dtype; launched on the current device and stream through
  the shim's `l2c_run_planned` (which decides a captured launch's overlap), with a workspace of the call's own
  where the kernel writes one (a plan with no workspace pointer).

`call(a, b, bias, activation)` and `call_linear(x, weight, bias, activation)` return the output, or None where the
Python path must decide: an operand that is not a plain tensor (a subclass with `__torch_function__`, or a torch
function mode active), a first-test key the resolver did not answer, an M an entry serves whose plan is not in the
table (being prepared, or a Triton kernel), autograd recording a served call, a pointer that is not 16-byte aligned,
another current device than the plan's, or a launch that returns an error.

The extension is C++ source compiled once per machine with the host C++ compiler against the running torch (its
headers and libraries) into the build cache, keyed by its text, the compiler and torch's version. It is built off
the calling thread (`start_build`); until it is loaded, and wherever it cannot be built, calls take the Python path.
`L2C_NATIVE_CALL=0` keeps them there.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
import weakref
from pathlib import Path
from typing import List, Optional

from . import background, cache, epilogue, settings
from .targets.cutlass import shim

# the activation argument of a plain call, as a served plan's key holds it (None: no activation): an index into
# the one list of activations
ACTIVATIONS = {None: 0, **{name: code for code, name in enumerate(epilogue.ACTIVATIONS)}}


def activation_code(activation) -> int:
    """The table's code of an activation argument; -1 for one it does not know (the Python path then raises)."""
    try:
        return ACTIVATIONS.get(activation, -1)
    except TypeError:   # unhashable
        return -1


SOURCE = r"""
#include <torch/extension.h>
#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

extern "C" {
""" + shim.PLAN_STRUCT + r"""
}

namespace {

template <size_t Words>
struct WordsHash {
  size_t operator()(std::array<int64_t, Words> const& key) const {
    uint64_t h = 1469598103934665603ull;   // FNV-1a over the words
    for (int64_t v : key) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

// A served plan's key: A's 6 words, B's 6, the bias's 6, the activation.
constexpr size_t kKeyLength = 19;
using Key = std::array<int64_t, kKeyLength>;

// The first test's key: A's dtype, the form of the call, B's two extents as the Python maps key them.
using ShapeKey = std::array<int64_t, 4>;
constexpr int64_t kMatmulRowMajorB = 0;   // a @ b, b row-major (contiguous or a column slice): keyed by b's (K, N)
constexpr int64_t kMatmulOtherB = 1;      // a @ b, any other b
constexpr int64_t kLinear = 2;            // x @ weight^T: keyed by the weight's (N, K)
constexpr size_t kMaxShapes = 65536;      // (N, K) remembered at most; past it, the Python path decides
using Spans = std::vector<std::pair<int64_t, int64_t>>;   // closed ranges of M

bool holds(Spans const& spans, int64_t m) {
  for (auto const& span : spans) {
    if (span.first <= m && m <= span.second) {
      return true;
    }
  }
  return false;
}

// torch.Tensor or nn.Parameter: no subclass whose __torch_function__ torch.matmul would have to honour.
bool plain_tensor(py::handle h) { return THPVariable_CheckExact(h.ptr()); }

at::Tensor const& unpack(py::handle h) { return THPVariable_Unpack(h.ptr()); }

c10::optional<at::Tensor> optional_tensor(py::handle h) {
  return h.is_none() ? c10::optional<at::Tensor>() : c10::optional<at::Tensor>(unpack(h));
}

// No mode is watching torch's ops on this thread: a Python dispatch mode (FakeTensorMode, FlopCounterMode), a
// torch.func transform (grad, vmap, functionalize) or torch.jit.trace adds its dispatch key to the thread's included
// set. Their calls are torch's: a launch would be invisible to them, their tensors (and so an output allocated
// here) may have no memory to launch on, and a trace's sizes are not the first test's to keep.
bool no_mode_watching() {
  return (c10::impl::tls_local_dispatch_key_set().included_ - c10::default_included_set).empty();
}

// Operands torch.matmul would run as they are: plain tensors (the bias may be None), no torch function mode and no
// mode watching the dispatcher.
bool plain_operands(py::handle a, py::handle b, py::handle bias) {
  return plain_tensor(a) && plain_tensor(b) && (bias.is_none() || plain_tensor(bias)) &&
         !at::impl::torch_function_mode_enabled() && no_mode_watching();
}

py::object wrap(at::Tensor t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t))); }

// torch's op for a call the table does not serve. Torch's bindings release the GIL around every op; here only CPU
// ops do, which run to completion on this thread: a CUDA op only enqueues work, and releasing and taking back the
// GIL would cost a few tenths of a microsecond per call.
template <typename Op>
at::Tensor unlocked_if_cpu(at::Tensor const& a, Op op) {
  if (a.is_cuda()) {
    return op();
  }
  py::gil_scoped_release unlocked;
  return op();
}

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

bool forward_grad(at::Tensor const& t) { return t._fw_grad(/*level=*/0).defined(); }
// Whether torch's op would record anything for autograd: backward (requires_grad) or forward (a dual tensor).
bool records_grad(at::Tensor const& a, at::Tensor const& b, c10::optional<at::Tensor> const& bias) {
  if (at::GradMode::is_enabled() &&
      (a.requires_grad() || b.requires_grad() || (bias.has_value() && bias->requires_grad()))) {
    return true;
  }
  return forward_grad(a) || forward_grad(b) || (bias.has_value() && forward_grad(*bias));
}

// Whether a tensor has memory of its own to launch on: not a functorch wrapper (vmap's batched tensors,
// torch.func's gradient-tracking ones) nor a functionalization wrapper, which only torch's ops can run.
bool own_memory(at::Tensor const& t) {
  return t.has_storage() && !t.key_set().has(c10::DispatchKey::Functionalize);
}

bool own_memory(at::Tensor const& a, at::Tensor const& b, c10::optional<at::Tensor> const& bias) {
  return own_memory(a) && own_memory(b) && (!bias.has_value() || own_memory(*bias));
}

// Whether torch.autocast would run this call in another dtype than its operands' (the region's dtype for a's device
// differs from a's, b's or the bias's): torch serves it, so that the result has torch's dtype.
bool autocast_recasts(at::Tensor const& a, at::Tensor const& b, c10::optional<at::Tensor> const& bias) {
  c10::DeviceType const type = a.device().type();
  if (!at::autocast::is_autocast_enabled(type)) {
    return false;
  }
  at::ScalarType const dtype = at::autocast::get_autocast_dtype(type);
  return a.scalar_type() != dtype || b.scalar_type() != dtype || (bias.has_value() && bias->scalar_type() != dtype);
}

// The device a launch for `a` runs on and its current stream (the raw cudaStream_t), read through c10's device
// guard, as torch's own launches do; a CPU call runs on "device -1" with no stream. False: no such device.
bool current_stream(at::Tensor const& a, int64_t* device, int64_t* stream) {
  if (a.is_cpu()) {
    *device = -1;
    *stream = 0;
    return true;
  }
  if (!a.is_cuda()) {
    return false;
  }
  auto const* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  c10::Device current = guard->getDevice();
  *device = current.index();
  *stream = reinterpret_cast<int64_t>(guard->getStream(current).native_handle());
  return true;
}

struct Entry {
  l2c_call_plan const* plan;
  py::object owner;            // the Python object holding the plan's struct: kept alive by the table
  int64_t rows, cols;          // the output as allocated (transposed back when `transposed`)
  at::ScalarType dtype;
  bool transposed;
  int64_t device;
};

class CallTable {
 public:
  // resolve_matmul(a, b) and resolve_linear(x, weight): the spans of M an entry serves at this call's key, as a list
  // of (lo, hi), or None (the Python path decides this call and is asked again next time).
  // run_planned: the address of the call-plan shim's `l2c_run_planned`, which every served launch goes through.
  CallTable(py::object resolve_matmul, py::object resolve_linear, int64_t run_planned)
      : resolve_matmul_(std::move(resolve_matmul)), resolve_linear_(std::move(resolve_linear)),
        run_planned_(reinterpret_cast<RunPlanned>(run_planned)) {}

  void add(at::Tensor const& a, at::Tensor const& b, c10::optional<at::Tensor> const& bias, int64_t activation,
           py::object plan, int64_t plan_address, at::Tensor const& out_template, bool transposed, int64_t device) {
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && out_template.dim() == 2, "2-D operands only");
    TORCH_CHECK(run_planned_ != nullptr, "a table made without the call-plan shim serves no plan");
    Key key = make_key(a, b.size(0), b.size(1), b.stride(0), b.stride(1), b, bias, activation);
    entries_[key] = Entry{reinterpret_cast<l2c_call_plan const*>(plan_address), plan, out_template.size(0),
                          out_template.size(1), out_template.scalar_type(), transposed, device};
  }

  // Ask the resolvers again at each key's next call: what they answer has changed (an online decision).
  void forget_first_tests() {
    first_.clear();
    ++generation_;
  }

  size_t size() const { return entries_.size(); }
  size_t shapes() const { return first_.size(); }
  std::pair<int64_t, int64_t> counts() const { return {served_, fallbacks_}; }

  // l2c.matmul(a, b, bias, activation) with no out= and no residual.
  py::object call(py::handle ha, py::handle hb, py::handle hbias, int64_t activation) {
    if (!plain_operands(ha, hb, hbias)) {
      return py::none();
    }
    at::Tensor const& a = unpack(ha);
    at::Tensor const& b = unpack(hb);
    if (a.dim() != 2 || b.dim() != 2) {
      return py::none();
    }
    if (hbias.is_none() && activation == 0) {
      bool row_major_b = b.stride(1) == 1 && b.stride(0) >= std::max<int64_t>(1, b.size(1));   // b_map_index
      ShapeKey shape{static_cast<int64_t>(a.scalar_type()), row_major_b ? kMatmulRowMajorB : kMatmulOtherB,
                     b.size(0), b.size(1)};
      Spans const* spans = first_test(shape, resolve_matmul_, ha, hb);
      if (spans == nullptr) {
        return py::none();
      }
      if (!holds(*spans, a.size(0))) {
        ++fallbacks_;
        return wrap(unlocked_if_cpu(a, [&] { return at::matmul(a, b); }));
      }
    }
    c10::optional<at::Tensor> bias = optional_tensor(hbias);
    if (records_grad(a, b, bias) || autocast_recasts(a, b, bias) || !own_memory(a, b, bias)) {
      return py::none();
    }
    Key key = make_key(a, b.size(0), b.size(1), b.stride(0), b.stride(1), b, bias, activation);
    c10::optional<at::Tensor> out = launch(key, a, b, bias);
    return out.has_value() ? wrap(std::move(*out)) : py::none();
  }

  // l2c.nn.Linear's forward: activation(x @ weight^T + bias), any leading dimensions of x, no residual.
  py::object call_linear(py::handle hx, py::handle hweight, py::handle hbias, int64_t activation) {
    if (!plain_operands(hx, hweight, hbias)) {
      return py::none();
    }
    at::Tensor const& x = unpack(hx);
    at::Tensor const& weight = unpack(hweight);
    if (x.dim() < 1 || weight.dim() != 2 || weight.size(1) == 0 || x.size(-1) != weight.size(1)) {
      return py::none();   // F.linear's own error, from the Python path
    }
    c10::optional<at::Tensor> bias = optional_tensor(hbias);
    if (activation == 0) {
      ShapeKey shape{static_cast<int64_t>(x.scalar_type()), kLinear, weight.size(0), weight.size(1)};
      Spans const* spans = first_test(shape, resolve_linear_, hx, hweight);
      if (spans == nullptr) {
        return py::none();
      }
      if (!holds(*spans, x.numel() / weight.size(1))) {
        ++fallbacks_;
        return wrap(unlocked_if_cpu(x, [&] { return at::linear(x, weight, bias); }));
      }
    }
    if (x.dim() < 2 || !x.is_contiguous() || records_grad(x, weight, bias) || autocast_recasts(x, weight, bias) ||
        !own_memory(x, weight, bias)) {
      return py::none();
    }
    int64_t k = x.size(-1);
    at::Tensor a = x.dim() == 2 ? x : x.view({-1, k});
    Key key = make_key(a, weight.size(1), weight.size(0), weight.stride(1), weight.stride(0), weight, bias,
                       activation);
    c10::optional<at::Tensor> out = launch(key, a, weight, bias);
    if (!out.has_value()) {
      return py::none();
    }
    if (x.dim() == 2) {
      return wrap(std::move(*out));
    }
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = weight.size(0);
    return wrap(out->view(shape));
  }

 private:
  // The spans of M served at `shape`, asked of `resolve` the first time; nullptr where it gave none.
  Spans const* first_test(ShapeKey const& shape, py::object const& resolve, py::handle x, py::handle y) {
    auto found = first_.find(shape);
    if (found != first_.end()) {
      return &found->second;
    }
    if (first_.size() >= kMaxShapes) {
      return nullptr;
    }
    uint64_t const generation = generation_;
    py::object spans = resolve(x, y);   // Python: another thread may record a decision meanwhile
    if (spans.is_none() || generation != generation_) {
      return nullptr;   // an answer from before a decision is not kept: the Python path takes this call
    }
    return &first_.emplace(shape, spans.cast<Spans>()).first->second;
  }

  // The served plan's output, or none where the table has no plan for this call or the plan declines it.
  c10::optional<at::Tensor> launch(Key const& key, at::Tensor const& a, at::Tensor const& b, c10::optional<at::Tensor> const& bias) {
    auto found = entries_.find(key);
    if (found == entries_.end()) {
      return c10::nullopt;
    }
    Entry const& e = found->second;
    int64_t device = 0, stream = 0;
    if (!current_stream(a, &device, &stream) || device != e.device) {
      return c10::nullopt;
    }
    uintptr_t pa = reinterpret_cast<uintptr_t>(a.data_ptr());
    uintptr_t pb = reinterpret_cast<uintptr_t>(b.data_ptr());
    uintptr_t pbias = bias.has_value() ? reinterpret_cast<uintptr_t>(bias->data_ptr()) : 0;
    if (((pa | pb | pbias) & 15) != 0) {
      return c10::nullopt;
    }
    at::Tensor out = at::empty({e.rows, e.cols}, a.options().dtype(e.dtype));
    l2c_call_plan const* p = e.plan;
    // A plan without a workspace pointer launches a kernel that writes one: this call's own, from torch's caching
    // allocator on this stream (freed when the call returns; reused only in the stream's order).
    at::Tensor workspace;
    void* workspace_pointer = p->workspace;
    if (workspace_pointer == nullptr) {
      try {
        workspace = at::empty({static_cast<int64_t>(p->workspace_bytes)}, a.options().dtype(at::kByte));
      } catch (c10::OutOfMemoryError const&) {
        return c10::nullopt;   // the Python path decides (torch's op may need no workspace)
      }
      workspace_pointer = workspace.data_ptr();
    }
    int status = run_planned_(p, a.data_ptr(), b.data_ptr(), bias.has_value() ? bias->data_ptr() : nullptr,
                              out.data_ptr(), workspace_pointer, reinterpret_cast<void*>(stream));
    if (status != 0) {
      return c10::nullopt;   // the Python path calls again and reports the library's own message
    }
    ++served_;
    return e.transposed ? out.t() : out;
  }

  using RunPlanned = int (*)(l2c_call_plan const*, void const*, void const*, void const*, void*, void*, void*);
  py::object resolve_matmul_, resolve_linear_;
  RunPlanned run_planned_;
  std::unordered_map<ShapeKey, Spans, WordsHash<4>> first_;
  uint64_t generation_ = 0;   // forget_first_tests calls so far
  std::unordered_map<Key, Entry, WordsHash<kKeyLength>> entries_;
  int64_t served_ = 0, fallbacks_ = 0;
};

// `table.call(a, b, bias, activation)` and `table.call_linear(x, weight, bias, activation)` as CPython's own
// fast-call methods: pybind11's argument dispatch costs about 0.1 us more a call, and every call takes this way.
// As torch's bindings do, torch's warnings reach Python's `warnings` and its errors become the Python exceptions
// torch.matmul and F.linear raise.
template <py::object (CallTable::*Call)(py::handle, py::handle, py::handle, int64_t)>
PyObject* fast_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "takes 4 positional arguments: (a, b, bias, activation)");
    return nullptr;
  }
  int64_t const activation = PyLong_AsLongLong(args[3]);
  if (activation == -1 && PyErr_Occurred()) {
    return nullptr;
  }
  CallTable& table = py::cast<CallTable&>(py::handle(self));
  return (table.*Call)(args[0], args[1], args[2], activation).release().ptr();
  END_HANDLE_TH_ERRORS
}

PyMethodDef fast_calls[] = {
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&fast_call<&CallTable::call>)),
     METH_FASTCALL, nullptr},
    {"call_linear",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&fast_call<&CallTable::call_linear>)),
     METH_FASTCALL, nullptr},
};

}  // namespace

PYBIND11_MODULE(L2C_MODULE_NAME, m) {
  py::class_<CallTable> table(m, "CallTable");
  for (PyMethodDef& method : fast_calls) {
    PyObject* descriptor = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(table.ptr()), &method);
    if (descriptor == nullptr) {
      throw py::error_already_set();
    }
    table.attr(method.ml_name) = py::reinterpret_steal<py::object>(descriptor);
  }
  table.def(py::init<py::object, py::object, int64_t>())
      .def("add", &CallTable::add)
      .def("forget_first_tests", &CallTable::forget_first_tests)
      .def("size", &CallTable::size)
      .def("shapes", &CallTable::shapes)
      .def("counts", &CallTable::counts);
}
"""

_lock = threading.Lock()
_done = threading.Event()   # set once the build finished, loaded or not
_module = None              # the loaded extension
_failure: Optional[str] = None
_started = False
_waiting: List = []         # weak references to the callbacks of `when_loaded`


def enabled() -> bool:
    return (settings.value("L2C_NATIVE_CALL") or "1") != "0"


def find_cxx_compiler() -> Optional[str]:
    """$CXX, else c++, else g++; None when there is none."""
    return shim.find_host_compiler("CXX", "c++", "g++")


def _compile(compiler: str, folder: Path, name: str) -> Path:
    """g++ against the running torch's headers and libraries, found beside its package: importing
    torch.utils.cpp_extension for them would import setuptools on the loading thread, and on the H200's host that
    held the GIL (and set off a collection) for 70-130 ms of the caller's first calls."""
    import torch
    root = Path(torch.__file__).parent
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    library = folder / f"{name}{suffix}"
    includes = [f"-I{p}" for p in (root / "include", root / "include" / "torch" / "csrc" / "api" / "include",
                                   sysconfig.get_paths()["include"])]
    libs = [root / "lib"]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    with tempfile.TemporaryDirectory(dir=folder, prefix=f".{name}.") as work:
        cpp, so = Path(work) / "call_table.cpp", Path(work) / f"served{suffix}"
        cpp.write_text(SOURCE)
        errors = ""
        for std in ("-std=c++20", "-std=c++17"):   # what this torch's headers ask for, else the older standard
            # (run inside `_load`'s waiting_on_a_process: a program may end meanwhile; it does not wait for g++)
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
        name = f"l2c_call_table_{digest}"
        library = cache.cache_dir("native") / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
        # another process may be compiling it: the lock's wait, like the compile, is not one the exit waits for
        with background.waiting_on_a_process(), cache.locked(library):
            if not cache.intact_library(library):
                _compile(compiler, library.parent, name)
        # dlopen with the GIL released (an import holds it): the import then finds it loaded
        cache.load_library(library)
        spec = importlib.util.spec_from_file_location(name, library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _module = module
    except Exception as err:  # noqa: BLE001 - whatever stops the build, calls keep the Python path
        _failure = f"{type(err).__name__}: {err}"
        warnings.warn(f"l2c: calls keep the Python path (the C++ call table did not build: {_failure[:300]})")
    finally:
        with _lock:
            waiting, _waiting[:] = list(_waiting), []
        for ref in waiting:   # attached before `build_now` returns
            callback = ref()
            if callback is not None and _module is not None:
                callback()
        _done.set()


def _in_child() -> None:
    """In a child forked while the parent built the extension: the building thread stayed in the parent, so the
    child builds (or loads) it itself when a dispatcher asks; its lock is new."""
    global _lock, _started
    _lock = threading.Lock()
    if not _done.is_set():
        _started = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)


def _claim() -> bool:
    """True for the one caller that is to build."""
    global _started
    with _lock:
        if _started or not enabled():
            return False
        _started = True
        return True


def start_build() -> None:
    """Build the extension on a background thread (once per process); no caller waits for it, and a program that
    ends meanwhile waits for its load but not for its compile (l2c.background)."""
    if _claim():
        background.start(_load, "l2c-native-call")


def build_now(timeout: Optional[float] = None) -> bool:
    """Build and load the extension on this thread, or wait for the build under way (`l2c warmup`, tests); True
    when it is loaded."""
    if _claim():
        _load()
    elif enabled():
        _done.wait(timeout)
    return _module is not None


def when_loaded(callback) -> None:
    """Call the bound method `callback` once the extension is loaded: now if it is, else from the thread that loads
    it (never if it fails). Held by a weak reference: a dispatcher dropped meanwhile is not kept alive."""
    with _lock:
        if _module is None and not _done.is_set():
            _waiting[:] = [ref for ref in _waiting if ref() is not None]   # dispatchers dropped meanwhile
            _waiting.append(weakref.WeakMethod(callback))
            return
    if _module is not None:
        callback()


def new_table(resolve_matmul, resolve_linear):
    """A fresh `CallTable` whose first test asks `resolve_matmul(a, b)` and `resolve_linear(x, weight)` for the spans
    of M served at a key it has not met (see the module docstring), or None while the extension is not loaded (or
    cannot be)."""
    if _module is None:
        return None
    run_planned = shim.planned_call()   # None without a C compiler: then no kernel makes a plan to add
    return _module.CallTable(resolve_matmul, resolve_linear,
                             ctypes.cast(run_planned, ctypes.c_void_p).value if run_planned is not None else 0)


def failure() -> Optional[str]:
    """Why the extension did not build, or None."""
    return _failure
