"""Online choice for shapes no table covers (`L2C_TUNE=online`, opt-in, like PyTorch's TunableOp).

The first eager call of a new signature runs torch and hands the shape to the preparation worker, which builds
a few candidate kernels, verifies each at that shape against the reference, times the verified ones against
torch in the `kernel` protocol within a small budget, and reports the fastest if it beat torch by the margin
(`L2C_TUNE_MARGIN`, default 1.05: the spread of two timings of one kernel on the H200). The decision — a kernel
or "torch" — is persisted per GPU, driver and l2c code (`cache.code_identity`) in the user cache directory, so later processes reuse
it and a new GPU, driver or l2c starts afresh. Nothing is tuned inside a CUDA-graph capture or torch.compile
tracing: those calls run what is already decided.

Candidates, in the order they are timed: the kernels of the table's entries measured nearest the shape (same
dtype and layouts; nearest in log M + log N + log K, a range or cell at no distance from what it holds), each
only where its build runs no compiler (a CUTLASS library in the build cache or the prebuilt pack). Only targets
named by `L2C_TUNE_TARGETS` are timed: by default CUTLASS alone, whose served calls the C++ call table launches.
A Triton kernel launches from Python, dearer than torch.matmul's own call: on the H200 such choices won device time
and lost eager calls (sessions 26 and 28, benchmarks/NOTES.md). With `triton` named too, the table's Triton kernels
come after its prebuilt ones (Triton compiles each at its first launch, about a second, so the budget usually ends
among them), then, for the memory-bound regime, the Triton GEMV family up to 8 rows and 16-row tensor-core tiles up
to 16, with split-K sized for the shape (the configurations that ranked best in the `serve` sweep on the H200).
"""
from __future__ import annotations

import functools
import math
from typing import Dict, List, NamedTuple, Optional, Tuple

from . import settings
from . import cache
from .arch import ARCHS

SMS = ARCHS["sm_90"].sm_count
DEFAULT_MARGIN = 1.05
DEFAULT_EAGER_MARGIN = 1.0
BUDGET_S = 2.0
NEAREST = 6   # the table's kernels nearest the shape that are timed
EAGER_ITERS = 20   # synchronized calls a side that a winning Triton candidate's eager call is timed with
ONLINE_NAME = "online"   # l2c's own candidates, before each is named by its knobs
# (tile n, tile k, warps, reduce, waves of programs over the SMs): the best GEMV configurations per row count
GEMV_BEST = {1: ((8, 256, 2, "end", 4), (8, 256, 4, "end", 4), (8, 128, 4, "end", 4), (8, 256, 2, "step", 4)),
             2: ((8, 256, 2, "end", 4), (8, 128, 2, "end", 4), (8, 256, 2, "step", 4)),
             4: ((8, 128, 2, "end", 4), (8, 256, 2, "step", 4)),
             8: ((8, 128, 4, "end", 4),)}
# (tile n, tile k, stages) of 16-row tensor-core tiles
GEMM_16 = ((64, 64, 6), (64, 128, 4), (128, 64, 4))


def _ratio(name: str, default: float) -> float:
    """The speed ratio `name` sets (unset or empty: `default`); ValueError unless a finite number >= 0 (below 1 it
    lets a kernel slower than torch serve: for tests on the CPU interpreter, never for use)."""
    text = settings.value(name) or ""
    try:
        value = float(text) if text else default
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise ValueError(f"{name}={text!r}: expected a finite number >= 0 (how many times faster than torch)")
    return value


def margin() -> float:
    """How much faster than torch a choice's device time must be (`L2C_TUNE_MARGIN`)."""
    return _ratio("L2C_TUNE_MARGIN", DEFAULT_MARGIN)


def eager_margin() -> float:
    """How much faster than torch a Triton choice's eager call must be (`L2C_TUNE_EAGER_MARGIN`)."""
    return _ratio("L2C_TUNE_EAGER_MARGIN", DEFAULT_EAGER_MARGIN)


def tuned_targets() -> Tuple[str, ...]:
    """The targets whose kernels online choice times (`L2C_TUNE_TARGETS`, default `cutlass`)."""
    from .knobs import TARGETS
    names = tuple(t.strip() for t in (settings.value("L2C_TUNE_TARGETS") or "cutlass").split(",") if t.strip())
    unknown = [t for t in names if t not in TARGETS]
    if unknown or not names:
        raise ValueError(f"L2C_TUNE_TARGETS={settings.value('L2C_TUNE_TARGETS')!r}: expected a comma-separated list "
                         f"of {', '.join(sorted(TARGETS))}")
    return names


def split_for(tiles: int, k: int, tile_k: int, waves: int) -> int:
    """The split-K count that gives `waves` waves of programs on the SMs, each slice at least two K tiles."""
    split = 1
    while tiles * split < waves * SMS and k // (2 * split * tile_k) >= 2 and split < 32:
        split *= 2
    return split


def _text(dtype: str, layout: str, body: str) -> str:
    la, lb, lc = layout.split(",")
    return (f"kernel {ONLINE_NAME} {{\n  target triton\n  problem m=any n=any k=any\n  types a={dtype} b={dtype} "
            f"c={dtype} acc=f32\n  layout a={la} b={lb} c={lc}\n  {body}\n  swizzle group=1\n}}\n")


def _gap(x: int, lo: int, hi: int) -> float:
    return 0.0 if lo <= x <= hi else min(abs(math.log(x / lo)), abs(math.log(x / hi)))


def distance(entry, m: int, n: int, k: int) -> float:
    """How far the shapes a table entry was measured on lie from (m, n, k): |log| ratios summed over M, N and K,
    nothing along an axis its range or cell covers."""
    m_lo, m_hi = (entry.m_lo, entry.m_hi) if entry.serves_range else (entry.m, entry.m)
    n_lo, n_hi, k_lo, k_hi = ((entry.n_lo, entry.n_hi, entry.k_lo, entry.k_hi) if entry.serves_cell
                              else (entry.n, entry.n, entry.k, entry.k))
    return _gap(m, m_lo, m_hi) + _gap(n, n_lo, n_hi) + _gap(k, k_lo, k_hi)


def nearest_kernels(table, dtype: str, layout: str, m: int, n: int, k: int, count: int = NEAREST,
                    targets: Optional[Tuple[str, ...]] = None) -> List[str]:
    """Spec texts of the `count` distinct kernels (shape-generic, plain epilogue) of the table's plain entries for
    this dtype and layouts (and of `targets`, where given) measured nearest (m, n, k); on a tie the larger measured
    speedup first."""
    from .errors import L2Error
    from .tuned_table import served_entries
    entries = [e for e in served_entries(table) if e.gate == "none" and e.batch == 1 and e.dtype == dtype
               and e.layout == layout and (targets is None or e.target in targets)]
    entries.sort(key=lambda e: (distance(e, m, n, k), -e.speedup))
    out: List[str] = []
    for spec_text, target in dict.fromkeys((e.spec_text, e.target) for e in entries):   # many share a kernel
        try:
            text = _generic(spec_text, target)
        except L2Error:
            continue
        if text not in out:
            out.append(text)
            if len(out) == count:
                break
    return out


@functools.lru_cache(maxsize=4096)
def _generic(spec_text: str, target: str) -> str:
    """A table entry's kernel for its target, as a spec generic in M, N and K with the plain epilogue (parsed once
    per process)."""
    from .knobs import ANY
    from .parser import parse_one
    spec = parse_one(spec_text, file="<tuned table>")
    return spec.replace(target=target, problem_m=ANY, problem_n=ANY, problem_k=ANY, epilogue_alpha=1.0,
                        epilogue_beta=0.0, types_c=spec.types_a, epilogue_bias="none",
                        epilogue_activation="none").to_l2()


def candidate_specs(dtype: str, layout: str, m: int, n: int, k: int, table=None,
                    targets: Optional[Tuple[str, ...]] = None) -> List[str]:
    """Spec texts worth timing for one call shape, in the order to time them (module docstring): the table's nearest
    kernels of `targets` (default `tuned_targets()`), the Triton ones last among them, then, where Triton is one of
    them, l2c's Triton GEMV and 16-row candidates (named by their knobs)."""
    targets = tuned_targets() if targets is None else targets
    nearest = nearest_kernels(table, dtype, layout, m, n, k, targets=targets) if table is not None else []
    texts = [t for t in nearest if "target   triton" not in t] + [t for t in nearest if "target   triton" in t]
    if "triton" in targets:
        texts += _triton_decoding_candidates(dtype, layout, m, n, k)
    checked = (_checked(text) for text in dict.fromkeys(texts))
    return [text for text in checked if text is not None]


def _triton_decoding_candidates(dtype: str, layout: str, m: int, n: int, k: int) -> List[str]:
    """l2c's Triton candidates of few rows: the GEMV family up to 8 rows, 16-row tensor-core tiles from 4 to 16."""
    texts: List[str] = []
    if m <= 8:
        rows = 1 << max(0, (m - 1).bit_length())
        for bn, bk, warps, reduce, waves in GEMV_BEST[rows]:
            split = split_for(math.ceil(n / bn), k, bk, waves)
            body = (f"launch family=gemv warps={warps} evict=first reduce={reduce}\n  tile m={rows} n={bn} k={bk}\n"
                    f"  split_k slices={split} mode=workspace")
            texts.append(_text(dtype, layout, body))
    if 4 <= m <= 16:
        for bn, bk, stages in GEMM_16:
            split = split_for(math.ceil(m / 16) * math.ceil(n / bn), k, bk, 4)
            body = (f"launch warps=4 evict=first\n  tile m=16 n={bn} k={bk}\n  pipeline stages={stages}\n"
                    f"  split_k slices={split} mode=workspace")
            texts.append(_text(dtype, layout, body))
    return texts


@functools.lru_cache(maxsize=4096)
def _checked(text: str) -> Optional[str]:
    """A candidate's canonical text if it validates for sm_90, else None; l2c's own candidates are named by their
    knobs, a table's kernels keep their names."""
    from .errors import L2Error
    from .ir import config_name
    from .parser import parse_one
    from .validate import validate
    try:
        spec = parse_one(text)
        if spec.name == ONLINE_NAME:
            spec = spec.replace(name=config_name(spec))
        validate(spec, spec.target, "sm_90")
        return spec.to_l2()
    except L2Error:
        return None


def decision_settings(table=None) -> Dict[str, object]:
    """What a decision depends on beside the GPU, driver and l2c code: the margins it was judged by, the targets
    timed, the table whose kernels were the candidates (its file's digest), and torch's version with its CUDA
    (the baseline it was timed against: another cuBLAS may be faster)."""
    from pathlib import Path

    import torch
    source = getattr(table, "source", None)
    try:
        table_digest = cache.content_hash(Path(source).read_text(errors="replace"))[:16] if source else None
    except OSError:   # a table made in memory ("<memory>"): its name
        table_digest = source
    return {"margin": margin(), "eager_margin": eager_margin(), "targets": list(tuned_targets()),
            "table": table_digest, "torch": torch.__version__, "torch_cuda": torch.version.cuda}


class Decisions:
    """The persisted online decisions of one (GPU, driver, l2c code) and `settings` (`decision_settings`): signature
    -> spec text or None (torch)."""

    def __init__(self, gpu: str, driver: str, version: Optional[str] = None, **settings: object):
        self.records = cache.KeyedRecords.of_gpu("online", "decisions", gpu, driver, version, **settings)

    @property
    def entries(self) -> Dict[str, Optional[dict]]:
        return self.records.entries  # type: ignore[return-value]

    @staticmethod
    def signature(dtype: str, layout: str, m: int, n: int, k: int, bias: bool, activation: str) -> str:
        return f"{dtype}:{layout}:{m}x{n}x{k}:bias={int(bias)}:{activation}"

    @staticmethod
    def fits(spec_text: str, dtype: str, layout: str, bias: bool, activation: str) -> bool:
        """Whether a decided kernel computes the calls of its signature: their dtype and layouts, the epilogue
        online choice gives them (alpha 1, no C input, the output in the inputs' type, their bias and activation).
        A record that does not (edited, copied from elsewhere) is no decision."""
        from .errors import L2Error
        from .parser import parse_one
        try:
            spec = parse_one(spec_text, file="<online decision>")
        except L2Error:
            return False
        return (spec.types_a == spec.types_b == spec.types_c == dtype
                and f"{spec.layout_a},{spec.layout_b},{spec.layout_c}" == layout
                and spec.epilogue_alpha == 1.0 and spec.epilogue_beta == 0.0 and spec.epilogue_gate == "none"
                and spec.epilogue_bias == ("col" if bias else "none") and spec.epilogue_activation == activation)

    def get(self, signature: str):
        """(decided, spec text or None)."""
        if signature not in self.entries:
            return False, None
        entry = self.entries[signature]
        return True, (entry or {}).get("spec")

    def record(self, signature: str, spec: Optional[str], speedup: Optional[float]) -> None:
        """Persist one decision; concurrent processes merge theirs under the file lock."""
        self.records.put(signature, {"spec": spec, "speedup": speedup})


class OnlineChoice(NamedTuple):
    """What online tuning decided for one shape, and what it measured on the way."""
    spec: Optional[str]          # the winning spec text, or None: torch serves
    speedup: Optional[float]     # the winner's (or, with none, the best candidate's) device-time speedup over torch
    note: str
    timings: Dict[str, float]    # spec text -> speedup of each candidate timed (twice from the margin on: the lower)
    timed: int = 0               # candidates timed: none (every one skipped or failed) is no evidence for torch


def tune_one(candidates: List[str], m: int, n: int, k: int, bias: bool, activation: str, device_kind: str,
             budget_s: float = BUDGET_S) -> OnlineChoice:
    """What the worker does for an online job (`OnlineChoice`: the winner, and every candidate's timing, which
    `l2c bench` records as evidence for `l2c table --near`; a Triton candidate that lost its eager call has none).
    Each candidate is built, verified at the shape, then timed against torch, twice where the first timing beat the
    margin (the lower speedup counts); a candidate that fails is skipped, and so is one
    whose build would run a compiler other than Triton's JIT (a CUTLASS kernel neither cached nor prebuilt).
    A Triton candidate that would win must also not lose an eager call (`call` protocol, `EAGER_ITERS` synchronized
    calls a side, against `eager_margin`): its launch is Python's, dearer than torch.matmul's, where a CUTLASS
    kernel's eager call goes through the C++ call table, leaner than torch's; the default table asks the same of its
    entries."""
    import time

    from . import targets
    from .build import build
    from .errors import BuildError, L2Error
    from .measure import Problem, TorchMatmul, measure_call, measure_kernel
    from .devices import get_device
    from .parser import parse_one
    from .validate import validate
    from .verify import verify
    device = get_device(device_kind)
    deadline = time.monotonic() + budget_s
    best, best_speedup, tried, lost_eager, timings = None, 0.0, 0, 0, {}
    for text in candidates:
        if time.monotonic() > deadline:
            break
        spec = parse_one(text).with_epilogue("col" if bias else "none", activation)
        try:
            valid = validate(spec, spec.target, "sm_90")
            if spec.target != "triton" and not targets.get(spec.target).built(valid):
                continue
            kernel = build(valid)
        except (L2Error, BuildError):
            continue
        if not verify(kernel, m, n, k, device=device.torch_device.type).ok:
            continue
        problem = Problem.from_spec(spec, m, n, k)

        def speedup() -> float:
            return measure_kernel(kernel, TorchMatmul(problem), problem, device, reps=5, warmup=2,
                                  target_rep_s=2e-4, cold=True).speedup
        measured = speedup()
        tried += 1
        if measured >= margin():
            measured = min(measured, speedup())   # timed twice: one lucky timing must not serve it, nor be evidence
        if measured > best_speedup and measured >= margin() and spec.target == "triton" and \
                measure_call(kernel, TorchMatmul(problem), problem, device, iters=EAGER_ITERS,
                             warmup=2).speedup < eager_margin():
            lost_eager += 1
            continue
        rendered = spec.to_l2()
        timings[rendered] = measured
        if measured > best_speedup:
            best, best_speedup = rendered, measured
    note = f"{tried} timed" + (f", {lost_eager} lost an eager call" if lost_eager else "")
    if best is not None and best_speedup >= margin():
        return OnlineChoice(best, best_speedup, note, timings, tried)
    return OnlineChoice(None, best_speedup or None, f"{note}; none beat torch by {margin()}x", timings, tried)
