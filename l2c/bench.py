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
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, List, Optional, Set, TextIO, Tuple

from .candidates import Candidate
from .results_file import ResultsWriter, row_key
from .shapes import Shape, bucket

FAILED = ("invalid", "build_failed", "verify_failed", "error", "not_served")


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

# The settings that change what a row measures (not only how precisely): rows of one file must share them.
SAME_METHOD = ("graphs", "rotate", "roofline")


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


def _problem_kind(cand: Candidate) -> Tuple[str, str]:
    """(dtype, layouts) of the problem a candidate is measured on (a row's `dtype` and `layout`)."""
    spec = cand.spec
    if spec is None:
        return "f16", "row,row,row"
    return spec.types_a, f"{spec.layout_a},{spec.layout_b},{spec.layout_c}"


def _base_row(cand: Candidate, shape: Shape, protocol: str, device) -> Dict[str, object]:
    spec = cand.spec
    dtype, layout = _problem_kind(cand)
    row = {
        "type": "result", "kernel": cand.id, "name": cand.name, "source": cand.source, "target": cand.target,
        "m": shape.m, "n": shape.n, "k": shape.k, "batch": shape.batch, "shape_label": shape.label,
        "flops": shape.flops, "bucket": bucket(shape.flops), "protocol": protocol, "device": device.kind,
        "dtype": dtype, "layout": layout,
    }
    if cand.build_id:
        row["build_id"] = cand.build_id
    if cand.table_served is not None:
        row["table_served"] = cand.table_served
    if spec is not None and spec.epilogue_gate != "none":   # a gated problem: B has 2N columns, twice the FLOPs
        row.update(gate=spec.epilogue_gate, flops=2 * shape.flops, bucket=bucket(2 * shape.flops))
    if spec is not None and cand.target in ("triton", "cutlass"):
        row["spec"] = spec.to_l2()    # the row stands alone: the file a spec came from may be gone or changed since
    return row


def _problem(cand: Candidate, shape: Shape):
    from .measure import Problem
    if cand.spec is None:
        return Problem(shape.m, shape.n, shape.k, shape.batch)
    return Problem.from_spec(cand.spec, shape.m, shape.n, shape.k, shape.batch)


def _prepared(cand: Candidate, shape: Shape, device):
    """(the function to time, a failure (status, fields) or None, fields every row of this pair carries)."""
    if cand.failure is not None:
        return None, (cand.failure[0], {"reason": cand.failure[1]}), {}
    if cand.target == "torch":
        return None, None, {"verified": "baseline"}
    kernel = cand.kernel()
    if cand.failure is not None:
        return None, (cand.failure[0], {"reason": cand.failure[1]}), {}
    try:   # a dispatcher candidate's first calls (e.g. no device memory for a large weight): an error row
        if cand.serves is None:
            served = kernel.prime(shape, device) if hasattr(kernel, "prime") else {}
            return kernel, None, served
        with _warnings_logged(("l2c.dispatch", "l2c.prepare")) as reasons:
            served = kernel.prime(shape, device)
    except Exception as err:  # noqa: BLE001 - recorded; the other shapes and candidates go on
        _freed(err, device)
        return None, ("error", {"reason": f"{type(err).__name__}: {err}"}), {}
    if served["served_by"] == "torch":   # a `serving:` kernel torch stood in for: its row times torch against torch
        from .parser import parse_one
        return None, ("not_served", {
            "reason": "; ".join(reasons) or "the dispatcher did not serve the kernel here (torch ran the call)",
            "served_by": "torch", "served_spec": cand.serves, "served_target": parse_one(cand.serves).target}), {}
    return kernel, None, served


@contextmanager
def _warnings_logged(loggers):
    """The messages of the warnings these loggers emit inside the block (a list filled as they come)."""
    import logging

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    messages, handler = [], Collect(logging.WARNING)
    for name in loggers:
        logging.getLogger(name).addHandler(handler)
    try:
        yield messages
    finally:
        for name in loggers:
            logging.getLogger(name).removeHandler(handler)


def run_bench(candidates: List[Candidate], shapes: List[Shape], jobs: Dict, device, settings: Settings,
              writer: ResultsWriter, progress: Optional[Progress] = None, log: Optional[TextIO] = None,
              ceilings=None) -> int:
    """Measure every planned (shape, candidate, protocol) not yet in the file; return rows written. With
    `ceilings` (roofline.Ceilings of this run), `kernel` rows carry their fraction of roofline."""
    from .evaluate import evaluate
    from .measure import TorchLinear, TorchMatmul
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
            problem = _problem(cand, shape)
            baseline = (TorchLinear if getattr(cand._kernel, "torch_baseline", "") == "linear" else TorchMatmul)(problem)
            kernel, failure, extra = _prepared(cand, shape, device)
            if failure is not None and failure[0] in ("not_served", "error"):   # kept in the row, told here too
                print(f"l2c bench: {cand.id} {failure[0].replace('_', ' ')} at {shape}: {failure[1]['reason']}",
                      file=log)
            result = None
            if failure is None:
                result = evaluate(baseline if kernel is None else kernel, baseline, problem, todo, device,
                                  verified=kernel is None, seed=settings.seed, on_error=lambda err: _freed(err, device),
                                  reps=settings.reps, iters=settings.iters, warmup=settings.warmup,
                                  rate=settings.rate, graphs=settings.graphs, rotate=settings.rotate,
                                  cold=settings.roofline)
                if kernel is not None:
                    extra = {**result.fields(), **extra}
            for protocol in todo:
                row = _base_row(cand, shape, protocol, device)
                row.update(extra)
                if failure is not None:
                    row.update(failure[1], status=failure[0])
                elif result.status is not None:
                    row["status"] = result.status
                elif protocol in result.timings:
                    timing = result.timings[protocol]
                    row.update(status="ok", **timing.as_row())
                    if ceilings is not None and protocol == "kernel":
                        row.update(roofline_fields(problem, timing, ceilings))
                else:
                    row.update(status="error", reason=result.errors[protocol])
                    print(f"l2c bench: {cand.id} on {shape} ({protocol}): {row['reason']}", file=log)
                writer.write(row)
                writer.done.add(row_key(row))
                written += 1
        if progress is not None and worked:
            progress.step(shape)
    return written


def pending(cand: Candidate, shape: Shape, protocols: List[str], done: Set[Tuple]) -> List[str]:
    """The protocols of (candidate, shape) that have no row yet."""
    dtype, layout = _problem_kind(cand)
    gate = cand.spec.epilogue_gate if cand.spec is not None else "none"
    return [p for p in protocols
            if (cand.id, shape.m, shape.n, shape.k, shape.batch, p, dtype, layout, gate) not in done]


def remaining_shapes(shapes: List[Shape], jobs: Dict, protocols: List[str], done: Set[Tuple]) -> List[Shape]:
    return [s for s in shapes if any(pending(c, s, protocols, done) for c in jobs[s.key])]


def _freed(err: Exception, device) -> None:
    """After a timing ran out of device memory, hand the cached blocks back before the next one."""
    if type(err).__name__ == "OutOfMemoryError" and device.kind == "cuda":
        import torch
        torch.cuda.empty_cache()
