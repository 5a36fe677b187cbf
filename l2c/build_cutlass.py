"""The CUTLASS target's builder: render the .cu file, compile it with nvcc into a cached .so, load it with ctypes.

Compiling needs only a CPU and nvcc (CI builds kernels without a GPU); calling a loaded kernel needs the GPU.
Builds are keyed by a content hash of (source, flags, nvcc version, CUTLASS version) in the user cache
directory, guarded by a file lock and published by atomic rename, so concurrent builders of the same kernel
compile it once and nobody loads a half-written .so. On a cache miss the prebuilt pack shipped with l2c
(`l2c.pack`) is asked first: a library built there from the same source, flags and CUTLASS version, by the local
nvcc's version (or by any nvcc when there is none here), is checked against its sha256 and installed into the
cache instead of compiling, so a machine without the CUDA toolkit still gets every kernel the pack holds.
A compiler failure, or any ptxas C751x warning (the wgmma pipeline got serialized), is a `BuildError` carrying
the compiler's message.

The loaded kernel follows docs/CONTRACTS.md: `kernel(a, b, c=None, bias=None, out=None)`. It checks layouts,
alignment and shapes up front and raises ValueError (so the dispatcher can fall back to torch), queries the
workspace size once per problem size into one buffer per device grown to the largest size seen, and launches on
torch's current stream.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from . import cache, cutlass_shim, pack
from .build import Kernel, call_signature, cuda_accessors
from .errors import BuildError
from .knobs import ANY, DTYPE_BYTES
from .lower import render
from .validate import ValidSpec

log = logging.getLogger("l2c.build_cutlass")

ARCH = "sm_90"   # what NVCC_FLAGS compile for; names the pack that is asked before compiling
NVCC_FLAGS: Tuple[str, ...] = (
    "-O3", "-DNDEBUG", "-std=c++17", "--expt-relaxed-constexpr",
    "-gencode=arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC",
)
# ptxas C7510-C7519: performance warnings such as "wgmma.mma_async instructions are serialized". A kernel
# built with one runs, but up to 40% slower than it should: for a tuner that is a broken candidate.
FORBIDDEN_PTXAS_WARNING = re.compile(r"\bC751\d\b")
# Compiler output kept in a BuildError; CUTLASS template errors run to megabytes.
MAX_MESSAGE_CHARS = 20_000

# Status codes of the generated entry points (templates/cutlass/gemm.cu.j2).
_STATUS = {1: "bad shape", 2: "cannot implement", 3: "workspace too small", 4: "initialize failed",
           5: "launch failed", 6: "CUDA error"}
_ARGUMENT_ERRORS = (1, 2)   # raised as ValueError: the call, not the kernel, is at fault


# ---- toolchain ------------------------------------------------------------------------------------------

def cutlass_include_dirs() -> List[Path]:
    """CUTLASS and CUTLASS-util headers shipped inside the pinned `nvidia-cutlass` wheel (cutlass_library)."""
    try:
        import cutlass_library
    except ImportError as err:
        raise BuildError("the CUTLASS headers come from the `nvidia-cutlass` wheel: "
                         "pip install nvidia-cutlass==4.2.0.0") from err
    source = Path(cutlass_library.__file__).resolve().parent / "source"
    dirs = [source / "include", source / "tools" / "util" / "include"]
    if not (dirs[0] / "cutlass" / "cutlass.h").is_file():
        raise BuildError(f"the installed cutlass_library has no headers under {dirs[0]}; reinstall nvidia-cutlass")
    return dirs


def find_nvcc() -> str:
    """$L2C_NVCC if set (then the only one looked for), else nvcc from PATH, else from $CUDA_HOME/bin or
    /usr/local/cuda/bin."""
    chosen = os.environ.get("L2C_NVCC")
    if chosen:
        if os.path.isfile(chosen) and os.access(chosen, os.X_OK):
            return chosen
        raise BuildError(f"nvcc not found: L2C_NVCC={chosen} is not an executable file")
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(Path(root) / "bin" / "nvcc", os.X_OK):
            return str(Path(root) / "bin" / "nvcc")
    raise BuildError("nvcc not found: the CUTLASS target compiles with the CUDA toolkit's nvcc (12.3 or newer, "
                     "for sm_90a). Install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads) or "
                     "put its bin/ folder on PATH.")


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    done = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"{nvcc} --version failed: {done.stderr.strip()}")
    return done.stdout.strip()


def cuda_release(version: str) -> str:
    """The CUDA release ("13.0") that `nvcc --version` output names, or "unknown"."""
    found = re.search(r"release (\d+\.\d+)", version)
    return found.group(1) if found else "unknown"


def cutlass_version() -> str:
    try:
        return metadata.version("nvidia-cutlass")
    except metadata.PackageNotFoundError:
        return "unknown"


def nvcc_command(nvcc: str, source: Path, output: Path) -> List[str]:
    includes = [f"-I{d}" for d in cutlass_include_dirs()]
    return [nvcc, *NVCC_FLAGS, *includes, str(source), "-o", str(output)]


# ---- compile (CPU only) ---------------------------------------------------------------------------------

def _clip(text: str) -> str:
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return text[:MAX_MESSAGE_CHARS] + f"\n... ({len(text) - MAX_MESSAGE_CHARS} more characters of compiler output)"


def forbidden_ptxas_warnings(output: str) -> List[str]:
    """The lines of compiler output that carry a C751x ptxas performance warning."""
    return [line for line in output.splitlines() if FORBIDDEN_PTXAS_WARNING.search(line)]


def pack_key(source: str) -> str:
    """The key of a library in the prebuilt pack: a hash of what determines it apart from the compiler's build
    (source, flags, CUTLASS version), so that a machine without nvcc can compute it."""
    return cache.content_hash(source, " ".join(NVCC_FLAGS), cutlass_version())


def _library_digest(source: str, compiler: str) -> str:
    """The build cache's key of a library: the pack key's parts and the version of the nvcc that built it."""
    return cache.content_hash(source, " ".join(NVCC_FLAGS), compiler, cutlass_version())[:24]


def compile_source(source: str, name: str) -> Path:
    """Compile CUDA source into a cached shared library and return its path; BuildError on failure.

    A cache miss installs the library from the prebuilt pack when the pack holds it for this source and the
    local nvcc's version (whichever version it was built with when there is no nvcc here); nvcc runs only for a
    real build. Failures that the compiler reports (errors, C751x warnings) are cached beside the .so, so a
    broken candidate costs its compile time once, not once per tuning run.
    """
    try:
        nvcc, no_nvcc = find_nvcc(), ""
    except BuildError as err:
        nvcc, no_nvcc = None, str(err)
    key = pack_key(source)
    prebuilt = None
    if nvcc is None:   # the pack entry's nvcc names the cache file that nvcc would have built
        prebuilt = pack.lookup(ARCH, key, name)
        if prebuilt is None:
            raise BuildError(f"{no_nvcc} ({name} is not in l2c's prebuilt pack)")
        compiler = prebuilt.nvcc_version
    else:
        compiler = nvcc_version(nvcc)
    digest = _library_digest(source, compiler)
    folder = cache.cache_dir("cutlass")
    library = folder / f"{name}_{digest}.so"
    failure = folder / f"{name}_{digest}.failed.txt"
    with cache.locked(library):
        if library.exists():
            return library
        if nvcc is not None:   # asked only on a miss: reading the pack costs a decompression
            prebuilt = pack.lookup(ARCH, key, name)
        if prebuilt is not None and prebuilt.nvcc_version == compiler:
            try:
                cache.write_atomic(library, pack.read_library(prebuilt))
                return library
            except pack.PackError as err:
                if nvcc is None:
                    raise BuildError(f"{name}: the prebuilt pack's library cannot be used ({err}) and {no_nvcc}")
                log.warning("%s; building %s with nvcc instead", err, name)
        if failure.exists():
            raise BuildError(failure.read_text())
        with tempfile.TemporaryDirectory(dir=folder, prefix=f".{name}_{digest}.") as work:
            work = Path(work)
            cu, so = work / f"{name}.cu", work / f"{name}.so"
            cu.write_text(source)
            command = nvcc_command(nvcc, cu, so)
            done = subprocess.run(command, capture_output=True, text=True, cwd=work)
            output = (done.stdout + done.stderr).strip()
            if done.returncode != 0:
                message = _clip(f"nvcc failed (exit {done.returncode}) building {name}:\n"
                                f"{' '.join(command)}\n{output}")
                if done.returncode > 0:   # the compiler's verdict, not a signal (e.g. out of memory)
                    cache.write_atomic(failure, message)
                raise BuildError(message)
            bad = forbidden_ptxas_warnings(output)
            if bad:
                message = _clip(f"ptxas reported a C751x performance warning building {name} (treated as a "
                                f"failure: the wgmma pipeline would be serialized):\n" + "\n".join(bad))
                cache.write_atomic(failure, message)
                raise BuildError(message)
            os.replace(so, library)   # same filesystem: an atomic publish
    return library


def compile_cutlass(valid: ValidSpec) -> Path:
    """Render and compile one validated spec; return the .so path. Needs nvcc, not a GPU."""
    if valid.target != "cutlass":
        raise BuildError(f"{valid.name} was validated for {valid.target}, not cutlass")
    return compile_source(render(valid), valid.name)


# ---- load and call (GPU) --------------------------------------------------------------------------------

_I64 = ctypes.c_int64
_RUN_ARGTYPES = (
    [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4 + [_I64] * 8
    + [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
)


class CutlassKernel(Kernel):
    """A compiled CUTLASS sm90 GEMM loaded from its .so; call it like every l2c kernel (docs/CONTRACTS.md)."""

    target = "cutlass"

    def __init__(self, valid: ValidSpec, source: str, library_path: Union[str, Path]):
        super().__init__(valid, source)
        self.path = Path(library_path)
        self.library = ctypes.CDLL(str(self.path))
        prefix = f"l2c_{valid.name}_"
        self._run = getattr(self.library, prefix + "run")
        self._run.argtypes = _RUN_ARGTYPES
        self._run.restype = ctypes.c_int
        self._workspace_size = getattr(self.library, prefix + "workspace_size")
        self._workspace_size.argtypes = [ctypes.c_int] * 4 + [ctypes.POINTER(ctypes.c_size_t)]
        self._workspace_size.restype = ctypes.c_int
        self._last_error = getattr(self.library, prefix + "last_error")
        self._last_error.restype = ctypes.c_char_p
        self._workspace_bytes: Dict[tuple, int] = {}   # (device, M, N, K, L) -> bytes that size needs
        self._workspaces: Dict[int, object] = {}       # device -> uint8 tensor shared by every size, grown as needed
        self._retired: List[object] = []               # outgrown workspaces: plans and captured graphs may use them
        spec = valid.spec
        self._needs_c = spec.epilogue_beta != 0.0
        self._bias = spec.epilogue_bias
        self._fixed = (spec.problem_m, spec.problem_n, spec.problem_k, spec.problem_batch)
        # Call plans: the fully checked, shape-derived part of a call, per call signature (see __call__).
        self._plans: Dict[tuple, _CallPlan] = {}
        self._run_planned = cutlass_shim.planned_call()   # None: planned calls use the 20-argument entry
        self._get_device, self._get_stream = cuda_accessors()

    @property
    def stages(self) -> int:
        """Main-loop stages CUTLASS instantiated (equals `valid.stages`, l2c's prediction)."""
        return int(self.library[f"l2c_{self.valid.name}_stages"]())

    @property
    def shared_memory_bytes(self) -> int:
        """Shared memory per block of the instantiated kernel (l2c's estimate is `valid.smem_bytes`)."""
        return int(self.library[f"l2c_{self.valid.name}_shared_memory_bytes"]())

    def swizzle(self, m: int, n: int) -> int:
        """The tile-launch swizzle a call of this M x N uses: the spec's group (at most 8), lowered for a persistent
        schedule until CUTLASS's scheduler runs no padded tile (templates/cutlass/gemm.cu.j2)."""
        if self.valid.schedule == "basic":   # one block per tile: nothing is padded
            return min(8, self.valid.spec.swizzle_group)
        return int(self.library[f"l2c_{self.valid.name}_swizzle"](int(m), int(n)))

    def _error(self, status: int) -> str:
        detail = (self._last_error() or b"").decode(errors="replace")
        return f"CUTLASS kernel {self.valid.name}: {_STATUS.get(status, 'status %d' % status)}: {detail}"

    def _workspace(self, device, m: int, n: int, k: int, batch: int):
        """The device's workspace, at least as large as this size needs. One buffer serves every size (launches
        on a stream run in order): parallel split-K needs slices x M x N fp32 partials, and a buffer per size
        would hold gigabytes after a sweep of shapes. It grows by at least doubling; an outgrown buffer is kept
        alive, since call plans and CUDA graphs captured earlier still point into it."""
        key = (device.index, m, n, k, batch)
        needed = self._workspace_bytes.get(key)
        if needed is None:
            size = ctypes.c_size_t(0)
            status = self._workspace_size(m, n, k, batch, ctypes.byref(size))
            if status != 0:
                raise (ValueError if status in _ARGUMENT_ERRORS else RuntimeError)(self._error(status))
            needed = self._workspace_bytes[key] = max(size.value, 1)
        workspace = self._workspaces.get(device.index)
        if workspace is None or workspace.numel() < needed:
            import torch
            if workspace is not None:
                self._retired.append(workspace)
                needed = max(needed, 2 * workspace.numel())
            workspace = torch.empty(needed, dtype=torch.uint8, device=device)
            self._workspaces[device.index] = workspace
        return workspace

    def __call__(self, a, b, c=None, bias=None, out=None):
        """Launch on torch's current stream; checks everything on the first call of a signature.

        The eager fast path: a call that allocates its output (`out` and `c` None) and whose signature
        (shapes, strides, dtypes, devices of a, b and bias) was checked before reuses that call's plan, so
        only what can change between such calls is looked at again: the pointers' 16-byte alignment and
        the current device. Everything else goes through the full checks in `_checked_call`. The plan's fixed
        arguments sit in a C struct that a six-argument shim forwards (`cutlass_shim`): ctypes converts each
        argument in Python, and the 20-argument entry would cost ~3 µs more host time per call.
        """
        if out is None and c is None:
            return self.call_planned(call_signature(a, b, bias), a, b, bias)
        return self._checked_call(a, b, c, bias, out)[0]

    def call_planned(self, key, a, b, bias=None):
        """The allocating call with its call signature `key` already computed (see Kernel.call_planned)."""
        plan = self._plans.get(key) if key is not None else None
        if plan is not None:
            pa, pb = a.data_ptr(), b.data_ptr()
            pbias = bias.data_ptr() if bias is not None else None
            if not ((pa | pb | (pbias or 0)) & 15) and self._get_device() == plan.device:
                out = a.new_empty(plan.stored_shape, dtype=plan.dtype)
                if plan.transposed:
                    out = out.transpose(-1, -2)
                if plan.native_address:
                    status = self._run_planned(plan.native_address, pa, pb, pbias, out.data_ptr(),
                                               self._get_stream(plan.device))
                else:
                    status = self._run(pa, pb, None, pbias, out.data_ptr(), *plan.arguments,
                                       self._get_stream(plan.device))
                if status != 0:
                    raise (ValueError if status in _ARGUMENT_ERRORS else RuntimeError)(self._error(status))
                return out
        result, plan = self._checked_call(a, b, None, bias, None)
        if key is not None and plan is not None:
            self._plans[key] = plan
        return result

    def _checked_call(self, a, b, c, bias, out):
        """Check everything, launch; returns (out, the plan that replays this call, or None)."""
        import torch
        allocated = out is None
        spec = self.valid.spec
        in_dtype, out_dtype = _torch_dtype(spec.types_a), _torch_dtype(spec.types_c)
        _check_tensor("a", a, in_dtype)
        _check_tensor("b", b, in_dtype)
        if a.dim() != b.dim():
            raise ValueError(f"a is {a.dim()}-D but b is {b.dim()}-D; both are (M, K)/(K, N) or both batched")
        m, k = a.shape[-2:]
        k_b, n = b.shape[-2:]
        if k != k_b:
            raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: inner dimensions differ")
        batch = a.shape[0] if a.dim() == 3 else 1
        if a.dim() == 3 and b.shape[0] != batch:
            raise ValueError(f"batch of a is {batch} but of b is {b.shape[0]}")
        for name, value, fixed in zip(("M", "N", "K", "batch"), (m, n, k, batch), self._fixed):
            if fixed != ANY and value != fixed:
                raise ValueError(f"{self.valid.name} is built for problem {name}={fixed}, got {value}")
        out_shape = (*a.shape[:-2], m, n)
        if out is None:
            stored = (*out_shape[:-2], n, m) if spec.layout_c == "col" else out_shape
            out = torch.empty(stored, dtype=out_dtype, device=a.device)
            if spec.layout_c == "col":
                out = out.transpose(-1, -2)
        else:
            _check_tensor("out", out, out_dtype, out_shape)
        if self._needs_c:
            if c is None:
                raise ValueError(f"epilogue beta={spec.epilogue_beta} needs the C input `c`")
            _check_tensor("c", c, out_dtype, out_shape)
        elif c is not None:
            raise ValueError("this kernel has beta=0 and reads no C input; `c` must be None")
        if self._bias != "none":
            length = m if self._bias == "row" else n
            if bias is None:
                raise ValueError(f"epilogue bias={self._bias} needs `bias` of shape ({length},)")
            _check_tensor("bias", bias, out_dtype, (length,))
            if bias.stride(0) != 1 or bias.data_ptr() % 16:
                raise ValueError("bias must be contiguous and 16-byte aligned")
        elif bias is not None:
            raise ValueError("this kernel has no bias epilogue; `bias` must be None")
        if m == 0 or n == 0:
            return out, None
        if k == 0:
            raise ValueError("K = 0: nothing to multiply (the CUTLASS kernel needs K >= 1)")

        lda, bsa = _leading_dims("a", a, spec.layout_a)
        ldb, bsb = _leading_dims("b", b, spec.layout_b)
        ldd, bsd = _leading_dims("out", out, spec.layout_c)
        ldc, bsc = _leading_dims("c", c, spec.layout_c) if c is not None else (ldd, bsd)
        device = a.device
        if device.index != torch.cuda.current_device():
            with torch.cuda.device(device):
                return self._launch(a, b, c, bias, out, m, n, k, batch, lda, bsa, ldb, bsb, ldc, bsc, ldd, bsd), None
        result = self._launch(a, b, c, bias, out, m, n, k, batch, lda, bsa, ldb, bsb, ldc, bsc, ldd, bsd)
        plan = None
        if allocated and c is None:
            workspace = self._workspace(device, m, n, k, batch)
            arguments = (m, n, k, batch, lda, bsa, ldb, bsb, ldc, bsc, ldd, bsd, workspace.data_ptr(),
                         workspace.numel())
            native = cutlass_shim.make_plan(self._run, arguments) if self._run_planned is not None else None
            plan = _CallPlan(
                device=device.index, dtype=out.dtype, transposed=spec.layout_c == "col",
                stored_shape=tuple(out.mT.shape) if spec.layout_c == "col" else tuple(out.shape),
                arguments=arguments, native=native,
                native_address=ctypes.addressof(native) if native is not None else 0)
        return result, plan

    def _launch(self, a, b, c, bias, out, m, n, k, batch, lda, bsa, ldb, bsb, ldc, bsc, ldd, bsd):
        workspace = self._workspace(a.device, m, n, k, batch)
        status = self._run(
            a.data_ptr(), b.data_ptr(), c.data_ptr() if c is not None else None,
            bias.data_ptr() if bias is not None else None, out.data_ptr(),
            m, n, k, batch, lda, bsa, ldb, bsb, ldc, bsc, ldd, bsd,
            workspace.data_ptr(), workspace.numel(), self._get_stream(a.device.index))
        if status != 0:
            raise (ValueError if status in _ARGUMENT_ERRORS else RuntimeError)(self._error(status))
        return out


@dataclass(frozen=True)
class _CallPlan:
    """What a checked call derived from its signature alone, replayed by later calls of that signature."""
    device: int
    dtype: object                  # torch dtype of the output
    stored_shape: Tuple[int, ...]  # the output as allocated (transposed back when layout c=col)
    transposed: bool
    arguments: Tuple[int, ...]     # M, N, K, L, the leading dims and batch strides, workspace pointer and bytes
    native: object = None          # the same arguments in the shim's C struct (cutlass_shim), kept alive here
    native_address: int = 0        # its address, passed to the shim per call; 0: use the 20-argument entry


def _torch_dtype(name: str):
    import torch
    return {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[name]


def _check_tensor(name: str, t, dtype, shape: Optional[Sequence[int]] = None) -> None:
    import torch
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"`{name}` must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"`{name}` is on {t.device}; CUTLASS kernels run on CUDA tensors")
    if t.dtype != dtype:
        raise ValueError(f"`{name}` is {t.dtype}, the spec needs {dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"`{name}` has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if shape is None and t.dim() not in (2, 3):
        raise ValueError(f"`{name}` must be 2-D or batched 3-D, got shape {tuple(t.shape)}")


def _leading_dims(name: str, t, layout: str) -> Tuple[int, int]:
    """(leading dimension, batch stride) in elements of a row- or column-major (batched) matrix, after checking
    the layout and TMA's 16-byte alignment of the pointer, the contiguous extent and every stride."""
    rows, cols = t.shape[-2:]
    if layout == "row":
        contiguous, extent, outer, ld = t.stride(-1), cols, rows, t.stride(-2)
    else:
        contiguous, extent, outer, ld = t.stride(-2), rows, cols, t.stride(-1)
    if contiguous != 1 and extent > 1:
        raise ValueError(f"`{name}` must be {layout}-major (stride {'(-1)' if layout == 'row' else '(-2)'} == 1), "
                         f"got strides {tuple(t.stride())}")
    if outer == 1:
        ld = extent   # a single row/column: its stride is arbitrary, pass the packed one
    nbytes = t.element_size()
    batch_stride = t.stride(0) if t.dim() == 3 and t.shape[0] > 1 else ld * outer
    if t.data_ptr() % 16:
        raise ValueError(f"`{name}` data pointer is not 16-byte aligned (TMA)")
    if (extent * nbytes) % 16 or (ld * nbytes) % 16 or (batch_stride * nbytes) % 16:
        raise ValueError(f"`{name}` ({layout}-major, shape {tuple(t.shape)}, strides {tuple(t.stride())}): the "
                         f"contiguous extent, leading dimension and batch stride must be multiples of 16 bytes")
    if ld < extent:
        raise ValueError(f"`{name}` has leading dimension {ld} < its contiguous extent {extent}")
    return ld, batch_stride


# ---- build --------------------------------------------------------------------------------------------

def load_cutlass(valid: ValidSpec, library_path: Union[str, Path], source: Optional[str] = None) -> CutlassKernel:
    """Wrap a compiled .so as a CutlassKernel (ctypes load; calling it needs a GPU)."""
    try:
        return CutlassKernel(valid, source if source is not None else render(valid), library_path)
    except (OSError, AttributeError) as err:
        raise BuildError(f"loading {library_path} for {valid.name} failed: {err}") from err


def build_cutlass(valid: ValidSpec) -> CutlassKernel:
    """Compile (cached) and load one spec; raise BuildError on any failure."""
    if valid.target != "cutlass":
        raise BuildError(f"{valid.name} was validated for {valid.target}, not cutlass")
    source = render(valid)
    return load_cutlass(valid, compile_source(source, valid.name), source)


def _compile_in_worker(source: str, name: str) -> Union[str, BuildError]:
    try:
        return str(compile_source(source, name))
    except BuildError as err:
        return err
    except Exception as err:  # noqa: BLE001 - a worker never raises: its failure is the candidate's
        return BuildError(f"building {name} failed: {type(err).__name__}: {err}")


def build_many(valids: Sequence[ValidSpec], workers: Optional[int] = None) -> List[Union[CutlassKernel, BuildError]]:
    """Compile many specs in parallel and load them; one result per spec, in order, never raising.

    The parallel work is the nvcc processes: a pool of `workers` threads each drives one nvcc at a time.
    Threads rather than Python worker processes because the workers only wait on nvcc, and so that
    build_many works from any script (spawned workers re-import `__main__`, which breaks scripts without an
    `if __name__ == "__main__"` guard) and from a parent that has initialized CUDA (no fork). Concurrent
    builds of one kernel, here or in other processes, are serialized by the cache's file lock.
    """
    workers = max(1, workers or os.cpu_count() or 1)
    results: List[Union[CutlassKernel, BuildError, None]] = [None] * len(valids)
    jobs = []
    for i, valid in enumerate(valids):
        try:
            if valid.target != "cutlass":
                raise BuildError(f"{valid.name} was validated for {valid.target}, not cutlass")
            jobs.append((i, render(valid)))
        except Exception as err:  # noqa: BLE001
            results[i] = err if isinstance(err, BuildError) else BuildError(f"rendering {valid.name}: {err}")
    if jobs:
        with ThreadPoolExecutor(max_workers=min(workers, len(jobs)), thread_name_prefix="l2c-nvcc") as pool:
            futures = [(i, source, pool.submit(_compile_in_worker, source, valids[i].name)) for i, source in jobs]
            for i, source, future in futures:
                outcome = future.result()   # _compile_in_worker never raises
                if isinstance(outcome, BuildError):
                    results[i] = outcome
                else:
                    try:
                        results[i] = load_cutlass(valids[i], outcome, source)
                    except BuildError as err:
                        results[i] = err
    return results  # type: ignore[return-value]
