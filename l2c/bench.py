"""`l2c bench`: measure kernels against torch.matmul on a shape set and write one JSON line per result.

Candidates come from `.l2` spec files (every kernel in the file, for each target it validates for), from
tuned tables (docs/CONTRACTS.md; each entry measured on its own shape), `torch` (torch.matmul against
itself: the noise floor of the protocol), or what users call: `dispatch[:TABLE]` (`l2c.matmul` through a
dispatcher with that table, the shipped one by default) and `linear[:TABLE]` (`l2c.nn.Linear`'s path, the
weight being B transposed). Those two are measured after the dispatcher has prepared the call's kernel, as a
warmed-up process meets it, and each row says what served the call (`served_by`). A shape-generic spec
(`problem m=any ...`) is built once and measured on every shape of the set; a spec with fixed dims only on its own
shape. Candidates and the plan are `l2c.candidates`; the file format is `l2c.results_file`.

Each (kernel, shape) is verified before it is timed; a failure is recorded, never timed. The results
file starts with an environment row (`"type": "env"`); then one `"type": "result"` row per
shape x kernel x protocol, written and flushed as it completes, so an interrupted run loses nothing and
`resume=True` skips the rows already there.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Set, TextIO, Tuple

from .candidates import Candidate
from .results_file import ResultsWriter, row_key
from .shapes import Shape, bucket

FAILED = ("invalid", "build_failed", "verify_failed", "error")


# --------------------------------------------------------------------------------------------- progress

class Progress:
    """Shapes done, elapsed and ETA on stderr, at most every `every` seconds. The ETA weighs each shape
    by a fixed cost plus its FLOPs (large shapes take longer), which is only an estimate."""

    def __init__(self, shapes: List[Shape], out: Optional[TextIO] = None, every: float = 2.0):
        self.weights = {s.key: 1.0 + s.flops / 2e12 for s in shapes}
        self.total_w = sum(self.weights.values())
        self.total, self.done, self.done_w = len(shapes), 0, 0.0
        self.out, self.every = out or sys.stderr, every   # stderr when called, not when imported
        self.start = time.monotonic()
        self.last = -math.inf

    def step(self, shape: Shape, force: bool = False) -> None:
        self.done += 1
        self.done_w += self.weights[shape.key]
        now = time.monotonic()
        if force or now - self.last >= self.every or self.done == self.total:
            self.last = now
            elapsed = now - self.start
            frac = self.done_w / self.total_w if self.total_w else 1.0
            eta = elapsed * (1 - frac) / frac if frac > 0 else float("nan")
            print(f"l2c bench: {self.done}/{self.total} shapes ({100 * self.done / self.total:.0f}%), "
                  f"elapsed {_hms(elapsed)}, ETA {_hms(eta)} (last {shape})", file=self.out, flush=True)


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


# --------------------------------------------------------------------------------------------- running

@dataclass
class Settings:
    protocols: List[str]
    reps: int = 10
    iters: int = 20
    warmup: int = 3
    rate: float = 100.0
    seed: int = 0
    graphs: bool = True
    rotate: bool = True
    warmup_s: float = 0.0
    roofline: bool = False    # cold operands (each call reads them from HBM) and each row's fraction of roofline

    def as_dict(self) -> Dict[str, object]:
        return dict(self.__dict__)


def _base_row(cand: Candidate, shape: Shape, protocol: str, device) -> Dict[str, object]:
    spec = cand.spec
    row = {
        "type": "result", "kernel": cand.id, "name": cand.name, "source": cand.source, "target": cand.target,
        "m": shape.m, "n": shape.n, "k": shape.k, "batch": shape.batch, "shape_label": shape.label,
        "flops": shape.flops, "bucket": bucket(shape.flops), "protocol": protocol, "device": device.kind,
        "dtype": spec.types_a if spec is not None else "f16",
        "layout": f"{spec.layout_a},{spec.layout_b},{spec.layout_c}" if spec is not None else "row,row,row",
    }
    if cand.build_id:
        row["build_id"] = cand.build_id
    if spec is not None and cand.target in ("triton", "cutlass") and not str(cand.source).endswith((".l2", ".json")):
        row["spec"] = spec.to_l2()    # a generated candidate: no file holds its text (l2c table reads it here)
    return row


def _problem(cand: Candidate, shape: Shape):
    from .measure import Problem
    if cand.spec is None:
        return Problem(shape.m, shape.n, shape.k, shape.batch)
    return Problem.from_spec(cand.spec, shape.m, shape.n, shape.k, shape.batch)


def _verify(cand: Candidate, shape: Shape, device, seed: int) -> Tuple[Optional[str], Dict[str, object]]:
    """(failure status or None, fields for the row). Any exception while verifying is a failure."""
    if cand.target == "torch":
        return None, {"verified": "baseline"}
    kernel = cand.kernel()
    if cand.failure is not None:
        return cand.failure[0], {"reason": cand.failure[1]}
    served = {}
    if hasattr(kernel, "prime"):
        served = {"served_by": kernel.prime(shape, device)}
    from .verify import verify
    try:
        res = verify(kernel, shape.m, shape.n, shape.k, batch=shape.batch, device=device.torch_device.type,
                     seed=seed)
    except Exception as err:  # noqa: BLE001 - e.g. a CUTLASS kernel refusing an unaligned shape
        return "verify_failed", {"reason": f"{type(err).__name__}: {err}"}
    fields = {"rel_error": _num(getattr(res, "rel_error", None)), "tolerance": _num(getattr(res, "tolerance", None)),
              **served}
    if not res.ok:
        fields["reason"] = getattr(res, "reason", "") or "verification failed"
        return "verify_failed", fields
    fields["verified"] = True
    return None, fields


def _num(x):
    """A float for JSON, None when missing or not finite (the row's `reason` says why)."""
    return float(x) if x is not None and math.isfinite(float(x)) else None


def run_bench(candidates: List[Candidate], shapes: List[Shape], jobs: Dict, device, settings: Settings,
              writer: ResultsWriter, progress: Optional[Progress] = None, log: Optional[TextIO] = None,
              ceilings=None) -> int:
    """Measure every planned (shape, candidate, protocol) not yet in the file; return rows written. With
    `ceilings` (roofline.Ceilings of this run), `kernel` rows carry their fraction of roofline."""
    from .measure import TorchLinear, TorchMatmul, measure
    from .roofline import roofline_fields
    log = log or sys.stderr

    written = 0
    for shape in shapes:
        worked = False
        for cand in jobs[shape.key]:
            todo = pending(cand, shape, settings.protocols, writer.done)
            if not todo:
                continue
            worked = True
            if cand.failure is not None:
                status, extra = cand.failure[0], {"reason": cand.failure[1]}
            else:
                status, extra = _verify(cand, shape, device, settings.seed)
            problem = _problem(cand, shape)
            baseline = (TorchLinear if getattr(cand._kernel, "torch_baseline", "") == "linear" else TorchMatmul)(problem)
            fn = baseline if cand.target == "torch" else cand.kernel()
            for protocol in todo:
                row = _base_row(cand, shape, protocol, device)
                row.update(extra)
                if status is None:
                    try:
                        timing = measure(protocol, fn, baseline, problem, device, reps=settings.reps,
                                         iters=settings.iters, warmup=settings.warmup, rate=settings.rate,
                                         seed=settings.seed, graphs=settings.graphs, rotate=settings.rotate,
                                         cold=settings.roofline)
                        row.update(status="ok", **timing.as_row())
                        if ceilings is not None and protocol == "kernel":
                            row.update(roofline_fields(problem, timing, ceilings))
                    except Exception as err:  # noqa: BLE001 - recorded; a long run goes on
                        if type(err).__name__ == "OutOfMemoryError":
                            _empty_cache(device)
                        row.update(status="error", reason=f"{type(err).__name__}: {err}")
                        print(f"l2c bench: {cand.id} on {shape} ({protocol}): {row['reason']}", file=log)
                else:
                    row["status"] = status
                writer.write(row)
                writer.done.add(row_key(row))
                written += 1
        if progress is not None and worked:
            progress.step(shape)
    return written


def pending(cand: Candidate, shape: Shape, protocols: List[str], done: Set[Tuple]) -> List[str]:
    """The protocols of (candidate, shape) that have no row yet."""
    return [p for p in protocols if (cand.id, shape.m, shape.n, shape.k, shape.batch, p) not in done]


def remaining_shapes(shapes: List[Shape], jobs: Dict, protocols: List[str], done: Set[Tuple]) -> List[Shape]:
    return [s for s in shapes if any(pending(c, s, protocols, done) for c in jobs[s.key])]


def _empty_cache(device) -> None:
    if device.kind == "cuda":
        import torch
        torch.cuda.empty_cache()
