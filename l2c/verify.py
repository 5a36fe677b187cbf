"""Verification: run a built kernel on fresh random inputs and compare it with a high-precision reference.

Inputs are drawn anew for every check from a normal distribution (zeros or 0/1 matrices hide accumulator
precision and indexing bugs), laid out as the spec says (column-major operands are transposes of
contiguous tensors), and the output buffer is poisoned with NaN first, so an element the kernel never
writes cannot pass. The reference is float64 on the CPU, or float32 (no TF32) on the GPU when the problem
is too large for that. A kernel that raises is a failed check, never an exception out of `verify`.

Two checks, both must hold: the relative Frobenius error against a per-dtype tolerance, and an elementwise bound
(`element_bound`), because a norm over millions of elements lets one wrong element, a wrong 3x3 block or one
wrong edge column through. A shape-generic kernel checked at a shape that fills its tiles exactly is also
checked at a shape with partial tiles in every open dimension (`edge_shape`), where masking bugs live. Then the
call is made again on inputs of -1, 0 and 1 (`exact_density`), where every correct kernel is exact: a product term
left out or added twice fails there however loose the tolerance of normal inputs (an f16 accumulator at large K).
Last, one NaN in A must turn exactly its row of the output into NaN, as in torch (`_check_nan_rows`).

A gated spec (`epilogue gate`) reads a B of K x 2N (the gate's columns, then the up projection's) and a bias of 2N
values; its reference is act(gate) * up of the float reference of both halves, and its elementwise bound carries
each half's error through the product.
"""
from __future__ import annotations

import contextlib
import math
import secrets
from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union

import torch

from .epilogue import activate, gate_activation, gate_product
from .rules import output_n_step

TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}

# Relative Frobenius error allowed for the multiply itself, by input type (f32 inputs: by `types.math`).
_MATH_TOLERANCE = {"f16": 2e-3, "bf16": 1.5e-2, "tf32": 2e-3, "ieee": 1e-5}
# Added for rounding the result to the output type.
_OUTPUT_ROUNDING = {"f16": 1e-3, "bf16": 8e-3, "f32": 0.0}
# Problems with more multiply-adds than this use a float32 reference on the GPU instead of float64 on the CPU.
GPU_REFERENCE_MACS = 2 ** 28

# Unit roundoff (half an ulp of 1.0) of each type.
UNIT_ROUNDOFF = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8, "f32": 2.0 ** -24}
# TF32 keeps 10 mantissa bits of each f32 input and tensor cores may truncate rather than round the rest: each
# input is off by up to 2^-10 of itself, so a product by up to about 2 * 2^-10.
TF32_PRODUCT = 2 * 2.0 ** -10
# GELU's tanh form as the gated epilogue computes it: x sigmoid(GELU_TANH_SCALE (x + GELU_TANH_CUBIC x^3)).
GELU_TANH_SCALE = 2 * math.sqrt(2 / math.pi)
GELU_TANH_CUBIC = 0.044715
# Safety factor of the elementwise bound: it covers the slope of the activations (GELU's and SiLU's is at most
# 1.13), a few roundings in the epilogue, and rounding errors beyond the typical sqrt(K) growth; faults of 1% of
# an element stay far above it.
ELEMENT_SAFETY = 8.0


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
    if _gated(spec):   # act(gate) * up: the two products' errors add
        math_tol *= 2
    acc_ulp = 2.0 ** -11 if spec.types_acc == "f16" else 2.0 ** -24
    return math_tol + _OUTPUT_ROUNDING[spec.types_c] + 2 * acc_ulp * math.sqrt(max(k, 1))


def element_bound(spec, product: torch.Tensor, spread: torch.Tensor, c: Optional[torch.Tensor],
                  bias: Optional[torch.Tensor], ref: torch.Tensor, k: int, ref_unit: float) -> torch.Tensor:
    """The largest |out - ref| a correct kernel can show at each element, in `ref`'s dtype and device:

        ELEMENT_SAFETY * (u_out |ref| + |alpha| (p (|P| + 2 R) + sqrt(K) (u_acc + u_ref) R) + 4 u_f32 T) + tiny

    with P = a @ b (`product`) and R_ij = sqrt(sum_k a_ik^2 b_kj^2) (`spread`, the size of the K products' sum
    when their signs are random, as they are for verify's zero-mean inputs). u_out |ref|: rounding to types.c;
    p (|P| + 2 R): TF32 inputs (p = 0 for exact products), whose truncation shifts a product by a biased relative
    amount (the |P| part) plus a random one (the R part); sqrt(K) u R: rounding errors of the kernel's and of the
    reference's K-long sums, random in sign, each at most the unit times a partial sum (of size up to R): their
    sum grows like sqrt(K) u R (a norm bound, u ||a_i|| ||b_j|| with row and column norms, is sqrt(K) times
    looser: with an f16 accumulator it let errors of 100x the real ones pass); T = |alpha P| + |beta c| + |bias|:
    the fp32 epilogue, a few roundings and an activation whose erf or exp is off by up to 2 ulps (f32 GELU of a
    negative input loses digits to cancellation in 1 + erf); tiny: the smallest normal number of types.c (a kernel
    may flush subnormal results to 0).
    """
    dt = ref.dtype
    alpha = abs(float(spec.epilogue_alpha))
    p = TF32_PRODUCT if spec.types_a == "f32" and spec.types_math == "tf32" else 0.0
    sums = math.sqrt(max(k, 1)) * (UNIT_ROUNDOFF[spec.types_acc] + ref_unit)
    if _gated(spec):
        return _gated_bound(spec, product, spread, bias, ref, alpha, p, sums)
    terms = alpha * product.abs()
    if c is not None:
        terms = terms + abs(float(spec.epilogue_beta)) * c.to(dt).abs()
    if bias is not None:
        terms = terms + (bias.to(dt).abs()[:, None] if spec.epilogue_bias == "row" else bias.to(dt).abs())
    bound = (UNIT_ROUNDOFF[spec.types_c] * ref.abs() + alpha * (p * (product.abs() + 2 * spread) + sums * spread)
             + 4 * UNIT_ROUNDOFF["f32"] * terms)
    return ELEMENT_SAFETY * bound + torch.finfo(TORCH_DTYPES[spec.types_c]).tiny


def _gated(spec) -> bool:
    return spec.epilogue_gate != "none"


def _gated_bound(spec, product, spread, bias, ref, alpha, p, sums) -> torch.Tensor:
    """element_bound of a gated spec: `product` and `spread` are M x 2N (both halves of B). Each half's error before
    the activation is the plain bound's (without the output rounding); through D = act(g) * u it becomes
    |u| e_g + |act(g)| e_u (the activation's slope, at most 1.13, is in ELEMENT_SAFETY), plus the fp32 product and
    activation: a few ulps of D, and for GELU's tanh form the rounding of its cubic argument z, which moves the
    sigmoid by up to ulps of |z|."""
    dt = ref.dtype
    terms = alpha * product.abs()
    if bias is not None:
        terms = terms + bias.to(dt).abs()
    pre_error = alpha * (p * (product.abs() + 2 * spread) + sums * spread) + 4 * UNIT_ROUNDOFF["f32"] * terms
    pre = _pre_activation(spec, product, bias)
    n = pre.shape[-1] // 2
    g, u = pre[..., :n], pre[..., n:]
    act_rounding = 4 * UNIT_ROUNDOFF["f32"] * ref.abs()
    if spec.epilogue_gate == "gelu_tanh":
        act_rounding = act_rounding * (1 + (GELU_TANH_SCALE * (g + GELU_TANH_CUBIC * g ** 3)).abs())
    bound = (UNIT_ROUNDOFF[spec.types_c] * ref.abs() + u.abs() * pre_error[..., :n]
             + gate_activation(g, spec.epilogue_gate).abs() * pre_error[..., n:] + act_rounding)
    return ELEMENT_SAFETY * bound + torch.finfo(TORCH_DTYPES[spec.types_c]).tiny


def _pre_activation(spec, product: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """alpha * product + bias (per column), in `product`'s dtype."""
    result = product * spec.epilogue_alpha if spec.epilogue_alpha != 1.0 else product
    return result + bias.to(product.dtype) if bias is not None else result


def edge_shape(spec, m: int, n: int, k: int, n_step: int = 1) -> Optional[Tuple[int, int, int]]:
    """A shape with a partial last tile in every open (`any`) dimension of `spec`, when (m, n, k) has none in any of
    them; else None. Remainders are 8 elements, so every extent stays a multiple of 16 bytes (TMA), and K splits into
    whole, equal 16-byte slices (split_k mode=parallel). A kernel whose N must be a multiple of `n_step` > 1
    (`rules.output_n_step`: its tiles never end part-way along N) keeps N whole: one tile more than its tile n."""
    partial_n = n_step == 1
    dims = (("m", m, spec.tile_m, spec.problem_m), ("n", n, spec.tile_n, spec.problem_n),
            ("k", k, spec.tile_k, spec.problem_k))
    open_dims = [(d, t) for name, d, t, fixed in dims if fixed == "any" and (name != "n" or partial_n)]
    if not open_dims or any(d % t for d, t in open_dims):
        return None
    slices = spec.split_k_slices if spec.split_k_mode != "stream_k" else 1
    return (m if spec.problem_m != "any" else spec.tile_m + 8,
            n if spec.problem_n != "any" else (spec.tile_n + 8 if partial_n else 2 * spec.tile_n),
            k if spec.problem_k != "any" else slices * (spec.tile_k + 8))


def memory_needed(spec, m: int, n: int, k: int, batch: int = 1) -> int:
    """Bytes one `verify` call holds at its peak, roughly: the operands and outputs in their types, their float64
    copies and squares, the product, the spread, the reference, the bound and the difference."""
    in_bytes, out_bytes = (torch.finfo(TORCH_DTYPES[t]).bits // 8 for t in (spec.types_a, spec.types_c))
    b_cols = 2 * n if _gated(spec) else n
    operands, outputs = batch * (m * k + k * b_cols), batch * m * b_cols
    return operands * (in_bytes + 2 * 8) + outputs * (4 * out_bytes + 7 * 8)


# Bits of each type's significand (the implicit one included): every multiple of a power of two g from 0 to 2^bits * g
# is exact in it, while normal.
SIGNIFICAND_BITS = {"f16": 11, "bf16": 8, "f32": 24}
MIN_EXACT_SUM = 16   # below this largest |A @ B| sum the exact inputs would be mostly zero: no such check


def _power_of_two(x: float) -> bool:
    mantissa, exponent = math.frexp(abs(x))
    return mantissa == 0.5 and -3 <= exponent <= 5   # 2^-4 .. 2^4: its products stay normal and exact


def exact_density(spec, k: int) -> Optional[float]:
    """The density of inputs of -1, 0 and 1 at which every correct kernel for `spec` computes each output exactly,
    or None where there is none (a gate, an activation other than ReLU, an alpha or beta that is not a power of
    two). The output alpha * S + beta * C + bias (S the K-term integer sum, C and the bias of -1, 0 and 1) is then a
    multiple of the finest of its terms' scales and, eight standard deviations of S out (a sum of products nonzero
    with probability density^2), within the significand of the output type (and S within the accumulator's): every
    summation order, split and accumulator type gives it exactly, no rounding is left to differ, and a product term
    left out or added twice shows however loose the tolerance of normal inputs is (an f16 accumulator at large K)."""
    if _gated(spec) or spec.epilogue_activation not in ("none", "relu"):
        return None
    alpha, beta = abs(spec.epilogue_alpha), abs(spec.epilogue_beta)
    if not _power_of_two(alpha) or (beta != 0.0 and not _power_of_two(beta)):
        return None
    others = ([beta] if beta else []) + ([1.0] if spec.epilogue_bias != "none" else [])
    grain = min([alpha] + others)   # every term is a whole multiple of its own scale
    widest_sum = min((2 ** SIGNIFICAND_BITS[spec.types_c] * grain - sum(others)) / alpha,
                     2 ** SIGNIFICAND_BITS[spec.types_acc])
    if widest_sum < MIN_EXACT_SUM:
        return None
    return min(1.0, widest_sum / (8 * math.sqrt(max(k, 1))))


def reference(spec, a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor] = None,
              bias: Optional[torch.Tensor] = None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """D = act(alpha * a @ b + beta * c + bias) (gated: act(gate) * up of both halves of b) computed in `dtype` on
    the inputs' device (not cast to types.c)."""
    return epilogue(spec, torch.matmul(a.to(dtype), b.to(dtype)), c, bias)


def epilogue(spec, product: torch.Tensor, c: Optional[torch.Tensor] = None,
             bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """act(alpha * product + beta * c + bias) in `product`'s dtype; for a gated spec, `product` holds both halves
    (M x 2N) and the result is act(gate) * up."""
    dtype = product.dtype
    if _gated(spec):
        return gate_product(_pre_activation(spec, product, bias), spec.epilogue_gate)
    result = product
    if spec.epilogue_alpha != 1.0:
        result = result * spec.epilogue_alpha
    if spec.epilogue_beta != 0.0:
        result = result + spec.epilogue_beta * c.to(dtype)
    if spec.epilogue_bias == "row":
        result = result + bias.to(dtype)[:, None]
    elif spec.epilogue_bias == "col":
        result = result + bias.to(dtype)
    return activate(result, spec.epilogue_activation)


def _draw(shape: Tuple[int, ...], device, gen, std: float = 1.0, density: Optional[float] = None) -> torch.Tensor:
    """float32 values of `shape`: Normal(0, std), or with `density` integers -1, 0 and 1, nonzero with that
    probability (each sign equally likely)."""
    if density is None:
        return torch.randn(shape, generator=gen, device=device) * std
    signs = torch.randint(0, 2, shape, generator=gen, device=device).float() * 2 - 1
    return signs * (torch.rand(shape, generator=gen, device=device) < density)


def _random(shape: Tuple[int, ...], layout: str, dtype, device, gen, std: float = 1.0,
            density: Optional[float] = None) -> torch.Tensor:
    """`_draw`'s values in `dtype` with logical `shape`; `col` stores the last two dims transposed."""
    if layout == "col":
        stored = (*shape[:-2], shape[-1], shape[-2])
        return _draw(stored, device, gen, std, density).to(dtype).transpose(-1, -2)
    return _draw(shape, device, gen, std, density).to(dtype)


def make_inputs(spec, m: int, n: int, k: int, batch: int, device, gen, density: Optional[float] = None):
    """(a, b, c or None, bias or None, out poisoned with NaN) in the spec's types and layouts; a gated spec's b and
    bias have 2N columns (the gate's, then the up projection's), and b is scaled by 1/sqrt(K) as a layer's weights
    are: act(gate) * up multiplies two K-term sums, whose product of Normal(0, 1) operands (variance K squared)
    overflows f16 somewhere in a large output although the kernel is right. With `density`, every input holds the
    integers -1, 0 and 1 instead (`exact_density`)."""
    lead = (batch,) if batch > 1 else ()
    in_t, out_t = TORCH_DTYPES[spec.types_a], TORCH_DTYPES[spec.types_c]
    gated = _gated(spec)
    b_cols = 2 * n if gated else n
    a = _random((*lead, m, k), spec.layout_a, in_t, device, gen, density=density)
    b = _random((*lead, k, b_cols), spec.layout_b, in_t, device, gen, std=k ** -0.5 if gated else 1.0,
                density=density)
    c = _random((*lead, m, n), spec.layout_c, out_t, device, gen, density=density) \
        if spec.epilogue_beta != 0.0 else None
    bias = None
    if spec.epilogue_bias != "none":
        bias = _draw((m if spec.epilogue_bias == "row" else b_cols,), device, gen, density=density).to(out_t)
    out_stored = (*lead, n, m) if spec.layout_c == "col" else (*lead, m, n)
    out = torch.full(out_stored, float("nan"), dtype=out_t, device=device)
    if spec.layout_c == "col":
        out = out.transpose(-1, -2)
    return a, b, c, bias, out


def _chain_weights(spec, x0, raw, c, bias, dtype, out_t) -> list:
    """The chain's weights (`raw`: K x cols, entries of standard deviation 1/sqrt(K)) in `dtype`; a gated spec's
    scaled per link so that the reference output of the reference chain's input has unit RMS. act(alpha * gate) *
    (alpha * up) is quadratic near 0 and grows quadratically beyond 1: with one fixed scale the values shrank below
    fp16's precision by the fourth link (underflow) or, scaled for unit variance on average, overflowed by the fifth
    on the H200's run, and the check measured the chain's range, not the kernel. A plain epilogue keeps its weights."""
    weights, x = [], x0
    for i, w in enumerate(raw):
        x_in = (torch.neg(x) if i % 2 else x).to(dtype)
        scale = 1.0
        if _gated(spec):
            lo, hi = 0.0, 64.0
            for _ in range(40):   # the output's RMS grows with the weights' scale
                scale = (lo + hi) / 2
                rms = float(reference(spec, x_in, (w * scale).to(dtype), c, bias).pow(2).mean().sqrt())
                lo, hi = (scale, hi) if rms < 1.0 else (lo, scale)
        weights.append((w * scale).to(dtype))
        x = reference(spec, x_in, weights[-1], c, bias).to(out_t)
    return weights


def check_chain(kernel, m: int, n: int, links: int, seed: int = 7) -> dict:
    """A chain of `links` calls at M x n x n where each call's input is the previous call's output (odd links read
    it through torch.neg: a torch kernel between two of l2c's), run eagerly and replayed from a CUDA graph. With
    programmatic dependent launch a kernel starts before the one it follows has finished: a call that touched an
    operand before its predecessor was done would not match the reference on the input it was given, or the replay
    would differ from the eager chain (a gated spec's weights and bias hold 2n columns: the gate's, then the up
    projection's, scaled per link by `_chain_weights`). Returns {"ok", "rel_errors" per link, "tolerance",
    "graph_equal", ...}."""
    spec = kernel.valid.spec
    device = torch.device("cuda")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    dtype, out_t = TORCH_DTYPES[spec.types_a], TORCH_DTYPES[spec.types_c]
    cols = 2 * n if _gated(spec) else n
    x0 = torch.randn(m, n, generator=gen, device=device).to(dtype)
    stored = (cols, n) if spec.layout_b == "col" else (n, cols)   # K x cols in the spec's layout, once transposed
    raw = [torch.randn(stored, generator=gen, device=device) * n ** -0.5 for _ in range(links)]
    raw = [w.t() if spec.layout_b == "col" else w for w in raw]
    c = torch.randn(m, n, generator=gen, device=device).to(out_t) if spec.epilogue_beta != 0.0 else None
    bias = None
    if spec.epilogue_bias != "none":
        bias = torch.randn(m if spec.epilogue_bias == "row" else cols, generator=gen, device=device).to(out_t)
    weights = _chain_weights(spec, x0, raw, c, bias, dtype, out_t)

    def chain():
        inputs, outputs, x = [], [], x0
        for i, w in enumerate(weights):
            x = (torch.neg(x) if i % 2 else x).to(dtype)
            inputs.append(x)
            x = kernel(x, w, c=c, bias=bias)
            outputs.append(x)
        return inputs, outputs

    inputs, outputs = chain()
    torch.cuda.synchronize()
    errors = []
    for x, w, out in zip(inputs, weights, outputs):
        ref = reference(spec, x, w, c, bias)
        errors.append(float((out.double() - ref).norm() / ref.norm()))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, captured = chain()
    graph.replay()
    torch.cuda.synchronize()
    same = all(bool(torch.equal(a, b)) for a, b in zip(outputs, captured))
    tol = tolerance(spec, n)
    return {"m": m, "n": n, "k": n, "links": links, "ok": all(e <= tol for e in errors) and same,
            "rel_errors": errors, "tolerance": tol, "graph_equal": same}


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
    """Check `kernel` (an l2c Kernel) on one problem, and on `edge_shape` of it; see the module docstring.

    Raises MemoryError when the inputs of the problem cannot be allocated (a problem too large, not a failed kernel).
    """
    spec = kernel.valid.spec
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else secrets.randbits(63))
    return with_edge_shape(kernel.valid, m, n, k,
                           lambda m, n, k, allocating: _verify_shape(kernel, m, n, k, batch, device, gen, allocating))


def with_edge_shape(valid, m: int, n: int, k: int, check_shape: Callable[[int, int, int, bool], VerifyResult]
                    ) -> VerifyResult:
    """`check_shape(m, n, k, allocating_calls=True)`, then, if it passed, the same at `edge_shape` of the problem
    (without the allocating calls), whose failure says it is the shape with partial tiles. `valid`: the kernel's
    ValidSpec."""
    result = check_shape(m, n, k, True)
    edge = edge_shape(valid.spec, m, n, k, output_n_step(valid))
    if result.ok and edge is not None:
        again = check_shape(*edge, False)
        if not again.ok:
            return VerifyResult(False, again.rel_error, again.tolerance,
                                f"{again.reason} (at {edge[0]}x{edge[1]}x{edge[2]}, which has partial tiles)")
    return result


def _verify_shape(kernel, m: int, n: int, k: int, batch: int, device: torch.device, gen,
                  allocating_calls: bool) -> VerifyResult:
    spec = kernel.valid.spec
    tol = tolerance(spec, k)
    try:
        a, b, c, bias, out = make_inputs(spec, m, n, k, batch, device, gen)
    except (MemoryError, RuntimeError) as err:   # torch's allocators report failure as RuntimeError
        if isinstance(err, RuntimeError) and "alloc" not in str(err).lower() and "memory" not in str(err).lower():
            raise
        need = memory_needed(spec, m, n, k, batch)
        raise MemoryError(f"cannot allocate the inputs of a {m}x{n}x{k} problem (about {need / 2 ** 30:.3g} GiB "
                          f"to verify it) on {device}") from None
    out, guards = _guarded(out)
    inputs = {name: t for name, t in (("a", a), ("b", b), ("c", c), ("bias", bias)) if t is not None}
    originals = {name: t.clone() for name, t in inputs.items()}
    try:
        returned = kernel(a, b, c=c, bias=bias, out=out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as err:  # noqa: BLE001 - a kernel that raises is a failed candidate
        return VerifyResult(False, math.inf, tol, f"kernel raised {type(err).__name__}: {err}")
    wrote_elsewhere = _wrote_elsewhere(inputs, originals, guards)
    if wrote_elsewhere:
        return VerifyResult(False, math.inf, tol, wrote_elsewhere)
    if returned is not out:
        return VerifyResult(False, math.inf, tol, "kernel did not return the `out` tensor it was given")
    if out.numel() == 0:
        return VerifyResult(True, 0.0, tol)
    if torch.isnan(out).any():
        return VerifyResult(False, math.nan, tol, f"unwritten output (NaN) at element {_first_nan(out)}")

    if device.type == "cuda" and batch * m * n * k > GPU_REFERENCE_MACS:
        dtype, unit, as_ref = torch.float32, UNIT_ROUNDOFF["f32"], lambda t: t.float()
        ops = (a, b, c, bias)
    else:
        dtype, unit, as_ref = torch.float64, 2.0 ** -53, lambda t: t.cpu().double()
        ops = [t.cpu() if t is not None else None for t in (a, b, c, bias)]
    with _exact_fp32_matmul():
        wide_a, wide_b = ops[0].to(dtype), ops[1].to(dtype)
        product = torch.matmul(wide_a, wide_b)
        spread = torch.matmul(wide_a.square(), wide_b.square()).sqrt()
        del wide_a, wide_b
    ref = epilogue(spec, product, ops[2], ops[3])
    bound = element_bound(spec, product, spread, ops[2], ops[3], ref, k, unit)
    del product, spread
    ref_norm = torch.linalg.vector_norm(ref).item()
    bound_norm = torch.linalg.vector_norm(bound).item()

    def check(got: torch.Tensor, what: str) -> VerifyResult:
        diff = as_ref(got) - ref
        excess = diff.abs() / bound
        flat = int(torch.argmax(excess))
        worst = excess.reshape(-1)[flat].item()

        def element() -> str:
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), excess.shape))
            return (f"element {index} is {as_ref(got)[index].item():.6g}, expected {ref[index].item():.6g}: off by "
                    f"{diff[index].abs().item():.3g}, {worst:.3g} times its elementwise bound "
                    f"{bound[index].item():.3g} ({int((excess > 1).sum())} of {excess.numel()} elements over theirs)")
        return verdict(torch.linalg.vector_norm(diff).item(), ref_norm, bound_norm, ref.numel(), spec.types_c, tol,
                       worst, element, what)

    result = check(out, "")
    if result.ok:
        result = _check_padded_operands(kernel, a, b, c, bias, out, tol, check, device) or result
    if result.ok:
        result = _check_exact(kernel, m, n, k, batch, device, gen, tol) or result
    if result.ok and allocating_calls:
        result = _check_nan_rows(kernel, m, n, k, batch, device, gen, tol) or result
    if result.ok and c is None and allocating_calls:
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        result = check_allocating_calls(kernel, a, b, bias, out, tol, check, sync) or result
        wrote_elsewhere = _wrote_elsewhere(inputs, originals, guards)
        if result.ok and wrote_elsewhere:
            return VerifyResult(False, math.inf, tol, wrote_elsewhere + " (the calls allocating their output)")
    return result


def _check_exact(kernel, m: int, n: int, k: int, batch: int, device: torch.device, gen, tol: float
                 ) -> Optional[VerifyResult]:
    """The call again on inputs of -1, 0 and 1 (`exact_density`), where every output of a correct kernel equals the
    reference exactly: the first failure, or None (also where the spec has no such inputs, or there is no memory)."""
    spec = kernel.valid.spec
    density = exact_density(spec, k)
    if density is None:
        return None
    what = " (inputs of -1, 0 and 1, where a correct kernel is exact)"
    inputs = _inputs_if_memory(spec, m, n, k, batch, device, gen, density)
    if inputs is None:
        return None
    a, b, c, bias, out = inputs
    raised = _called(kernel, inputs, device, tol, what)
    if raised is not None:
        return raised
    # integers below 2^24: float32 sums them exactly in any order (no TF32), as float64 does on the CPU
    dtype = torch.float32 if device.type == "cuda" else torch.float64
    with _exact_fp32_matmul():
        ref = reference(spec, a, b, c, bias, dtype=dtype)
    got = out.to(dtype)
    wrong = got != ref   # NaN differs from everything
    count = int(wrong.sum())
    if not count:
        return None
    index = tuple(int(i) for i in torch.nonzero(wrong)[0])
    rel = (torch.linalg.vector_norm(torch.nan_to_num(got - ref, nan=math.inf)) /
           torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()
    return VerifyResult(False, rel, tol, f"{count} of {ref.numel()} outputs are not exact, the first at {index}: "
                        f"{got[index].item():.6g}, expected {ref[index].item():.6g}{what}")


def _check_nan_rows(kernel, m: int, n: int, k: int, batch: int, device: torch.device, gen, tol: float
                    ) -> Optional[VerifyResult]:
    """The call again with one NaN in A: as in torch, exactly that row of the output must be NaN, whatever the
    epilogue (an activation, split-K reduction or gate that drops NaN, as fmaxf does, would hide a diverging model
    behind finite outputs). The first failure, or None (also where there is no memory for the inputs)."""
    inputs = _inputs_if_memory(kernel.valid.spec, m, n, k, batch, device, gen)
    if inputs is None:
        return None
    a, out = inputs[0], inputs[-1]
    row, col = m // 2, k // 3
    where = (batch - 1, row, col) if a.dim() == 3 else (row, col)
    a[where] = float("nan")
    what = f" (a NaN in A at {where}, which torch carries to that whole row of the output)"
    raised = _called(kernel, inputs, device, tol, what)
    if raised is not None:
        return raised
    expected = torch.zeros(out.shape, dtype=torch.bool, device=out.device)
    expected[where[:-1]] = True
    got = torch.isnan(out)
    if torch.equal(got, expected):
        return None
    index = tuple(int(i) for i in torch.nonzero(got != expected)[0])
    state = "NaN" if got[index] else f"{out[index].item():.6g}, not NaN"
    return VerifyResult(False, math.nan, tol, f"{int((got != expected).sum())} of {out.numel()} outputs differ from "
                        f"torch in being NaN, the first at {index}: {state}{what}")


def _inputs_if_memory(spec, m: int, n: int, k: int, batch: int, device: torch.device, gen,
                      density: Optional[float] = None):
    """`make_inputs`, or None where the device has no memory for them (a further check is then not made)."""
    try:
        return make_inputs(spec, m, n, k, batch, device, gen, density=density)
    except (MemoryError, RuntimeError) as err:   # torch's allocators report failure as RuntimeError
        if isinstance(err, RuntimeError) and "alloc" not in str(err).lower() and "memory" not in str(err).lower():
            raise
        return None


def _called(kernel, inputs, device: torch.device, tol: float, what: str) -> Optional[VerifyResult]:
    """The kernel called on (a, b, c, bias, out) and finished: None, or the failure of a kernel that raised."""
    a, b, c, bias, out = inputs
    try:
        kernel(a, b, c=c, bias=bias, out=out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as err:  # noqa: BLE001 - a kernel that raises is a failed candidate
        return VerifyResult(False, math.inf, tol, f"kernel raised {type(err).__name__}: {err}{what}")
    return None


def _padded(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values in a wider buffer of its layout: its leading dimension 16 bytes longer than its contiguous extent,
    as a column slice of a fused weight is (the calls the dispatcher serves with such operands)."""
    pad = max(1, 16 // t.element_size())
    col = t.dim() >= 2 and t.stride(-1) != 1
    stored = t.transpose(-1, -2) if col else t
    wide = torch.empty((*stored.shape[:-1], stored.shape[-1] + pad), dtype=t.dtype, device=t.device)
    inner = wide[..., :stored.shape[-1]]
    inner.copy_(stored)
    return inner.transpose(-1, -2) if col else inner


def _check_padded_operands(kernel, a, b, c, bias, out, tol, check, device) -> Optional[VerifyResult]:
    """The same call with A and B (and C) whose leading dimensions exceed their extents: a kernel that declines such
    operands (ValueError) is not at fault, since the dispatcher then runs torch; one that takes them must give the
    same result. The first failure, or None."""
    if a.dim() != 2:
        return None
    what = " (operands with padded leading dimensions)"
    try:
        padded = [_padded(t) if t is not None else None for t in (a, b, c)]
        again = torch.full_like(out, float("nan"))
    except (MemoryError, RuntimeError):   # no memory for the copies (torch's allocators raise RuntimeError)
        return None
    try:
        kernel(padded[0], padded[1], c=padded[2], bias=bias, out=again)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except ValueError:
        return None
    except Exception as err:  # noqa: BLE001
        return VerifyResult(False, math.inf, tol, f"kernel raised {type(err).__name__}: {err}{what}")
    result = check(again, what)
    return None if result.ok else result


# Elements of NaN on each side of the verified output: a kernel that stores past its output's ends changes them.
# 256 keeps the output's start 512-byte aligned for every output type, as an allocation of its own is.
GUARD_ELEMENTS = 256


def _guarded(out: torch.Tensor):
    """`out` (NaN, dense: its sizes and strides span exactly its elements) carved, with the same sizes and strides,
    from the middle of a NaN buffer with GUARD_ELEMENTS on each side; (out, the two guards)."""
    count = out.numel()
    buffer = torch.full((count + 2 * GUARD_ELEMENTS,), float("nan"), dtype=out.dtype, device=out.device)
    guarded = buffer.as_strided(out.shape, out.stride(), GUARD_ELEMENTS)
    return guarded, (buffer[:GUARD_ELEMENTS], buffer[GUARD_ELEMENTS + count:])


def _wrote_elsewhere(inputs, originals, guards) -> Optional[str]:
    """What a kernel changed besides its output: an operand it was only to read, or memory just outside its output."""
    for name, t in inputs.items():
        if not torch.equal(t, originals[name]):
            return f"kernel wrote to its input `{name}`"
    if not all(torch.isnan(g).all() for g in guards):
        return "kernel wrote outside its output (past its first or last element)"
    return None


def verdict(err_norm: float, ref_norm: float, bound_norm: float, numel: int, types_c: str, tol: float, worst: float,
            element: Callable[[], str], what: str) -> VerifyResult:
    """Both checks judged from their totals: the error's norm against `tol` times the reference's, and the largest
    |out - ref| / bound (`worst`) against 1; `element()` describes the worst output, asked only on failure."""
    rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    if not (math.isfinite(err_norm) and math.isfinite(ref_norm)):
        return VerifyResult(False, rel, tol, f"non-finite output or reference (overflow?){what}")
    # what storing into the output type may lose however exact the kernel is, where values are subnormal there
    out_info = torch.finfo(TORCH_DTYPES[types_c])
    representable = math.sqrt(numel) * out_info.tiny * out_info.eps
    # where the result cancels to far below the terms it sums (a few elements of tiny value), its own norm is no
    # scale for rounding: a hundredth of what the elementwise bounds allow in all is (a thousandth failed a correct
    # f16-accumulating kernel whose one output, -1.1e-3, was off by 2.8e-5: 0.65% of its bound). Where the result
    # does not cancel this adds at most a few percent of the relative tolerance.
    cancellation = 1e-2 * bound_norm
    norm_ok = err_norm <= tol * ref_norm + representable + cancellation
    if norm_ok and worst <= 1:
        return VerifyResult(True, rel, tol)
    if not norm_ok:
        return VerifyResult(False, rel, tol, f"relative error {rel:.3g} exceeds tolerance {tol:.3g}; worst "
                                             f"{element()}{what}")
    return VerifyResult(False, rel, tol, f"{element()}{what}")


def check_allocating_calls(kernel, a, b, bias, out: torch.Tensor, tol: float, check, sync) -> Optional[VerifyResult]:
    """The path eager callers take: the kernel allocates its output. Twice, because a second call of a signature
    may take a different path than the first (a replayed launch plan). Each output must match `out`'s shape,
    strides and dtype and pass `check(output, what)`; the first failure, or None."""
    for attempt in ("first", "second"):
        what = f" (the {attempt} call allocating its output)"
        try:
            fresh = kernel(a, b, bias=bias)
            sync()
        except Exception as err:  # noqa: BLE001
            return VerifyResult(False, math.inf, tol, f"kernel raised {type(err).__name__}: {err}{what}")
        if (tuple(fresh.shape), fresh.stride(), fresh.dtype) != (tuple(out.shape), out.stride(), out.dtype):
            return VerifyResult(False, math.inf, tol, f"output of shape {tuple(fresh.shape)}, strides "
                                f"{fresh.stride()} and {fresh.dtype}; expected {tuple(out.shape)}, "
                                f"{out.stride()} and {out.dtype}{what}")
        again = check(fresh, what)
        if not again.ok:
            return again
    return None


def _first_nan(out: torch.Tensor) -> Tuple[int, ...]:
    return tuple(int(i) for i in torch.nonzero(torch.isnan(out))[0])
