"""Verification: run a built kernel on fresh random inputs and compare it with a high-precision reference.

Inputs are drawn anew for every check from a normal distribution (zeros or 0/1 matrices hide accumulator
precision and indexing bugs), laid out as the spec says (column-major operands are transposes of
contiguous tensors), and the output buffer is poisoned with NaN first, so an element the kernel never
writes cannot pass. The reference is float64 on the CPU, or float32 (no TF32) on the GPU when the problem
is too large for that. A kernel that raises is a failed check, never an exception out of `verify`.
"""
from __future__ import annotations

import contextlib
import math
import secrets
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}

# Relative Frobenius error allowed for the multiply itself, by input type (f32 inputs: by `types.math`).
_MATH_TOLERANCE = {"f16": 2e-3, "bf16": 1.5e-2, "tf32": 2e-3, "ieee": 1e-5}
# Added for rounding the result to the output type.
_OUTPUT_ROUNDING = {"f16": 1e-3, "bf16": 8e-3, "f32": 0.0}
# Problems with more multiply-adds than this use a float32 reference on the GPU instead of float64 on the CPU.
GPU_REFERENCE_MACS = 2 ** 28


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    rel_error: float
    tolerance: float
    reason: str = ""


def tolerance(spec, k: int) -> float:
    """Allowed ||out - ref|| / ||ref|| for `spec` at reduction depth `k`.

    Rounding errors of a K-long sum grow like sqrt(K) units in the last place of the accumulator; that term
    is negligible for an fp32 accumulator except against the 1e-5 of exact-f32 math, and dominant for an
    f16 accumulator.
    """
    math_tol = _MATH_TOLERANCE[spec.types_math if spec.types_a == "f32" else spec.types_a]
    acc_ulp = 2.0 ** -11 if spec.types_acc == "f16" else 2.0 ** -24
    return math_tol + _OUTPUT_ROUNDING[spec.types_c] + 2 * acc_ulp * math.sqrt(max(k, 1))


def reference(spec, a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor] = None,
              bias: Optional[torch.Tensor] = None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """D = act(alpha * a @ b + beta * c + bias) computed in `dtype` on the inputs' device (not cast to types.c)."""
    result = torch.matmul(a.to(dtype), b.to(dtype))
    if spec.epilogue_alpha != 1.0:
        result = result * spec.epilogue_alpha
    if spec.epilogue_beta != 0.0:
        result = result + spec.epilogue_beta * c.to(dtype)
    if spec.epilogue_bias == "row":
        result = result + bias.to(dtype)[:, None]
    elif spec.epilogue_bias == "col":
        result = result + bias.to(dtype)
    if spec.epilogue_activation == "relu":
        result = torch.relu(result)
    elif spec.epilogue_activation == "gelu":
        result = F.gelu(result)  # exact erf form
    elif spec.epilogue_activation == "silu":
        result = F.silu(result)
    return result


def _random(shape: Tuple[int, ...], layout: str, dtype, device, gen) -> torch.Tensor:
    """Normal(0, 1) values of `dtype` with logical `shape`; `col` stores the last two dims transposed."""
    if layout == "col":
        stored = (*shape[:-2], shape[-1], shape[-2])
        return torch.randn(stored, generator=gen, device=device).to(dtype).transpose(-1, -2)
    return torch.randn(shape, generator=gen, device=device).to(dtype)


def make_inputs(spec, m: int, n: int, k: int, batch: int, device, gen):
    """(a, b, c or None, bias or None, out poisoned with NaN) in the spec's types and layouts."""
    lead = (batch,) if batch > 1 else ()
    in_t, out_t = TORCH_DTYPES[spec.types_a], TORCH_DTYPES[spec.types_c]
    a = _random((*lead, m, k), spec.layout_a, in_t, device, gen)
    b = _random((*lead, k, n), spec.layout_b, in_t, device, gen)
    c = _random((*lead, m, n), spec.layout_c, out_t, device, gen) if spec.epilogue_beta != 0.0 else None
    bias = None
    if spec.epilogue_bias != "none":
        bias = torch.randn(m if spec.epilogue_bias == "row" else n, generator=gen, device=device).to(out_t)
    out_stored = (*lead, n, m) if spec.layout_c == "col" else (*lead, m, n)
    out = torch.full(out_stored, float("nan"), dtype=out_t, device=device)
    if spec.layout_c == "col":
        out = out.transpose(-1, -2)
    return a, b, c, bias, out


@contextlib.contextmanager
def _exact_fp32_matmul():
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def verify(kernel, m: int, n: int, k: int, batch: int = 1, device: Union[str, torch.device, None] = None,
           seed: Optional[int] = None) -> VerifyResult:
    """Check `kernel` (an l2c Kernel) on one problem; see the module docstring."""
    spec = kernel.valid.spec
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    tol = tolerance(spec, k)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else secrets.randbits(63))
    a, b, c, bias, out = make_inputs(spec, m, n, k, batch, device, gen)
    try:
        returned = kernel(a, b, c=c, bias=bias, out=out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as err:  # noqa: BLE001 - a kernel that raises is a failed candidate
        return VerifyResult(False, math.inf, tol, f"kernel raised {type(err).__name__}: {err}")
    if returned is not out:
        return VerifyResult(False, math.inf, tol, "kernel did not return the `out` tensor it was given")
    if out.numel() == 0:
        return VerifyResult(True, 0.0, tol)
    if torch.isnan(out).any():
        return VerifyResult(False, math.nan, tol, "unwritten output (NaN)")

    if device.type == "cuda" and batch * m * n * k > GPU_REFERENCE_MACS:
        with _exact_fp32_matmul():
            ref = reference(spec, a, b, c, bias, dtype=torch.float32)
        as_ref = lambda t: t.float()
    else:
        cpu = [t.cpu() if t is not None else None for t in (a, b, c, bias)]
        ref = reference(spec, *cpu, dtype=torch.float64)
        as_ref = lambda t: t.cpu().double()
    ref_norm = torch.linalg.vector_norm(ref).item()

    def check(got: torch.Tensor, what: str) -> VerifyResult:
        err_norm = torch.linalg.vector_norm(as_ref(got) - ref).item()
        rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
        if not math.isfinite(rel):
            return VerifyResult(False, rel, tol, f"non-finite output or reference (overflow?){what}")
        if rel > tol:
            return VerifyResult(False, rel, tol, f"relative error {rel:.3g} exceeds tolerance {tol:.3g}{what}")
        return VerifyResult(True, rel, tol)

    result = check(out, "")
    if result.ok and c is None:
        # The path eager callers take: the kernel allocates its output. Twice, because a second call of a
        # signature may take a different path than the first (a replayed launch plan).
        for attempt in ("first", "second"):
            what = f" (the {attempt} call allocating its output)"
            try:
                fresh = kernel(a, b, bias=bias)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            except Exception as err:  # noqa: BLE001
                return VerifyResult(False, math.inf, tol, f"kernel raised {type(err).__name__}: {err}{what}")
            if (tuple(fresh.shape), fresh.stride(), fresh.dtype) != (tuple(out.shape), out.stride(), out.dtype):
                return VerifyResult(False, math.inf, tol, f"output of shape {tuple(fresh.shape)}, strides "
                                    f"{fresh.stride()} and {fresh.dtype}; expected {tuple(out.shape)}, "
                                    f"{out.stride()} and {out.dtype}{what}")
            again = check(fresh, what)
            if not again.ok:
                return again
    return result
