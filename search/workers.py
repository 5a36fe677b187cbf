"""The trial loop: `StudyWorker` runs one study's trials for one runner, `run_studies` round-robins over many.

A trial goes: ask -> define-by-run point (space.suggest_params) -> validation (an invalid point is told
PRUNED with its rule and never built) -> duplicate check (a point already evaluated in the study is
PRUNED, not re-run) -> results-store lookup (a result measured before, e.g. before a crash, is reused)
-> a sampled new CUTLASS kernel set aside while the pack holds untried ones for the problem (PRUNED, a prebuilt
point enqueued instead: no nvcc) -> compile (for runners that declare `uses_compile_pool`, the round's candidates go to the CPU processes of
search/compile_pool.py, CUTLASS ones several to an nvcc run) -> evaluate on this process's GPU -> store -> tell
(with the trial's build and measure seconds as user attrs `build_s` and `measure_s`, for search/progress.py).
The objective is the speedup over torch.matmul; a build or verify failure is told FAIL with its reason and can
never win. Specs are built shape-generic (M, N, K `any`), so one build serves every shape. Every outcome reaches
the store before it is told (the crash-safety order search/recovery.py needs).
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence

import optuna
from optuna.trial import TrialState

from .recovery import is_orphan, reclaim_lost_trials
from .compile_pool import CompilePool, Ticket
from .runners import Outcome, Runner, RunnerPoisoned
from .samplers import source_of
from .space import Problem, TARGET_PARAM, check_point, spec_from_params, suggest_params
from .store import Result, Store
from .study import COUNTED, TuneConfig, best_of, point_key, trial_point


@dataclass
class _Pending:
    trial: optuna.trial.Trial
    params: Dict[str, object]
    source: str
    spec: object = None
    build: Optional[Ticket] = None
    cached: Optional[Result] = None


class StudyWorker:
    """Runs the trials of one study for one runner; `step()` evaluates one batch of asked trials."""

    def __init__(self, study: optuna.Study, problem: Problem, runner: Runner, store: Store, cfg: TuneConfig,
                 pool: Optional[CompilePool] = None, on_result: Optional[Callable] = None,
                 evaluating: Optional[Callable[[float], None]] = None):
        self.study, self.problem, self.runner, self.store, self.cfg = study, problem, runner, store, cfg
        self.pool = pool
        self.on_result = on_result
        # told the wall-clock time an evaluation starts, then 0.0 when it ends: what the supervisor's per-trial
        # time limit watches (a kernel that hangs the GPU never returns)
        self.evaluating = evaluating or (lambda since: None)
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.pending: List[_Pending] = []     # asked, building or built, not yet evaluated
        self._last_reclaim = 0.0
        self._prebuilt: Optional[List[Dict[str, object]]] = None   # the problem's prebuilt CUTLASS points
        self._prebuilt_keys: frozenset = frozenset()

    def done(self) -> bool:
        trials = self.study.get_trials(deepcopy=False)
        counted = sum(1 for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)
                      and t.user_attrs.get("status") in COUNTED)
        running = sum(1 for t in trials if t.state == TrialState.RUNNING)
        return counted + running >= self.cfg.n_trials or len(trials) >= self.cfg.max_asks

    def _source(self, trial) -> str:
        attrs = trial.user_attrs
        if "source" in attrs:
            return str(attrs["source"])
        return source_of(self.study.sampler, trial.number)

    def _result(self, p: _Pending, status: str, outcome: Optional[Outcome] = None, reason: str = "") -> Result:
        o = outcome or Outcome(status, reason=reason)
        return Result(problem=self.problem.key(), spec=p.spec.to_l2(), target=p.params[TARGET_PARAM],
                      gpu=self.runner.gpu, protocol=self.runner.protocol, status=status, tflops=o.tflops,
                      baseline_tflops=o.baseline_tflops, speedup=o.speedup, reason=o.reason or reason,
                      source=p.source, params=p.params)

    def _tell(self, p: _Pending, r: Result, seconds: Optional[Dict[str, float]] = None) -> None:
        """Record the outcome on the trial and tell it. A trial another worker told first is left as that worker
        told it: SQLite cannot lock a row, so two processes may both pop one enqueued trial (Optuna's queue takes
        the first that marks it running) and evaluate it; the second outcome is then dropped, the store keeps one
        row for the point."""
        t = p.trial
        try:
            t.set_user_attr("status", r.status)
            t.set_user_attr("source", r.source)
            for name, value in (seconds or {}).items():   # build_s, measure_s: where this trial's time went
                t.set_user_attr(name, round(value, 3))
            if r.reason:
                t.set_user_attr("reason", r.reason[:500])
            if r.status == "ok":
                t.set_user_attr("tflops", r.tflops)
                t.set_user_attr("baseline_tflops", r.baseline_tflops)
        except optuna.exceptions.UpdateFinishedTrialError:
            return
        try:   # skip_if_finished reads the state before it writes: another worker can finish the trial in between
            if r.status == "ok":
                self.study.tell(t, r.speedup, skip_if_finished=True)
            elif r.status in ("invalid", "duplicate", "deferred"):
                self.study.tell(t, state=TrialState.PRUNED, skip_if_finished=True)
            else:
                self.study.tell(t, state=TrialState.FAIL, skip_if_finished=True)
        except optuna.exceptions.UpdateFinishedTrialError:
            return
        if self.on_result:
            self.on_result(self, r)

    def _ask(self) -> Optional[_Pending]:
        trial = self.study.ask()
        try:
            trial.set_user_attr("worker", self.worker_id)
            params = suggest_params(trial, self.cfg.targets)
        except optuna.exceptions.UpdateFinishedTrialError:   # popped by another worker too, and told (see _tell)
            return None
        p = _Pending(trial, params, self._source(trial))
        p.spec = spec_from_params(params, self.problem, generic=True)
        valid, reason = check_point(params, self.problem)
        if valid is None:   # the constraint: record why, never build
            r = self._result(p, "invalid", reason=reason)
            self.store.record(r)
            self._tell(p, r)
            return None
        key = point_key(params)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL,
                                                                TrialState.RUNNING)):
            if t.number == trial.number or point_key(t.params) != key:
                continue
            if t.user_attrs.get("status") in COUNTED or t.state == TrialState.RUNNING:   # done, or another worker's
                r = self._result(p, "duplicate", reason=f"same point as trial {t.number}")
                self._tell(p, r)
                return None
        if self._defer_new_cutlass(trial, params):
            self._tell(p, self._result(p, "deferred", reason="a new CUTLASS kernel waits until the prebuilt ones "
                                                           "for this problem are tried"))
            return None
        p.cached = self.store.get(self.problem.key(), p.spec.to_l2(), params[TARGET_PARAM], self.runner.gpu,
                                  self.runner.protocol)
        if p.cached is not None and p.cached.status not in COUNTED:
            p.cached = None
        return p

    def _defer_new_cutlass(self, trial, params: Dict[str, object]) -> bool:
        """A new CUTLASS kernel costs an nvcc run (40-60 s of a core) where one the pack holds costs none: while the
        pack holds points of this problem the study has not run (`warmstart.prebuilt_points`), a sampled new one
        is set aside (PRUNED, not counted against the budget) and the next prebuilt point enqueued in its place.
        Enqueued points (seeds, policy and LLM proposals) always run."""
        if params[TARGET_PARAM] != "cutlass":
            return False
        trials = self.study.get_trials(deepcopy=False)
        if any(t.number == trial.number and "fixed_params" in t.system_attrs for t in trials):   # enqueued: runs
            return False
        if self._prebuilt is None:
            from .warmstart import prebuilt_points
            self._prebuilt = prebuilt_points(self.problem, getattr(self.study.sampler, "policy", None))
            self._prebuilt_keys = frozenset(map(point_key, self._prebuilt))
        if point_key(params) in self._prebuilt_keys:
            return False
        tried = {trial_point(t) for t in trials if t.number != trial.number}
        for q in self._prebuilt:
            if point_key(q) not in tried:
                self.study.enqueue_trial(q, user_attrs={"source": "pack"}, skip_if_exists=True)
                return True
        return False

    def idle(self) -> bool:
        """Nothing in flight and the budget spent: this study is finished for this worker.

        A trial left RUNNING without a worker name (a run killed between `ask` and naming the trial) would
        hold one unit of budget forever; while the study waits only on such orphans it is not finished: they
        are reclaimed once `orphan_after_s` old and their points run here."""
        if self.pending or not self.done():
            return False
        trials = self.study.get_trials(deepcopy=False)
        if len(trials) >= self.cfg.max_asks or not any(is_orphan(t) for t in trials):
            return True
        now = time.time()
        if now - self._last_reclaim >= 1.0:
            self._last_reclaim = now
            reclaim_lost_trials(self.study, orphan_after_s=self.cfg.orphan_after_s)
        return False

    def step(self, batch: int = 1) -> int:
        """Keep up to `batch` trials in flight (their builds are requested from the compile pool, which
        run_studies flushes once per round, so that an nvcc run can take the candidates of several studies),
        then evaluate the ones whose build has finished; returns trials told. Never waits on a build: a slow
        nvcc run holds up only its own trials while the other studies keep measuring."""
        told = 0
        while len(self.pending) < batch and not self.done():
            p = self._ask()
            if p is None:
                told += 1
                continue
            if p.cached is None and self.pool is not None and self.runner.uses_compile_pool:
                p.build = self.pool.request(p.spec, p.params[TARGET_PARAM], self.problem.arch)
            self.pending.append(p)
        ready = [p for p in self.pending if p.cached is not None or p.build is None or p.build.done()]
        for p in ready:
            self.pending.remove(p)
            seconds = None
            if p.cached is not None:
                r = replace(p.cached, source=p.source)
            else:
                built = p.build.result() if p.build is not None else None
                if built is not None and built.failure is not None:   # a failed candidate, never built again
                    self.runner.note_build_failure(p.spec, built.failure)
                self.evaluating(time.time())
                try:
                    outcome = self.runner.evaluate(p.spec, self.problem)
                finally:
                    self.evaluating(0.0)
                r = self._result(p, outcome.status, outcome)
                self.store.record(r)
                seconds = {"build_s": (built.seconds if built is not None else 0.0) + outcome.build_seconds,
                           "measure_s": max(0.0, outcome.seconds - outcome.build_seconds)}
            self._tell(p, r, seconds)
            told += 1
            poisoned = self.runner.poisoned()
            if poisoned:   # recorded and told; trials still in flight are reclaimed by the next run
                raise RunnerPoisoned(poisoned)
        return told


def run_studies(workers: List[StudyWorker], batch: int = 1, progress: Optional[Callable] = None) -> None:
    """Round-robin over the studies until each has spent its budget (or gave up asking) and has nothing in
    flight. After each round the compile pools get the round's build requests, all studies' together, so that
    CUTLASS candidates share nvcc runs. When every study is waiting on a build, sleep briefly instead of
    spinning."""
    active = list(workers)
    pools = list({id(w.pool): w.pool for w in workers if w.pool is not None}.values())
    while active:
        told = 0
        for w in list(active):
            if w.idle():
                active.remove(w)
                continue
            told += w.step(batch)
            if progress:
                progress()
        for pool in pools:
            pool.flush()
        if active and not told:
            time.sleep(0.05)


def share_best(source: StudyWorker, r: Result, siblings: Sequence[StudyWorker]) -> None:
    """A new best spec of one shape is a candidate for the others: enqueue it there (built already)."""
    best = best_of(source.study)
    if r.status != "ok" or best is None or r.speedup is None or r.speedup < best:
        return
    for w in siblings:
        if w is not source and not w.done():
            w.study.enqueue_trial(dict(r.params), user_attrs={"source": "enqueued"}, skip_if_exists=True)
