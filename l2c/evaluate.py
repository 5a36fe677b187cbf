"""The one evaluation pipeline: verify a built kernel at a shape, then time it against torch under each protocol.

`l2c bench` (one JSON row per protocol) and the tuner's runners (one store result) both call `evaluate`, so a
figure means the same wherever it was taken: the kernel passed the same check on fresh random inputs first, any
exception while checking is a failed verification (a verdict on the kernel), and any exception while timing is an
`error` (a fault of the run, such as running out of memory, not of the kernel).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from .measure import Problem, Timing, measure


@dataclass
class Evaluation:
    """What came of evaluating one kernel at one shape."""
    status: Optional[str]                 # None: verified (or a baseline); else verify_failed
    reason: str = ""
    rel_error: Optional[float] = None
    tolerance: Optional[float] = None
    timings: Dict[str, Timing] = field(default_factory=dict)     # protocol -> timing, for those that ran
    errors: Dict[str, str] = field(default_factory=dict)         # protocol -> why timing it failed

    def fields(self) -> Dict[str, object]:
        """The verification's JSON fields of a results row."""
        out: Dict[str, object] = {"rel_error": _num(self.rel_error), "tolerance": _num(self.tolerance)}
        if self.status is None and self.rel_error is not None:
            out["verified"] = True
        if self.reason:
            out["reason"] = self.reason
        return out


def _num(x):
    """A float for JSON, None when missing or not finite (the row's `reason` says why)."""
    return float(x) if x is not None and math.isfinite(float(x)) else None


def check(kernel, m: int, n: int, k: int, batch: int, device_kind: str, seed: Optional[int]) -> Evaluation:
    """Verify `kernel` at (m, n, k, batch) on fresh random inputs (l2c.verify); never raises."""
    from .verify import verify
    try:
        res = verify(kernel, m, n, k, batch=batch, device=device_kind, seed=seed)
    except Exception as err:  # noqa: BLE001 - e.g. a CUTLASS kernel refusing an unaligned shape
        return Evaluation("verify_failed", reason=f"{type(err).__name__}: {err}")
    if not res.ok:
        return Evaluation("verify_failed", reason=res.reason or f"relative error {res.rel_error:.3g} exceeds "
                                                                f"tolerance {res.tolerance:.3g}",
                          rel_error=res.rel_error, tolerance=res.tolerance)
    return Evaluation(None, rel_error=res.rel_error, tolerance=res.tolerance)


def evaluate(kernel, baseline, problem: Problem, protocols: Sequence[str], device, *, verified: bool = False,
             seed: Optional[int] = 0, on_error=None, **options) -> Evaluation:
    """Verify `kernel` at `problem`'s shape (unless `verified`: a baseline, or checked already), then time it
    against `baseline` under each protocol (`options`: measure.measure's keywords). `on_error(exception)` is
    called when a timing raises (to free memory, say) before the next protocol runs."""
    if verified:
        result = Evaluation(None)
    else:
        result = check(kernel, problem.m, problem.n, problem.k, problem.batch, device.torch_device.type, seed)
        if result.status is not None:
            return result
    for protocol in protocols:
        try:
            result.timings[protocol] = measure(protocol, kernel, baseline, problem, device,
                                               seed=0 if seed is None else seed, **options)
        except Exception as err:  # noqa: BLE001 - recorded; the other protocols and a long run go on
            result.errors[protocol] = f"{type(err).__name__}: {err}"
            if on_error is not None:
                on_error(err)
    return result


__all__: List[str] = ["Evaluation", "check", "evaluate"]
