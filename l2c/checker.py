"""Verification on the calling thread: `l2c.verify`'s checks made by l2c's own CUDA checker
(templates/cutlass/checker.cu) instead of torch's operators, so that a prebuilt kernel serves from its first call.

Verifying with torch in a fresh process loads each torch kernel it uses for the first time, 15-50 ms apiece on the
H200 (0.35 s for the dozen a check needs), and the background worker costs seconds to start. The checker's library
is one small module loaded in about a millisecond, shipped in the prebuilt pack like the CUTLASS kernels (or
compiled once per machine, in the background, where nvcc is installed).

The checks are the GPU branch of `l2c.verify`, for the plain epilogues the dispatcher builds (alpha, a bias per row
or column, no activation, no C input, no gate): fresh Normal(0, 1) inputs in the spec's layouts (drawn by the
checker from a new seed each time), the output poisoned with NaN between poisoned guards, a float32 reference of
the product and of its spread, `verify.element_bound` at every output and the relative Frobenius error against
`verify.tolerance`; the operands and guards compared with what was written there (a kernel writes nothing else);
then operands with padded leading dimensions, inputs of -1, 0 and 1 where the result must be exact
(`verify.exact_density`), the same shape with partial tiles (`verify.edge_shape`) and two calls that allocate their
output. `l2c.verify`'s NaN row is not checked here: it catches activations that drop NaN, and these epilogues have
none. Problems
larger than `MAX_MACS` multiply-adds or whose operands exceed `MAX_OPERAND_BYTES` are left to the worker: the
checker's naive float32 product would cost too long on a caller's thread, and its inputs too much of its memory.

What the worker's separate process bought is given up here: a kernel that faults (an illegal address) while checked
on the caller's thread leaves the caller's CUDA context unusable, where in the worker it only killed the worker. The
dispatcher checks here only kernels that load without a compiler: the pack's, whose tables were measured (and so
verified) on the GPU they were made for, or builds already in the user's cache.
"""
from __future__ import annotations

import ctypes
import logging
import math
import secrets
import struct
import threading
from importlib import resources
from typing import Optional, Tuple

import torch

from . import cache
from .errors import BuildError
from .verify import (ELEMENT_SAFETY, GUARD_ELEMENTS, TORCH_DTYPES, UNIT_ROUNDOFF, VerifyResult,
                     check_allocating_calls, exact_density, tolerance, verdict, with_edge_shape)

log = logging.getLogger("l2c.checker")

NAME = "l2c_checker"
SPEC = "(l2c's verification checker: templates/cutlass/checker.cu, no kernel spec)"   # its pack manifest entry
MAX_MACS = 2 ** 34
MAX_OPERAND_BYTES = 2 ** 28
_DTYPE_CODES = {"f16": 0, "bf16": 1, "f32": 2}
_BIAS_CODES = {"none": 0, "row": 1, "col": 2}


class CheckerUnavailable(Exception):
    """The checker cannot run here (its library cannot be loaded without a compiler, or a CUDA call failed): the
    kernel is verified by the worker instead. Never a verdict on the kernel."""


class _Totals(ctypes.Structure):
    _fields_ = [("worst", ctypes.c_uint64), ("nan_count", ctypes.c_uint64), ("first_nan", ctypes.c_uint64),
                ("nonfinite", ctypes.c_uint64), ("diff2", ctypes.c_double), ("ref2", ctypes.c_double),
                ("bound2", ctypes.c_double)]


def source() -> str:
    return resources.files("l2c._templates").joinpath("cutlass", "checker.cu").read_text()


def checkable(spec, m: int, n: int, k: int) -> bool:
    """Whether the checker verifies `spec` at (m, n, k) (else the worker does)."""
    if spec.types_a not in ("f16", "bf16") or spec.types_b != spec.types_a or spec.types_c not in _DTYPE_CODES:
        return False
    if spec.epilogue_beta != 0.0 or spec.epilogue_activation != "none" or spec.epilogue_gate != "none":
        return False
    if str(spec.problem_batch) not in ("1", "any") or min(m, n, k) < 1 or m * n >= 2 ** 32:
        return False
    return m * n * k <= MAX_MACS and 2 * (m * k + k * n) <= MAX_OPERAND_BYTES


_lock = threading.Lock()
_library: Optional[ctypes.CDLL] = None


def prepare(compile_if_needed: bool = True) -> bool:
    """Load the checker's library from the build cache or the pack (one small library decompressed), or, with
    `compile_if_needed`, compile it with nvcc first (about 3 s, once per machine; outside the lock, so that a caller
    asking without compiling waits for an install at most, never for nvcc). False when it cannot be had."""
    from .targets.cutlass.build import compile_source, loads_without_compiler
    text = source()
    with _lock:
        if _library is not None:
            return True
        if loads_without_compiler(text, NAME):
            try:
                return _load(compile_source(text, NAME))
            except BuildError as err:   # a damaged pack entry: nvcc may still build it below
                log.debug("l2c's checker cannot be installed: %s", err)
    if not compile_if_needed:
        return False
    try:
        path = compile_source(text, NAME)
    except BuildError as err:
        log.debug("l2c's checker cannot be built: %s", err)
        return False
    with _lock:
        return _library is not None or _load(path)


def _load(path) -> bool:
    global _library
    try:
        library = cache.load_library(path)
        _bind(library)
    except (OSError, AttributeError) as err:
        log.debug("l2c's checker cannot be loaded: %s", err)
        return False
    _library = library
    return True


def _bind(library: ctypes.CDLL) -> None:
    i64, ptr, f32, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
    operands = [ptr, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, i32, i32, i32, i32, i32, i32,
                f32, f32, f32, f32, f32, f32]
    library.l2c_checker_fill.argtypes = [ptr, i64, i32, ctypes.c_uint64, f32, ptr]
    library.l2c_checker_changed.argtypes = [ptr, i64, i32, ctypes.c_uint64, f32, ptr, ptr, ptr]
    library.l2c_checker_poison.argtypes = [ptr, i64, ptr]
    library.l2c_checker_unpoisoned.argtypes = [ptr, i64, ptr, ptr, ptr]
    library.l2c_checker_compare.argtypes = operands + [ptr, ptr, ptr]
    library.l2c_checker_point.argtypes = operands + [i32, i32, ptr, ptr, ptr]
    for fn in (library.l2c_checker_fill, library.l2c_checker_changed, library.l2c_checker_poison,
               library.l2c_checker_unpoisoned, library.l2c_checker_compare, library.l2c_checker_point):
        fn.restype = ctypes.c_int


def _status(code: int, what: str) -> None:
    if code != 0:
        raise CheckerUnavailable(f"the checker's {what} failed with CUDA error {code}")


class _Check:
    """The inputs of one problem and the checker's calls on them: Normal(0, 1) inputs, or with `density` inputs of
    -1, 0 and 1 (`verify.exact_density`); with `padded` the operands' leading dimensions 16 bytes past their
    extents (a column slice of a fused weight, as the dispatcher serves)."""

    def __init__(self, spec, m: int, n: int, k: int, device: torch.device, stream: int, density: float = 0.0,
                 padded: bool = False):
        self.spec, self.m, self.n, self.k, self.stream, self.density = spec, m, n, k, stream, density
        self.filled = []   # (the buffer an input was drawn into, its dtype code, its seed): what a kernel must leave
        self.a = self._random((m, k), spec.layout_a, spec.types_a, device, padded)
        self.b = self._random((k, n), spec.layout_b, spec.types_a, device, padded)
        self.bias = None
        if spec.epilogue_bias != "none":
            self.bias = self._random((m if spec.epilogue_bias == "row" else n,), "row", spec.types_c, device, False)
        self.guards = ()
        self.scratch = torch.empty(64, dtype=torch.uint8, device=device)
        if density:   # integers summed in float32: every correct output equals the reference exactly
            self.bound = (float(spec.epilogue_alpha), 0.0, 0.0, 0.0, 0.0, torch.finfo(TORCH_DTYPES[spec.types_c]).tiny)
        else:
            self.bound = (float(spec.epilogue_alpha), UNIT_ROUNDOFF[spec.types_c],
                          math.sqrt(max(k, 1)) * (UNIT_ROUNDOFF[spec.types_acc] + UNIT_ROUNDOFF["f32"]),
                          4 * UNIT_ROUNDOFF["f32"], ELEMENT_SAFETY, torch.finfo(TORCH_DTYPES[spec.types_c]).tiny)

    def _random(self, shape: Tuple[int, ...], layout: str, types: str, device, padded: bool) -> torch.Tensor:
        """Values of l2c type `types` with logical `shape`, drawn by the checker; `col` stores the dims transposed."""
        stored_shape = shape if layout == "row" else shape[::-1]
        dtype = TORCH_DTYPES[types]
        pad = 128 // torch.finfo(dtype).bits if padded and len(shape) == 2 else 0   # 16 bytes of elements
        buffer = torch.empty((*stored_shape[:-1], stored_shape[-1] + pad), dtype=dtype, device=device)
        seed = secrets.randbits(63)
        _status(_library.l2c_checker_fill(buffer.data_ptr(), buffer.numel(), _DTYPE_CODES[types], seed, self.density,
                                          self.stream), "fill")
        self.filled.append((buffer, _DTYPE_CODES[types], seed))
        stored = buffer[..., :stored_shape[-1]] if pad else buffer
        return stored if layout == "row" else stored.t()

    def poisoned_output(self, device) -> torch.Tensor:
        """The output, NaN, carved with its layout's strides from the middle of a NaN buffer with GUARD_ELEMENTS on
        each side (the guards a kernel storing past its output's ends changes)."""
        spec = self.spec
        dtype = TORCH_DTYPES[spec.types_c]
        count = self.m * self.n
        buffer = torch.empty(count + 2 * GUARD_ELEMENTS, dtype=dtype, device=device)
        _status(_library.l2c_checker_poison(buffer.data_ptr(), buffer.numel() * buffer.element_size(), self.stream),
                "poison")
        self.guards = (buffer[:GUARD_ELEMENTS], buffer[GUARD_ELEMENTS + count:])
        strides = (1, self.m) if spec.layout_c == "col" else (self.n, 1)
        return buffer.as_strided((self.m, self.n), strides, GUARD_ELEMENTS)

    def wrote_elsewhere(self) -> Optional[str]:
        """What a kernel changed besides its output (as `verify._wrote_elsewhere`), or None."""
        changed = ctypes.c_uint64()
        for (buffer, code, seed), name in zip(self.filled, ("a", "b", "bias")):
            _status(_library.l2c_checker_changed(buffer.data_ptr(), buffer.numel(), code, seed, self.density,
                                                 self.scratch.data_ptr(), ctypes.addressof(changed), self.stream),
                    "operand comparison")
            if changed.value:
                return f"kernel wrote to its input `{name}` ({changed.value} elements changed)"
        for guard in self.guards:
            _status(_library.l2c_checker_unpoisoned(guard.data_ptr(), guard.numel() * guard.element_size(),
                                                    self.scratch.data_ptr(), ctypes.addressof(changed), self.stream),
                    "guard comparison")
            if changed.value:
                return "kernel wrote outside its output (past its first or last element)"
        return None

    def _operands(self, out: torch.Tensor) -> list:
        bias = self.bias.data_ptr() if self.bias is not None else None
        return [self.a.data_ptr(), self.a.stride(0), self.a.stride(1), self.b.data_ptr(), self.b.stride(0),
                self.b.stride(1), out.data_ptr(), out.stride(0), out.stride(1), bias,
                _BIAS_CODES[self.spec.epilogue_bias], self.m, self.n, self.k, _DTYPE_CODES[self.spec.types_a],
                _DTYPE_CODES[self.spec.types_c], *self.bound]

    def compare(self, out: torch.Tensor) -> _Totals:
        totals = _Totals()
        _status(_library.l2c_checker_compare(*self._operands(out), self.scratch.data_ptr(),
                                             ctypes.addressof(totals), self.stream), "comparison")
        return totals

    def point(self, out: torch.Tensor, i: int, j: int) -> Tuple[float, float, float]:
        values = (ctypes.c_float * 3)()
        _status(_library.l2c_checker_point(*self._operands(out), i, j, self.scratch.data_ptr(),
                                           ctypes.addressof(values), self.stream), "point")
        return values[0], values[1], values[2]


def verify(kernel, m: int, n: int, k: int, device: Optional[torch.device] = None) -> VerifyResult:
    """`l2c.verify.verify(kernel, m, n, k)` for a `checkable` spec, on the current CUDA stream of `device`;
    CheckerUnavailable when the checker cannot run (the caller then verifies another way)."""
    if _library is None and not prepare(compile_if_needed=False):
        raise CheckerUnavailable("l2c's checker library is neither in the build cache nor in the pack")
    device = torch.device(device if device is not None else "cuda")
    stream = torch.cuda.current_stream(device).cuda_stream
    return with_edge_shape(kernel.valid, m, n, k,
                           lambda m, n, k, allocating: _verify_shape(kernel, m, n, k, device, stream, allocating))


def _verify_shape(kernel, m: int, n: int, k: int, device, stream: int, allocating_calls: bool) -> VerifyResult:
    spec = kernel.valid.spec
    tol = tolerance(spec, k)
    check = _Check(spec, m, n, k, device, stream)
    out = check.poisoned_output(device)
    failed = _call(kernel, check, out, tol, "")
    if failed is not None:
        return failed
    result = _judge(check, out, tol, "")
    if result.ok:   # a kernel that declines padded operands (ValueError) leaves such calls to torch: no fault
        padded = _Check(spec, m, n, k, device, stream, padded=True)
        result = _call(kernel, padded, padded.poisoned_output(device), tol,
                       " (operands with padded leading dimensions)", judge=_judge, declined_ok=True) or result
    density = exact_density(spec, k)
    if result.ok and density is not None:
        exact = _Check(spec, m, n, k, device, stream, density=density)
        result = _call(kernel, exact, exact.poisoned_output(device), tol,
                       " (inputs of -1, 0 and 1, where a correct kernel is exact)", judge=_judge_exact) or result
    if result.ok and allocating_calls:   # the kernel's calls synchronize nothing; the checker's comparison does
        what = " (the calls allocating their output)"
        result = check_allocating_calls(kernel, check.a, check.b, check.bias, out, tol,
                                        lambda got, what: _judge(check, got, tol, what), lambda: None) or result
        wrote_elsewhere = check.wrote_elsewhere() if result.ok else None
        if wrote_elsewhere:
            return VerifyResult(False, math.inf, tol, wrote_elsewhere + what)
    return result


def _call(kernel, check: _Check, out: torch.Tensor, tol: float, what: str, judge=None, declined_ok: bool = False
          ) -> Optional[VerifyResult]:
    """Call the kernel on `check`'s inputs into `out`; a failure (it raised, wrote elsewhere, returned another
    tensor, or `judge`'s verdict on `out`), or None."""
    try:
        returned = kernel(check.a, check.b, bias=check.bias, out=out)
    except ValueError as err:
        if declined_ok:
            return None
        return VerifyResult(False, math.inf, tol, f"kernel raised ValueError: {err}{what}")
    except Exception as err:  # noqa: BLE001 - a kernel that raises is a failed check
        return VerifyResult(False, math.inf, tol, f"kernel raised {type(err).__name__}: {err}{what}")
    wrote_elsewhere = check.wrote_elsewhere()
    if wrote_elsewhere:
        return VerifyResult(False, math.inf, tol, wrote_elsewhere + what)
    if returned is not out:
        return VerifyResult(False, math.inf, tol, "kernel did not return the `out` tensor it was given" + what)
    if judge is None:
        return None
    result = judge(check, out, tol, what)
    return None if result.ok else result


def _judge_exact(check: _Check, out: torch.Tensor, tol: float, what: str) -> VerifyResult:
    """Every output equal to the reference (the checker's bound is the output type's smallest normal: any
    difference is over it)."""
    totals = check.compare(out)
    if not totals.nan_count and not totals.nonfinite and totals.diff2 == 0.0:
        return VerifyResult(True, 0.0, tol)
    judged = _judge(check, out, 0.0, what)
    return VerifyResult(False, judged.rel_error, tol, f"not exact: {judged.reason or 'outputs differ' + what}")


def _judge(check: _Check, out: torch.Tensor, tol: float, what: str) -> VerifyResult:
    """`verify`'s verdict from the checker's totals over `out`."""
    totals = check.compare(out)
    if totals.nan_count:
        first = totals.first_nan
        return VerifyResult(False, math.nan, tol, f"unwritten output (NaN) at element "
                            f"{(first // check.n, first % check.n)} ({totals.nan_count} of {check.m * check.n}){what}")
    excess = struct.unpack("<f", struct.pack("<I", totals.worst >> 32))[0]

    def element() -> str:
        index = totals.worst & 0xFFFFFFFF
        i, j = index // check.n, index % check.n
        ref, bound, got = check.point(out, i, j)
        return (f"element {(i, j)} is {got:.6g}, expected {ref:.6g}: off by {abs(got - ref):.3g}, {excess:.3g} times "
                f"its elementwise bound {bound:.3g}")
    # the totals leave infinite outputs and references out of the sums: they make the error's norm infinite
    err_norm = math.inf if totals.nonfinite else math.sqrt(totals.diff2)
    return verdict(err_norm, math.sqrt(totals.ref2), math.sqrt(totals.bound2), check.m * check.n, check.spec.types_c,
                   tol, excess, element, what)
