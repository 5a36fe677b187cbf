"""Measurement protocols: time a candidate and torch.matmul side by side, in one process, on the same inputs.

Protocols (../shared/BENCHMARKING.md):

- ``kernel``: device time per launch with a warm L2: many back-to-back launches replayed from a CUDA
  graph (or, where capture fails, launched eagerly) between two CUDA events, median over repetitions.
  For shapes whose operands fit in L2 the launches rotate over enough buffer sets to exceed twice the
  L2 size, so cache residency does not flatter either side.
- ``kernel_apart``: ``kernel`` with a torch kernel (a one-element add) launched before every timed launch, the
  spacers' own time (timed alone in the same repetition) taken off: device time where the kernel before each GEMM
  is not the GEMM itself, so a launch overlapped with its predecessor (programmatic dependent launch) gains only what
  it would after another library's kernel.
- ``call``: what an eager PyTorch user sees: synchronize, host clock, one call (output allocated by the
  call), synchronize; candidate and baseline in random order each iteration on freshly drawn inputs, each
  side first in half the iterations; the per-shape figure is the mean TFLOPS over iterations.
- ``server``: ``call`` with an exponentially distributed idle gap (default 100 calls/s) before every call.

Every protocol warms both sides up first and never times the warm-up. Both sides are called through
the same Kernel call convention (docs/CONTRACTS.md), so whatever a call launches (split-K reductions,
workspace clears, epilogue kernels) is timed on both sides.

The clock, synchronization and sleep go through a device of `l2c.devices` (CUDA events on the GPU; the host
clock on CPU, where figures say nothing about performance); the roofline lives in `l2c.roofline`.
"""
from __future__ import annotations

import math
import random
import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .epilogue import activate, gate_product, torch_gated, torch_gated_linear
from .results_file import PROTOCOLS

TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}

# A kernel per the contract: fn(a, b, c=None, bias=None, out=None) -> Tensor.
KernelFn = Callable[..., torch.Tensor]


# --------------------------------------------------------------------------------------------- problems

@dataclass(frozen=True)
class Problem:
    """What one measurement multiplies: dims, element types, layouts and the epilogue both sides compute."""
    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "f16"          # A and B
    out_dtype: str = "f16"      # C/D
    layout_a: str = "row"
    layout_b: str = "row"
    layout_c: str = "row"
    alpha: float = 1.0
    beta: float = 0.0
    bias: str = "none"          # none | row | col
    activation: str = "none"
    tf32: bool = True           # f32 inputs multiplied on tf32 tensor cores (both sides)
    gate: str = "none"          # gated epilogue (epilogue gate): B is K x 2N, D = act(A@B_gate) * (A@B_up)

    @classmethod
    def from_spec(cls, spec, m: int, n: int, k: int, batch: int = 1) -> "Problem":
        return cls(m, n, k, batch, dtype=spec.types_a, out_dtype=spec.types_c, layout_a=spec.layout_a,
                   layout_b=spec.layout_b, layout_c=spec.layout_c, alpha=float(spec.epilogue_alpha),
                   beta=float(spec.epilogue_beta), bias=spec.epilogue_bias,
                   activation=spec.epilogue_activation, tf32=spec.types_math == "tf32", gate=spec.epilogue_gate)

    @property
    def b_cols(self) -> int:
        """Columns of B: N, or 2N for a gated problem (the gate's, then the up projection's)."""
        return 2 * self.n if self.gate != "none" else self.n

    @property
    def flops(self) -> int:
        return 2 * self.m * self.b_cols * self.k * self.batch

    @property
    def plain(self) -> bool:
        return (self.alpha == 1.0 and self.beta == 0.0 and self.bias == "none" and self.activation == "none"
                and self.out_dtype == self.dtype and self.gate == "none")

    def footprint_bytes(self) -> int:
        """Bytes one call touches: A, B, D (and C, bias)."""
        ab = TORCH_DTYPES[self.dtype].itemsize
        cb = TORCH_DTYPES[self.out_dtype].itemsize
        mn = self.m * self.n
        total = (self.m * self.k + self.k * self.b_cols) * ab + mn * cb * (2 if self.beta != 0.0 else 1)
        total *= self.batch
        if self.bias != "none":
            total += (self.m if self.bias == "row" else self.b_cols) * cb
        return total


@dataclass
class Operands:
    a: torch.Tensor
    b: torch.Tensor
    out: torch.Tensor
    c: Optional[torch.Tensor] = None
    bias: Optional[torch.Tensor] = None

    def call(self, fn: KernelFn, with_out: bool = True) -> torch.Tensor:
        return fn(self.a, self.b, c=self.c, bias=self.bias, out=self.out if with_out else None)

    def refill(self, gen: torch.Generator) -> None:
        """Fresh normal random values in place (never zeros: zeros run faster)."""
        for t in (self.a, self.b, self.c, self.bias):
            if t is not None:
                t.normal_(generator=gen)


_ALIGN_ELEMS = 128  # each rotated buffer starts 256-byte aligned for 2-byte types (TMA needs 16)


def _matrices(count: int, rows: int, cols: int, batch: int, layout: str, dtype: torch.dtype,
              device: torch.device) -> List[torch.Tensor]:
    """`count` (batch x) rows x cols matrices in `layout`, carved from one flat buffer."""
    numel = batch * rows * cols
    stride = -(-numel // _ALIGN_ELEMS) * _ALIGN_ELEMS
    flat = torch.empty(count * stride, dtype=dtype, device=device)
    views = []
    for i in range(count):
        chunk = flat[i * stride: i * stride + numel]
        if layout == "row":
            t = chunk.view(batch, rows, cols)
        else:
            t = chunk.view(batch, cols, rows).transpose(-1, -2)
        views.append(t if batch > 1 else t[0])
    return views


def make_operands(problem: Problem, device, count: int = 1, seed: int = 0) -> List[Operands]:
    """`count` independent operand sets with normal random inputs, in the problem's layouts and types."""
    p, dev = problem, device.torch_device
    ab, cb = TORCH_DTYPES[p.dtype], TORCH_DTYPES[p.out_dtype]
    a = _matrices(count, p.m, p.k, p.batch, p.layout_a, ab, dev)
    b = _matrices(count, p.k, p.b_cols, p.batch, p.layout_b, ab, dev)
    out = _matrices(count, p.m, p.n, p.batch, p.layout_c, cb, dev)
    c = _matrices(count, p.m, p.n, p.batch, p.layout_c, cb, dev) if p.beta != 0.0 else [None] * count
    if p.bias != "none":
        blen = p.m if p.bias == "row" else p.b_cols
        bias = list(torch.empty(count, blen, dtype=cb, device=dev).unbind(0))
    else:
        bias = [None] * count
    sets = [Operands(a[i], b[i], out[i], c[i], bias[i]) for i in range(count)]
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    for s in sets:
        s.refill(gen)
        s.out.fill_(float("nan"))
    return sets


class TorchMatmul:
    """The baseline: torch.matmul (cuBLAS), plus the spec's epilogue as an eager PyTorch user writes it.

    Follows the Kernel call convention so that it is timed exactly like a candidate. A plain GEMM is one
    `torch.matmul` (into `out` when given; a column-major `out` is computed as (B^T A^T)^T, which is the
    same cuBLAS call). A column bias uses `torch.addmm` (cuBLASLt fuses it); anything else is composed of
    in-place torch ops after the matmul.
    """

    def __init__(self, problem: Problem):
        self.p = problem
        self.out_dtype = TORCH_DTYPES[problem.out_dtype]

    def __call__(self, a, b, c=None, bias=None, out=None):
        p = self.p
        if p.gate != "none" and p.alpha == 1.0:   # as an MLP module (and the dispatcher's fallback) runs it
            return self._store(torch_gated(a, b, bias, p.gate), out)
        if p.plain:
            if out is None:
                return torch.matmul(a, b)
            if p.layout_c == "row":
                return torch.matmul(a, b, out=out)
            torch.matmul(b.mT, a.mT, out=out.mT)
            return out
        if (p.bias == "col" and p.beta == 0.0 and p.batch == 1 and p.out_dtype == p.dtype):
            y = torch.addmm(bias, a, b, alpha=p.alpha)
        else:
            y = torch.matmul(a, b)
            if p.alpha != 1.0:
                y.mul_(p.alpha)
            if p.beta != 0.0:
                y.add_(c.to(y.dtype), alpha=p.beta)
            if p.bias == "row":
                y.add_(bias.to(y.dtype).unsqueeze(-1))
            elif p.bias == "col":
                y.add_(bias.to(y.dtype))
        return self._finish(y, out)

    def _finish(self, y, out):
        """The activation as an eager user applies it after the GEMM (gated: act of the gate's half times the up
        projection's), then the result into `out` or returned."""
        p = self.p
        if p.gate != "none":
            y = gate_product(y, p.gate)
        if p.activation == "relu":
            y.relu_()   # in place, as an eager user would
        else:
            y = activate(y, p.activation)
        return self._store(y, out)

    def _store(self, y, out):
        if out is not None:
            out.copy_(y)
            return out
        return y if y.dtype == self.out_dtype else y.to(self.out_dtype)


class TorchLinear(TorchMatmul):
    """The baseline of `torch.nn.Linear` users: `F.linear(x, weight, bias)` with weight = B transposed (one cuBLAS
    call, the bias fused), then the activation, as an eager nn.Linear plus activation runs it."""

    def __call__(self, a, b, c=None, bias=None, out=None):
        p = self.p
        if p.beta != 0.0 or p.alpha != 1.0 or p.batch != 1 or p.bias == "row":
            return super().__call__(a, b, c=c, bias=bias, out=out)
        if p.gate != "none":
            return self._store(torch_gated_linear(a, b.mT, bias, p.gate), out)
        return self._finish(torch.nn.functional.linear(a, b.mT, bias), out)


@contextmanager
def _matmul_precision(problem: Problem):
    """Let torch use tf32 for f32 inputs exactly when the spec does (`types math=tf32`)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = problem.tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


# --------------------------------------------------------------------------------------------- results

@dataclass
class Timing:
    """Per-shape outcome of one protocol.

    `speedup` is the headline ratio (> 1: candidate faster): for `kernel` the median over repetitions of
    baseline / candidate within each repetition (`paired_speedup`); for `call` and `server`
    candidate_tflops / baseline_tflops of the per-iteration means.
    `*_s` are per call: the median device time (`kernel`) or the mean host time (`call`, `server`).
    `*_samples` are the timed samples in seconds per call (warm-up excluded), `order` the side timed
    first in each iteration ("candidate" or "baseline").
    """
    protocol: str
    flops: int
    candidate_s: float
    baseline_s: float
    candidate_tflops: float
    baseline_tflops: float
    speedup: float
    candidate_samples: List[float] = field(repr=False)
    baseline_samples: List[float] = field(repr=False)
    order: List[str] = field(repr=False)
    details: Dict[str, object] = field(default_factory=dict)

    def as_row(self) -> Dict[str, object]:
        """JSON-ready fields for a results row (samples rounded to ns)."""
        return {
            "candidate_s": self.candidate_s, "baseline_s": self.baseline_s,
            "candidate_tflops": self.candidate_tflops, "baseline_tflops": self.baseline_tflops,
            "speedup": self.speedup, "iterations": len(self.candidate_samples),
            "candidate_samples_s": [round(s, 9) for s in self.candidate_samples],
            "baseline_samples_s": [round(s, 9) for s in self.baseline_samples],
            **self.details,
        }


def _tflops(flops: int, seconds: float) -> float:
    return flops / seconds / 1e12 if seconds > 0 else float("inf")


SIDES = ("candidate", "baseline")


# --------------------------------------------------------------------------------------------- protocols

def balanced_orders(rng: random.Random, count: int) -> List[Tuple[str, str]]:
    """The order of the two sides in each of `count` repetitions: each side first in half of them (one more for the
    candidate when `count` is odd), the repetitions shuffled. On the H200 the side that runs first after fresh
    inputs is 5-10% slower in `call` on small shapes; a plain shuffle per repetition put the candidate first in 8 of
    10 (seed 0, the same for every shape), which read as a 3-5% loss of any candidate against torch."""
    firsts = [SIDES[i % 2] for i in range(count)]
    rng.shuffle(firsts)
    return [(first, SIDES[1] if first == SIDES[0] else SIDES[0]) for first in firsts]


def paired_speedup(candidate: List[float], baseline: List[float]) -> float:
    """The median over repetitions of baseline / candidate, each repetition's two sides timed back to back.

    The GPU's clocks drift between repetitions (on multi-millisecond launches the H200 moves between two speeds
    about 12% apart), and a ratio of per-side medians can then pair one side's fast samples with the other's
    slow ones: torch measured 0.90x against itself on 5768x28672x8192. A ratio within a repetition sees both
    sides at one clock."""
    ratios = [b / c if c > 0 else float("inf") for c, b in zip(candidate, baseline)]
    return statistics.median(ratios)


def rotation_sets(problem: Problem, l2_bytes: int, cold: bool, max_sets: int = 4096) -> int:
    """How many operand sets a `kernel` measurement rotates over. Warm: enough to exceed twice the L2, for
    shapes that would otherwise fit in it. Cold (memory-bound shapes): at least two sets, and enough that
    between two uses of a set three L2s' worth of other operands are read, so every call reads its weight
    from HBM."""
    if l2_bytes <= 0:
        return 1
    footprint = max(1, problem.footprint_bytes())
    if cold:
        return max(2, min(max_sets, 1 + math.ceil(3 * l2_bytes / footprint)))
    return max(1, min(max_sets, math.ceil(2 * l2_bytes / footprint)))


def measure_kernel(candidate: KernelFn, baseline: KernelFn, problem: Problem, device, *, reps: int = 10,
                   warmup: int = 3, target_rep_s: float = 1e-3, max_launches: int = 4096, rotate: bool = True,
                   graphs: bool = True, seed: int = 0, rng: Optional[random.Random] = None,
                   cold: bool = False, apart: bool = False) -> Timing:
    """Median device time per launch over `reps` interleaved repetitions of back-to-back launches; with `apart`
    (the `kernel_apart` protocol) each launch follows a spacer (torch's one-element add), and each repetition's
    batch of spacers alone is taken off both sides' times.

    A candidate whose `writes_out` is False (what users call: it allocates its result) is timed allocating, and
    so is the baseline. A kernel that writes into `out` is timed so; torch writes into it only where its op takes
    `out=` (a plain GEMM), and otherwise allocates its result, as an eager user's epilogue does (copying into `out`
    would add a pass over the output to torch's side alone)."""
    rng = rng or random.Random(seed)
    sets_n = rotation_sets(problem, device.l2_bytes, cold, max_launches) if rotate else 1
    sets = make_operands(problem, device, sets_n, seed)
    fns = {"candidate": candidate, "baseline": baseline}
    with_out = getattr(candidate, "writes_out", True)
    outs = {"candidate": with_out, "baseline": with_out and problem.plain}
    with _matmul_precision(problem):
        for _ in range(warmup):
            for name in SIDES:
                sets[0].call(fns[name], outs[name])
        device.synchronize()
        one = max(device.time_runner(lambda f=fns[name], o=outs[name]: sets[0].call(f, o)) for name in SIDES)
        launches = max(sets_n, min(max_launches, math.ceil(target_rep_s / max(one, 1e-7))))

        spacer = torch.zeros(1, device=device.torch_device) if apart else None

        def runner(fn, with_out):
            def run():
                for i in range(launches):
                    if apart:
                        spacer.add_(1)
                    sets[i % sets_n].call(fn, with_out)
            return run

        def spacers():
            for _ in range(launches):
                spacer.add_(1)

        runners = {name: runner(fns[name], outs[name]) for name in SIDES}
        if apart:
            runners["spacers"] = spacers
        batches, method = device.prepare(runners, graphs=graphs)
        for name in batches:        # one untimed pass of each batch (graph upload, caches, clocks)
            device.time_runner(batches[name])
        samples: Dict[str, List[float]] = {name: [] for name in SIDES}
        spacer_samples: List[float] = []
        order: List[str] = []
        for names in balanced_orders(rng, reps):
            order.append(names[0])
            times = {name: device.time_runner(batches[name]) for name in names}
            taken_off = device.time_runner(batches["spacers"]) if apart else 0.0
            spacer_samples.append(taken_off / launches)
            for name in names:   # a floor of 1 ns: a spacer timed slower than a pair says nothing of the GEMM
                samples[name].append(max(times[name] - taken_off, 1e-9 * launches) / launches)
    cand, base = statistics.median(samples["candidate"]), statistics.median(samples["baseline"])
    details = {"method": method, "launches_per_rep": launches, "buffer_sets": sets_n}
    if apart:
        details["spacer_s"] = statistics.median(spacer_samples)
    return Timing("kernel_apart" if apart else "kernel", problem.flops, cand, base, _tflops(problem.flops, cand),
                  _tflops(problem.flops, base), paired_speedup(samples["candidate"], samples["baseline"]),
                  samples["candidate"], samples["baseline"], order, details)


def measure_call(candidate: KernelFn, baseline: KernelFn, problem: Problem, device, *, iters: int = 20,
                 warmup: int = 3, rate: Optional[float] = None, seed: int = 0,
                 rng: Optional[random.Random] = None) -> Timing:
    """Synchronized host-clock time of single calls on fresh inputs per iteration, the sides in a balanced random
    order (each first in half the iterations: `balanced_orders`).

    With `rate` (calls per second), an idle gap drawn from Exp(rate) precedes every call: the `server`
    protocol.
    """
    rng = rng or random.Random(seed)
    x = make_operands(problem, device, 1, seed)[0]
    gen = torch.Generator(device=device.torch_device)
    gen.manual_seed(seed + 1)
    fns = {"candidate": candidate, "baseline": baseline}
    samples: Dict[str, List[float]] = {name: [] for name in SIDES}
    order: List[str] = []
    gaps: List[float] = []
    with _matmul_precision(problem):
        for _ in range(warmup):
            for name in SIDES:
                x.call(fns[name], with_out=False)
        device.synchronize()
        for names in balanced_orders(rng, iters):
            x.refill(gen)
            order.append(names[0])
            for name in names:
                device.synchronize()
                if rate:
                    gap = rng.expovariate(rate)
                    gaps.append(gap)
                    device.sleep(gap)
                t0 = device.clock()
                x.call(fns[name], with_out=False)
                device.synchronize()
                samples[name].append(device.clock() - t0)
    flops = problem.flops
    cand_tf = statistics.fmean(_tflops(flops, t) for t in samples["candidate"])
    base_tf = statistics.fmean(_tflops(flops, t) for t in samples["baseline"])
    details: Dict[str, object] = {}
    if rate:
        details = {"rate_per_s": rate, "mean_gap_s": statistics.fmean(gaps)}
    return Timing("server" if rate else "call", flops, statistics.fmean(samples["candidate"]),
                  statistics.fmean(samples["baseline"]), cand_tf, base_tf, cand_tf / base_tf,
                  samples["candidate"], samples["baseline"], order, details)


def measure(protocol: str, candidate: KernelFn, baseline: KernelFn, problem: Problem, device, *,
            reps: int = 10, iters: int = 20, warmup: int = 3, rate: float = 100.0, seed: int = 0,
            graphs: bool = True, rotate: bool = True, cold: bool = False) -> Timing:
    """Run one protocol by name (kernel, kernel_apart, call, server)."""
    if protocol in ("kernel", "kernel_apart"):
        return measure_kernel(candidate, baseline, problem, device, reps=reps, warmup=warmup, seed=seed,
                              graphs=graphs, rotate=rotate, cold=cold, apart=protocol == "kernel_apart")
    if protocol == "call":
        return measure_call(candidate, baseline, problem, device, iters=iters, warmup=warmup, seed=seed)
    if protocol == "server":
        return measure_call(candidate, baseline, problem, device, iters=iters, warmup=warmup, seed=seed,
                            rate=rate)
    raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
