"""The tune's one status line: trials done, best speedup so far, where the time went (building against
measuring, so a user sees whether a tune is compiler-bound), elapsed; rewritten in place on a terminal."""
from __future__ import annotations

import math
import sys
import time
from typing import Sequence, Tuple

import optuna

from .study import best_of, counted_trials


def time_spent(studies: Sequence[optuna.Study]) -> Tuple[float, float, int]:
    """(build seconds, measure seconds, trials timed) over the studies' evaluated trials (user attrs `build_s`,
    `measure_s`, which the trial loop sets: read from the studies' storage, so worker processes' trials count)."""
    build = measure = 0.0
    timed = 0
    for s in studies:
        for t in counted_trials(s):
            if "measure_s" in t.user_attrs:
                build += float(t.user_attrs.get("build_s", 0.0))
                measure += float(t.user_attrs["measure_s"])
                timed += 1
    return build, measure, timed


class Progress:
    """One status line: trials done, best speedup so far, build and measure time, elapsed; rewritten in place on
    a terminal."""

    def __init__(self, studies: Sequence[optuna.Study], n_trials: int, stream=sys.stderr, every_s: float = 1.0):
        self.studies, self.total = list(studies), n_trials * len(studies)
        self.stream, self.every_s = stream, every_s
        self.t0 = time.time()
        self._last = 0.0
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def line(self) -> str:
        done = sum(min(len(counted_trials(s)), self.total) for s in self.studies)
        bests = [b for b in (best_of(s) for s in self.studies) if b is not None]
        best = f"{max(bests):.3f}x" if bests else "-"
        geo = f"{math.exp(sum(map(math.log, bests)) / len(bests)):.3f}x" if bests else "-"
        build, measure, timed = time_spent(self.studies)
        each = f" ({build / timed:.1f} s · {measure / timed:.1f} s per trial)" if timed else ""
        return (f"trials {done}/{self.total}  best speedup {best}  geomean of per-shape bests {geo}  "
                f"build {build:.1f} s · measure {measure:.1f} s{each}  elapsed {time.time() - self.t0:.0f}s")

    def __call__(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last < (self.every_s if self.tty else max(self.every_s, 10.0)):
            return
        self._last = now
        end = "\n" if force or not self.tty else ""
        print(("\r" if self.tty else "") + self.line(), end=end, file=self.stream, flush=True)
