"""A compiled CUTLASS sm90 GEMM loaded from its .so with ctypes, called per docs/CONTRACTS.md.

It checks layouts, alignment and shapes up front and raises ValueError (so the dispatcher can fall back to
torch), queries the workspace size once per problem size, replays call plans through the C shim (`shim.py`), and
launches on torch's current stream. A kernel that writes a workspace (split-K, stream-K, parallel split-K) gets one
per call from torch's caching allocator on the call's stream, as torch's own temporaries: launches on several
streams, or a captured graph replayed beside eager calls, never share one.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

from ... import cache, settings
from ...errors import BuildError, LaunchError, SignatureDeclined
from ...kernel import Kernel, call_signature, cuda_accessors, output_template
from ...knobs import ANY
from ...lower import render
from ...rules import ValidSpec, output_n_step
from . import shim

# Status codes of the generated entry points (templates/cutlass/gemm.cu.j2).
_STATUS = {1: "bad shape", 2: "cannot implement", 3: "workspace too small", 4: "initialize failed",
           5: "launch failed", 6: "CUDA error"}
INT_MAX = 2 ** 31 - 1        # M, N, K and batch are C ints in the entry points and the call plan
_ARGUMENT_ERRORS = (1, 2)   # raised as ValueError: the call, not the kernel, is at fault
UNUSED_WORKSPACE_BYTES = 16   # the buffer passed to a launch that writes no workspace (the entry wants a pointer)


_I64 = ctypes.c_int64
_RUN_ARGTYPES = (
    [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4 + [_I64] * 8
    + [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
)


def overlaps(valid: ValidSpec) -> bool:
    """Whether this kernel launches with programmatic dependent launch (L2C_OVERLAP; docs/CONTRACTS.md). By default
    only where it was measured faster (benchmarks/NOTES.md, sessions 22-23: the `serve` set with it on and off in
    one run): the tensor-core gemv kernels (1.12-1.42x on the weights they serve) and the GEMMs of the basic
    schedule, which let the next kernel start after their main loop (1.02x), but not with parallel split-K (its
    reduction is a second kernel: 0.98x). The persistent GEMMs trigger only when they exit (1.00x), and the
    CUDA-core gemv was mixed (1.05x in f16, 0.87x for one bf16 kernel on 7 shapes)."""
    choice = _overlap_choice()
    if choice in ("measured", "measured-any"):
        if valid.schedule == "gemv":
            return valid.spec.launch_cores == "tensor"
        return valid.schedule == "basic" and not valid.spec.parallel_split_k
    return choice == "all"


def overlaps_only_own_in_capture(valid: ValidSpec) -> bool:
    """Whether a CUDA-graph capture of this kernel's planned call overlaps only l2c's own previous launch (the
    shim's rule, shim.py): by default, for the kernels that overlap at all. With `measured-any` they overlap any
    node, as eager launches do (for measuring the rule)."""
    return _overlap_choice() == "measured" and overlaps(valid)


def _overlap_choice() -> str:
    try:
        return settings.overlap()
    except ValueError:   # the dispatcher reports a malformed setting (docs/CONTRACTS.md); kernels take the default
        return "measured"


class CutlassKernel(Kernel):
    """A compiled CUTLASS sm90 GEMM loaded from its .so; call it like every l2c kernel (docs/CONTRACTS.md)."""

    target = "cutlass"

    def __init__(self, valid: ValidSpec, source: str, library_path: Union[str, Path]):
        super().__init__(valid, source)
        self.path = Path(library_path)
        self.library = cache.load_library(self.path)
        prefix = f"l2c_{valid.name}_"
        self._run = getattr(self.library, prefix + "run")
        self._run.argtypes = _RUN_ARGTYPES
        self._run.restype = ctypes.c_int
        self._workspace_size = getattr(self.library, prefix + "workspace_size")
        self._workspace_size.argtypes = [ctypes.c_int] * 4 + [ctypes.POINTER(ctypes.c_size_t)]
        self._workspace_size.restype = ctypes.c_int
        self._last_error = getattr(self.library, prefix + "last_error")
        self._last_error.restype = ctypes.c_char_p
        self._set_overlap = self.library[f"l2c_{valid.name}_set_overlap"]
        self._set_overlap.argtypes = [ctypes.c_int]
        self._set_overlap.restype = ctypes.c_int
        self.set_overlap(overlaps(valid))
        self._workspace_bytes: Dict[tuple, int] = {}   # (device, M, N, K, L) -> bytes that size needs
        self._unused_workspaces: Dict[int, object] = {}   # device -> the buffer passed where none is needed
        spec = valid.spec
        self._needs_c = spec.epilogue_beta != 0.0
        self._bias = spec.epilogue_bias
        self._gated = spec.epilogue_gate != "none"   # a gated epilogue: B of K x 2N, D of M x N
        self._n_step = output_n_step(valid)   # the gated GEMM's N is a multiple of tile n (rule gated-gemm)
        self._fixed = (spec.problem_m, spec.problem_n, spec.problem_k, spec.problem_batch)
        # Call plans: the fully checked, shape-derived part of a call, per call signature (see __call__).
        self._plans: Dict[tuple, _CallPlan] = {}
        self._launches: Dict[tuple, object] = {}   # each plan's replay, bound at its first use (`launcher`)
        self._run_planned = shim.planned_call()   # None: planned calls use the 20-argument entry
        self._get_device, self._get_stream = cuda_accessors()
        import torch
        self._empty_like = torch.empty_like

    def set_overlap(self, on: bool) -> bool:
        """Whether later calls launch with programmatic dependent launch (one switch per library, shared by every
        CutlassKernel of it); returns the previous setting, so that a check can restore it."""
        return bool(self._set_overlap(int(on)))

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

    def _workspace_needed(self, device, m: int, n: int, k: int, batch: int) -> int:
        """Bytes of workspace a launch of this size writes (0 for most kernels), asked of the library once."""
        key = (device.index, m, n, k, batch)
        needed = self._workspace_bytes.get(key)
        if needed is None:
            size = ctypes.c_size_t(0)
            status = self._workspace_size(m, n, k, batch, ctypes.byref(size))
            if status != 0:
                raise (ValueError if status in _ARGUMENT_ERRORS else LaunchError)(self._error(status))
            needed = self._workspace_bytes[key] = size.value
        return needed

    def _unused_workspace(self, device):
        """The 16-byte buffer passed to a launch that writes no workspace (the entry point wants a pointer); kept
        for the kernel's life, since call plans and captured graphs hold its address."""
        workspace = self._unused_workspaces.get(device.index)
        if workspace is None:
            import torch
            workspace = self._unused_workspaces[device.index] = torch.empty(UNUSED_WORKSPACE_BYTES, dtype=torch.uint8,
                                                                            device=device)
        return workspace

    def _workspace(self, device, m: int, n: int, k: int, batch: int):
        """The workspace of one launch: a fresh buffer from torch's caching allocator on the current stream where
        the launch writes one (freed once the launch is enqueued, the allocator reuses it only in that stream's
        order, and under CUDA-graph capture it comes from the graph's pool), else the unused buffer."""
        needed = self._workspace_needed(device, m, n, k, batch)
        if needed == 0:
            return self._unused_workspace(device)
        import torch
        return torch.empty(needed, dtype=torch.uint8, device=device)

    def __call__(self, a, b, c=None, bias=None, out=None):
        """Launch on torch's current stream; checks everything on the first call of a signature.

        The eager fast path: a call that allocates its output (`out` and `c` None) and whose signature
        (shapes, strides, dtypes, devices of a, b and bias) was checked before reuses that call's plan, so
        only what can change between such calls is looked at again: the pointers' 16-byte alignment and
        the current device. Everything else goes through the full checks in `_checked_call`. The plan's fixed
        arguments sit in a C struct that a seven-argument shim forwards (`shim.py`): ctypes converts each
        argument in Python, and the 20-argument entry would cost ~3 µs more host time per call.
        """
        if out is None and c is None:
            return self.call_planned(call_signature(a, b, bias), a, b, bias)
        return self._checked_call(a, b, c, bias, out)[0]

    def call_planned(self, key, a, b, bias=None):
        """The allocating call with its call signature `key` already computed (see Kernel.call_planned)."""
        launch = self.launcher(key)
        if launch is not None:
            out = launch(a, b, bias)
            if out is not None:
                return out
        result, plan = self._checked_call(a, b, None, bias, None)
        if key is not None and plan is not None:
            self._plans[key] = plan
        return result

    def launcher(self, key):
        """The plan of signature `key` as one closure over what it fixes (see Kernel.launcher), bound once per
        plan; None without a plan."""
        launch = self._launches.get(key)
        if launch is None:
            plan = self._plans.get(key) if key is not None else None
            if plan is None:
                return None
            launch = self._launches[key] = self._bind(plan)
        return launch

    def _bind(self, plan):
        """A plan's replay: the pointers' alignment and the current device checked (None: declined), the output
        (and where the kernel writes one, the workspace) allocated, then the shim's seven-argument call (or the
        20-argument entry where the shim did not build)."""
        device, template, transposed = plan.device, plan.out_template, plan.transposed
        empty_like, get_device, get_stream, error = self._empty_like, self._get_device, self._get_stream, self._error
        if plan.native_address:
            run, address = self._run_planned, plan.native_address
        else:
            direct, (*fixed, workspace, workspace_bytes), address = self._run, plan.arguments, 0

            def run(_, pa, pb, pbias, pd, pworkspace, stream):
                return direct(pa, pb, None, pbias, pd, *fixed, workspace or pworkspace, workspace_bytes, stream)

        workspace_template = None
        if plan.workspace_per_call:
            import torch
            workspace_template = output_template((plan.workspace_per_call,), torch.uint8, template.device)

        def launch(a, b, bias, _struct=plan.native):   # holds the C struct at `address` for the closure's life
            pa, pb = a.data_ptr(), b.data_ptr()
            pbias = bias.data_ptr() if bias is not None else None
            if (pa | pb | (pbias or 0)) & 15 or get_device() != device:
                return None
            out = empty_like(template)
            workspace = empty_like(workspace_template) if workspace_template is not None else None
            status = run(address, pa, pb, pbias, out.data_ptr(), workspace.data_ptr() if workspace is not None
                         else None, get_stream(device))
            if status != 0:
                raise (ValueError if status in _ARGUMENT_ERRORS else LaunchError)(error(status))
            return out.transpose(-1, -2) if transposed else out
        if plan.native_address:   # what the C++ call table (l2c/native_call.py) replays the same plan from
            launch.native_plan = (plan.native, address, template, transposed, device)
        return launch

    def _checked_call(self, a, b, c, bias, out):
        """Check everything, launch; returns (out, the plan that replays this call, or None)."""
        import torch
        allocated = out is None
        spec = self.valid.spec
        in_dtype, out_dtype = _torch_dtype(spec.types_a), _torch_dtype(spec.types_c)
        _check_tensor("a", a, in_dtype)
        _check_tensor("b", b, in_dtype)
        if a.dim() != b.dim():
            raise SignatureDeclined(f"a is {a.dim()}-D but b is {b.dim()}-D; both are (M, K)/(K, N) or both batched")
        m, k = a.shape[-2:]
        k_b, n = b.shape[-2:]
        if k != k_b:
            raise SignatureDeclined(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: inner dimensions differ")
        if self._gated:   # B holds the gate's N columns, then the up projection's
            if n % 2:
                raise SignatureDeclined(f"b is {tuple(b.shape)}: a gated kernel's B holds 2N columns (the gate's, "
                                        "then the up projection's)")
            n //= 2
            if n % self._n_step:
                raise SignatureDeclined(f"N={n}: the gated GEMM {self.valid.name} needs N to be a multiple of "
                                        f"tile n={self._n_step}")
        batch = a.shape[0] if a.dim() == 3 else 1
        if a.dim() == 3 and b.shape[0] != batch:
            raise SignatureDeclined(f"batch of a is {batch} but of b is {b.shape[0]}")
        _check_sizes(m, n, k, batch)
        for name, value, fixed in zip(("M", "N", "K", "batch"), (m, n, k, batch), self._fixed):
            if fixed != ANY and value != fixed:
                raise SignatureDeclined(f"{self.valid.name} is built for problem {name}={fixed}, got {value}")
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
            length = m if self._bias == "row" else (2 * n if self._gated else n)
            if bias is None:
                raise SignatureDeclined(f"epilogue bias={self._bias} needs `bias` of shape ({length},)")
            _check_tensor("bias", bias, out_dtype, (length,))
            if bias.stride(0) != 1:
                raise SignatureDeclined("bias must be contiguous")
            if bias.data_ptr() % 16:
                raise ValueError("bias must be 16-byte aligned")
        elif bias is not None:
            raise SignatureDeclined("this kernel has no bias epilogue; `bias` must be None")
        for name, t in (("b", b), ("c", c), ("bias", bias), ("out", out)):
            if t is not None and t.device != a.device:
                raise SignatureDeclined(f"`{name}` is on {t.device} and `a` on {a.device}: one device, as torch "
                                        "requires")
        if m == 0 or n == 0:
            return out, None
        if k == 0:
            raise SignatureDeclined("K = 0: nothing to multiply (the CUTLASS kernel needs K >= 1)")

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
            # a plan holds the unused buffer's address, or none (0): each replay then allocates its own
            needed = self._workspace_needed(device, m, n, k, batch)
            workspace = 0 if needed else self._unused_workspace(device).data_ptr()
            arguments = (m, n, k, batch, lda, bsa, ldb, bsb, ldc, bsc, ldd, bsd, workspace,
                         needed or UNUSED_WORKSPACE_BYTES)
            native = None
            if self._run_planned is not None:
                switch = self._set_overlap if overlaps_only_own_in_capture(self.valid) else None
                native = shim.make_plan(self._run, arguments, switch)
            stored_shape = tuple(out.mT.shape) if spec.layout_c == "col" else tuple(out.shape)
            plan = _CallPlan(
                device=device.index, dtype=out.dtype, transposed=spec.layout_c == "col", stored_shape=stored_shape,
                out_template=output_template(stored_shape, out.dtype, device), workspace_per_call=needed,
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
            raise (ValueError if status in _ARGUMENT_ERRORS else LaunchError)(self._error(status))
        return out


@dataclass(frozen=True)
class _CallPlan:
    """What a checked call derived from its signature alone, replayed by later calls of that signature."""
    device: int
    dtype: object                  # torch dtype of the output
    stored_shape: Tuple[int, ...]  # the output as allocated (transposed back when layout c=col)
    transposed: bool
    out_template: object           # kernel.output_template of the stored output: its allocation per call
    arguments: Tuple[int, ...]     # M, N, K, L, the leading dims and batch strides, workspace pointer and bytes
    workspace_per_call: int = 0    # bytes each replay allocates for its workspace (pointer 0 in `arguments`)
    native: object = None          # the same arguments in the shim's C struct (shim.py), kept alive here
    native_address: int = 0        # its address, passed to the shim per call; 0: use the 20-argument entry


def _torch_dtype(name: str):
    import torch
    return {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[name]


def _check_sizes(m: int, n: int, k: int, batch: int) -> None:
    """M, N, K and batch are C ints in the entry points and the call plan: ctypes would wrap a larger one silently
    (2^32 + 8 rows would run as 8)."""
    if max(m, n, k, batch) > INT_MAX:
        raise SignatureDeclined(f"M, N, K and batch must be below 2^31; got {m}, {n}, {k}, {batch}")


def _check_tensor(name: str, t, dtype, shape: Optional[Sequence[int]] = None) -> None:
    import torch
    if not isinstance(t, torch.Tensor):
        raise SignatureDeclined(f"`{name}` must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise SignatureDeclined(f"`{name}` is on {t.device}; CUTLASS kernels run on CUDA tensors")
    if t.dtype != dtype:
        raise SignatureDeclined(f"`{name}` is {t.dtype}, the spec needs {dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise SignatureDeclined(f"`{name}` has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if shape is None and t.dim() not in (2, 3):
        raise SignatureDeclined(f"`{name}` must be 2-D or batched 3-D, got shape {tuple(t.shape)}")


def _leading_dims(name: str, t, layout: str) -> Tuple[int, int]:
    """(leading dimension, batch stride) in elements of a row- or column-major (batched) matrix, after checking
    the layout and TMA's 16-byte alignment of the pointer, the contiguous extent and every stride."""
    rows, cols = t.shape[-2:]
    if layout == "row":
        contiguous, extent, outer, ld = t.stride(-1), cols, rows, t.stride(-2)
    else:
        contiguous, extent, outer, ld = t.stride(-2), rows, cols, t.stride(-1)
    if contiguous != 1 and extent > 1:
        which = "(-1)" if layout == "row" else "(-2)"
        raise SignatureDeclined(f"`{name}` must be {layout}-major (stride {which} == 1), "
                                f"got strides {tuple(t.stride())}")
    if outer == 1:
        ld = extent   # a single row/column: its stride is arbitrary, pass the packed one
    nbytes = t.element_size()
    batch_stride = t.stride(0) if t.dim() == 3 and t.shape[0] > 1 else ld * outer
    if t.data_ptr() % 16:
        raise ValueError(f"`{name}` data pointer is not 16-byte aligned (TMA)")
    if (extent * nbytes) % 16 or (ld * nbytes) % 16 or (batch_stride * nbytes) % 16:
        raise SignatureDeclined(f"`{name}` ({layout}-major, shape {tuple(t.shape)}, strides {tuple(t.stride())}): the "
                         f"contiguous extent, leading dimension and batch stride must be multiples of 16 bytes")
    if ld < extent:
        raise SignatureDeclined(f"`{name}` has leading dimension {ld} < its contiguous extent {extent}")
    return ld, batch_stride


def load_cutlass(valid: ValidSpec, library_path: Union[str, Path], source: Optional[str] = None) -> CutlassKernel:
    """Wrap a compiled .so as a CutlassKernel (ctypes load; calling it needs a GPU)."""
    try:
        return CutlassKernel(valid, source if source is not None else render(valid), library_path)
    except (OSError, AttributeError) as err:
        raise BuildError(f"loading {library_path} for {valid.name} failed: {err}") from err
