"""An analytic GEMM cost MODEL of an H200 — not a measurement.

Used only where no GPU is at hand: the sample-efficiency test and the CPU demo of `l2c tune
--runner model`. It gives the searchers a reward with the structure real GEMM tuning has, so that
"does the policy transfer across shapes" can be asked on a CPU. Every figure it produces is labelled
`model` in the results; the same harness runs against measured outcomes on the GPU.

The model, per kernel (times in seconds):
- tiles = ceil(M/tile_m) * ceil(N/tile_n) * split_k slices * batch, run in waves over 132 SMs (rounded
  to whole clusters); the last partial wave costs a full wave (tail effect), except under stream-K,
  which spreads the work evenly;
- one tile's time = its FLOPs / (per-SM peak x efficiency) + a fixed prologue/epilogue cost; efficiency
  is the product of: tile arithmetic intensity (tile_m*tile_n/(tile_m+tile_n), shared-memory bandwidth
  bound), the main-loop step (small tile_k pays loop overhead), pipeline depth (latency hiding), the
  warp count against the accumulator size (Triton), the target (CUTLASS wgmma vs Triton), the schedule;
- DRAM traffic = A re-read once per column of tiles and B once per row of tiles, divided by the L2 reuse
  that swizzle groups and cluster multicast buy (or just A + B once if both fit in L2), plus C;
- split-K adds fp32 partial traffic (workspace: a second pass and launch; atomic: slower atomics);
- time = max(compute, memory) + launch; the "cuBLAS" baseline is the best of a small fixed menu of
  CUTLASS configurations (no split-K), slowed 3% for heuristic misses.
"""
from __future__ import annotations

import hashlib
import math
from typing import Optional

from ..arch import ARCHS
from ..ir import KernelSpec
from ..knobs import DTYPE_BYTES
from ..rules import ValidSpec
from ..validate import validate
from .space import Problem

SMS = ARCHS["sm_90"].sm_count
PEAK_FLOPS = ARCHS["sm_90"].peak_flops
DRAM_BW = ARCHS["sm_90"].hbm_bytes_per_s     # bytes/s
L2_BYTES = 50e6             # usable of the 60 MB L2
LAUNCH_S = 4e-6
TILE_FIXED_S = 0.5e-6       # per-tile prologue + epilogue


def _efficiency(v: ValidSpec) -> float:
    s = v.spec
    intensity = s.tile_m * s.tile_n / (s.tile_m + s.tile_n)
    eff = intensity / (intensity + 36.0)
    eff *= s.tile_k / (s.tile_k + 12.0)
    eff *= 1.0 - 0.6 / (1.0 + v.stages) ** 1.5
    if v.target == "triton":
        eff *= 0.88
        ideal_warps = min(8, max(4, s.tile_m * s.tile_n // 2048))
        eff *= 0.9 ** abs(math.log2(v.warps / ideal_warps))
    else:
        if v.schedule == "pingpong" and s.tile_m == 64:
            eff *= 1.05
        if v.schedule == "cooperative" and s.tile_m == 256:
            eff *= 1.04
    if s.tile_m < 64:       # a warpgroup MMA is 64 rows: smaller tiles waste the tensor cores
        eff *= s.tile_m / 64.0
    return min(eff, 0.95)


def model_time(v: ValidSpec, p: Problem) -> float:
    """Modelled seconds for one call of the kernel `v` on problem `p`."""
    s = v.spec
    bpe, cbytes = DTYPE_BYTES[p.dtype], DTYPE_BYTES[p.dtype]
    slices = 1 if s.split_k_mode == "stream_k" else s.split_k_slices
    tiles_m, tiles_n = -(-p.m // s.tile_m), -(-p.n // s.tile_n)
    tiles = tiles_m * tiles_n * slices * p.batch
    cluster = s.cluster_m * s.cluster_n if v.target == "cutlass" else 1
    sms = SMS // cluster * cluster
    k_per = -(-p.k // slices)
    tile_flops = 2.0 * s.tile_m * s.tile_n * (-(-k_per // s.tile_k) * s.tile_k)
    fixed = TILE_FIXED_S * (0.5 if (s.launch_persistent == "yes" or v.target == "cutlass") else 1.0)
    tile_s = tile_flops / (PEAK_FLOPS[p.dtype] / SMS * _efficiency(v)) + fixed
    if s.split_k_mode == "stream_k":
        waves = tiles / sms * 1.04 + 0.1     # even split, small fix-up
    else:
        waves = math.ceil(tiles / sms)
    compute = waves * tile_s

    a_bytes, b_bytes = p.m * p.k * bpe * p.batch, p.k * p.n * bpe * p.batch
    if a_bytes + b_bytes <= L2_BYTES:
        traffic = a_bytes + b_bytes
    else:
        reuse = min(s.swizzle_group * 2 * cluster, 32)
        if (s.swizzle_raster == "m") != (p.m >= p.n):   # walk along the longer side for L2 reuse
            reuse = max(1, reuse // 2)
        traffic = (a_bytes * tiles_n + b_bytes * tiles_m) / reuse
        traffic = max(traffic, a_bytes + b_bytes)
    traffic += p.m * p.n * cbytes * p.batch
    extra = 0.0
    if s.split_k_mode == "workspace" and slices > 1:
        extra = 2 * p.m * p.n * 4 * slices * p.batch / DRAM_BW + LAUNCH_S
    elif s.split_k_mode == "atomic" and slices > 1:
        extra = p.m * p.n * 4 * slices * p.batch / (DRAM_BW / 3)
    return max(compute, traffic / DRAM_BW) + LAUNCH_S + extra


_BASELINE_MENU = ((128, 128, 64), (128, 256, 64), (256, 128, 64), (64, 128, 64), (64, 64, 64), (64, 256, 64))


def baseline_time(p: Problem) -> float:
    """The model's stand-in for cuBLAS: best of a fixed menu of CUTLASS configurations, 3% slack."""
    best = math.inf
    for tm, tn, tk in _BASELINE_MENU:
        spec = KernelSpec(target="cutlass", problem_m=p.m, problem_n=p.n, problem_k=p.k, problem_batch=p.batch,
                          types_a=p.dtype, types_b=p.dtype, types_c=p.dtype, tile_m=tm, tile_n=tn, tile_k=tk,
                          layout_a=p.layout_a, layout_b=p.layout_b, layout_c=p.layout_c)
        try:
            best = min(best, model_time(validate(spec, "cutlass", p.arch), p))
        except Exception:   # a menu entry this problem cannot use (alignment): cuBLAS would not pick it
            continue
    if best == math.inf:   # unaligned problem: a generic SIMT-class fallback
        best = p.flops() / (0.3 * PEAK_FLOPS[p.dtype]) + LAUNCH_S
    return best * 1.03


def noise(spec_text: str, p: Problem, sigma: float, seed: int = 0) -> float:
    """Deterministic multiplicative measurement noise (same spec and problem -> same factor)."""
    if sigma <= 0:
        return 1.0
    h = hashlib.sha256(f"{seed}|{p.key()}|{spec_text}".encode()).digest()
    u1 = (int.from_bytes(h[:8], "big") + 1) / 2.0 ** 64
    u2 = int.from_bytes(h[8:16], "big") / 2.0 ** 64
    z = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
    return math.exp(sigma * z)


def model_speedup(v: ValidSpec, p: Problem, sigma: float = 0.0, seed: int = 0) -> float:
    t = model_time(v, p) * noise(v.spec.to_l2(), p, sigma, seed)
    return baseline_time(p) / t


def flops_per_s(p: Problem, seconds: Optional[float]) -> Optional[float]:
    return None if not seconds else p.flops() / seconds
