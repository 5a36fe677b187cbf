"""Online choice for shapes no table covers (`L2C_TUNE=online`, opt-in, like PyTorch's TunableOp).

The first eager call of a new signature runs torch and hands the shape to the preparation worker, which builds
a few candidate kernels, verifies each at that shape against the reference, times the verified ones against
torch in the `kernel` protocol within a small budget, and reports the fastest if it beat torch by the margin
(`L2C_TUNE_MARGIN`, default 1.05: the spread of two timings of one kernel on the H200). The decision — a kernel
or "torch" — is persisted per GPU, driver and l2c version in the user cache directory, so later processes reuse
it and a new GPU, driver or l2c starts afresh. Nothing is tuned inside a CUDA-graph capture or torch.compile
tracing: those calls run what is already decided.

Candidates are kernels for the memory-bound regime, where cuBLAS leaves the most behind: the GEMV family up to
8 rows and 16-row tensor-core tiles up to 16, with split-K sized for the shape; above 16 rows, the table's own
shape-generic kernels for the same dtype and layouts. They are the configurations that ranked best in the
`serve` sweep on the H200 (benchmarks/NOTES.md).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

from . import settings
from . import cache
from .arch import ARCHS

SMS = ARCHS["sm_90"].sm_count
DEFAULT_MARGIN = 1.05
BUDGET_S = 2.0
# (tile n, tile k, warps, reduce, waves of programs over the SMs): the best GEMV configurations per row count
GEMV_BEST = {1: ((8, 256, 2, "end", 4), (8, 256, 4, "end", 4), (8, 128, 4, "end", 4), (8, 256, 2, "step", 4)),
             2: ((8, 256, 2, "end", 4), (8, 128, 2, "end", 4), (8, 256, 2, "step", 4)),
             4: ((8, 128, 2, "end", 4), (8, 256, 2, "step", 4)),
             8: ((8, 128, 4, "end", 4),)}
# (tile n, tile k, stages) of 16-row tensor-core tiles
GEMM_16 = ((64, 64, 6), (64, 128, 4), (128, 64, 4))


def margin() -> float:
    value = settings.value("L2C_TUNE_MARGIN") or ""
    try:
        return float(value) if value else DEFAULT_MARGIN
    except ValueError:
        return DEFAULT_MARGIN


def split_for(tiles: int, k: int, tile_k: int, waves: int) -> int:
    """The split-K count that gives `waves` waves of programs on the SMs, each slice at least two K tiles."""
    split = 1
    while tiles * split < waves * SMS and k // (2 * split * tile_k) >= 2 and split < 32:
        split *= 2
    return split


def _text(dtype: str, layout: str, body: str) -> str:
    la, lb, lc = layout.split(",")
    return (f"kernel online {{\n  target triton\n  problem m=any n=any k=any\n  types a={dtype} b={dtype} c={dtype} "
            f"acc=f32\n  layout a={la} b={lb} c={lc}\n  {body}\n  swizzle group=1\n}}\n")


def candidate_specs(dtype: str, layout: str, m: int, n: int, k: int, table=None) -> List[str]:
    """Spec texts worth timing for one call shape (module docstring), each named by its knobs."""
    from .errors import L2Error
    from .ir import config_name
    from .parser import parse_one
    from .validate import validate
    bodies = []
    if m <= 8:
        rows = 1 << max(0, (m - 1).bit_length())
        for bn, bk, warps, reduce, waves in GEMV_BEST[rows]:
            split = split_for(math.ceil(n / bn), k, bk, waves)
            bodies.append(f"launch family=gemv warps={warps} evict=first reduce={reduce}\n  tile m={rows} n={bn} "
                          f"k={bk}\n  split_k slices={split} mode=workspace")
    if 4 <= m <= 16:
        for bn, bk, stages in GEMM_16:
            split = split_for(math.ceil(m / 16) * math.ceil(n / bn), k, bk, 4)
            bodies.append(f"launch warps=4 evict=first\n  tile m=16 n={bn} k={bk}\n  pipeline stages={stages}\n"
                          f"  split_k slices={split} mode=workspace")
    texts = [_text(dtype, layout, body) for body in bodies]
    if m > 16 and table is not None:
        generic = [e for key, e in table.exact.items() if key[0] == dtype and key[1] == layout
                   and e.target == "triton" and "m=any n=any k=any" in e.spec_text]
        texts += [e.spec_text for e in sorted(generic, key=lambda e: -e.speedup)[:4]]
    out = []
    for text in dict.fromkeys(texts):
        try:
            spec = parse_one(text)
            spec = spec.replace(name=config_name(spec))
            validate(spec, spec.target, "sm_90")
            out.append(spec.to_l2())
        except L2Error:
            continue
    return out


class Decisions:
    """The persisted online decisions of one (GPU, driver, l2c version): signature -> spec text or None (torch)."""

    def __init__(self, gpu: str, driver: str, version: Optional[str] = None):
        self.records = cache.KeyedRecords.of_gpu("online", "decisions", gpu, driver, version)

    @property
    def entries(self) -> Dict[str, Optional[dict]]:
        return self.records.entries  # type: ignore[return-value]

    @staticmethod
    def signature(dtype: str, layout: str, m: int, n: int, k: int, bias: bool, activation: str) -> str:
        return f"{dtype}:{layout}:{m}x{n}x{k}:bias={int(bias)}:{activation}"

    def get(self, signature: str):
        """(decided, spec text or None)."""
        if signature not in self.entries:
            return False, None
        entry = self.entries[signature]
        return True, (entry or {}).get("spec")

    def record(self, signature: str, spec: Optional[str], speedup: Optional[float]) -> None:
        """Persist one decision; concurrent processes merge theirs under the file lock."""
        self.records.put(signature, {"spec": spec, "speedup": speedup})


def tune_one(candidates: List[str], m: int, n: int, k: int, bias: bool, activation: str, device_kind: str,
             budget_s: float = BUDGET_S) -> Tuple[Optional[str], Optional[float], str]:
    """What the worker does for an online job: (winning spec text or None, its speedup, a note). Each candidate
    is built, verified at the shape, then timed against torch; a candidate that fails is skipped."""
    import time

    from .build import build
    from .errors import BuildError, L2Error
    from .measure import Problem, TorchMatmul, measure_kernel
    from .devices import get_device
    from .parser import parse_one
    from .validate import validate
    from .verify import verify
    device = get_device(device_kind)
    deadline = time.monotonic() + budget_s
    best, best_speedup, tried = None, 0.0, 0
    for text in candidates:
        if time.monotonic() > deadline:
            break
        spec = parse_one(text).replace(epilogue_bias="col" if bias else "none", epilogue_activation=activation)
        try:
            kernel = build(validate(spec, spec.target, "sm_90"))
        except (L2Error, BuildError):
            continue
        if not verify(kernel, m, n, k, device=device.torch_device.type).ok:
            continue
        problem = Problem.from_spec(spec, m, n, k)
        timing = measure_kernel(kernel, TorchMatmul(problem), problem, device, reps=5, warmup=2,
                                target_rep_s=2e-4, cold=True)
        tried += 1
        if timing.speedup > best_speedup:
            best, best_speedup = spec.to_l2(), timing.speedup
    if best is not None and best_speedup >= margin():
        return best, best_speedup, f"{tried} timed"
    return None, (best_speedup or None), f"{tried} timed; none beat torch by {margin()}x"
