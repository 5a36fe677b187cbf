"""Confirmation: each shape's exported winner is measured again, in this run, before it is exported; the
store's best alone is biased high (confirm_leaders says why). Runs in this process or in GPU worker processes.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from typing import Callable, Dict, Optional, Sequence

from ..parser import parse_one
from .compile_pool import CompilePool
from .runners import Runner, RunnerPoisoned, make_runner
from .space import Problem
from .store import Result, Store
from .supervisor import POISONED_EXIT, probe_gpu_name, supervise


HUNG = ("its measurement did not finish: the worker died or was stopped past the trial time limit (a kernel that "
        "hangs?)")


def confirm_leaders(problems: Sequence[Problem], runner: Runner, store: Store, since: float, budget: int,
                    log: Callable[[str], None] = print,
                    evaluating: Optional[Callable[[float], None]] = None) -> Dict[str, Optional[Result]]:
    """Measure each shape's stored leader again until the leader is a result confirmed at or after `since`, or
    `budget` measurements of that shape were spent; returns each shape's best confirmed result (or None).

    Why: the store's best of a shape is the maximum over every measurement ever made of it (imports of earlier
    runs, earlier builds of the same spec text, other machines of the same model), and the tune reuses a
    stored result rather than measure it again. The maximum of many noisy or stale figures is biased high, and a
    table exported from it loses when measured apart (on the H200 a stored 0.999x for 16384x2048x16384 measured
    0.890x apart; benchmarks/NOTES.md).
    A re-measured leader that drops lets the next one lead; a re-measurement that fails to build or verify replaces
    the stored success, so it cannot win. Resumable: a restarted run skips leaders already confirmed since `since`.
    In a worker process a supervisor watches (`evaluating` tells it when each measurement began, 0.0 when it
    ended), each leader is on record as failed (HUNG) while it is measured, its outcome replacing that record, so
    a leader whose measurement never returns (the supervisor kills the worker) is a failed candidate to the
    restarted worker, not measured again. In this process (no `evaluating`) nothing kills a measurement: no such
    record is written.
    """
    winners: Dict[str, Optional[Result]] = {}
    for p in problems:
        stored = store.best(p.key(), runner.gpu, runner.protocol)
        spent, build_s, measure_s = 0, 0.0, 0.0
        while spent < budget:
            lead = store.best(p.key(), runner.gpu, runner.protocol)
            if lead is None or (lead.confirmed is not None and lead.confirmed >= since):
                break
            if evaluating is None:
                outcome = runner.evaluate(parse_one(lead.spec), p)
            else:
                now = time.time()
                store.record(replace(lead, status="verify_failed", tflops=None, baseline_tflops=None, speedup=None,
                                     reason=HUNG, time=now, confirmed=now))
                evaluating(now)
                try:
                    outcome = runner.evaluate(parse_one(lead.spec), p)
                except BaseException:   # raised, not killed (its user's Ctrl-C, a fault of this process's code):
                    store.record(lead)   # the leader stands as it was (a killed worker runs no handler)
                    raise
                evaluating(0.0)
            spent += 1
            build_s += outcome.build_seconds
            measure_s += outcome.seconds - outcome.build_seconds
            now = time.time()
            store.record(replace(lead, status=outcome.status, tflops=outcome.tflops,
                                 baseline_tflops=outcome.baseline_tflops, speedup=outcome.speedup,
                                 reason=outcome.reason, time=now, confirmed=now))
            poisoned = runner.poisoned()
            if poisoned:   # recorded as failed; the supervisor restarts this worker, which resumes here
                raise RunnerPoisoned(poisoned)
        win = winners[p.key()] = store.best(p.key(), runner.gpu, runner.protocol, confirmed_since=since)
        was = f"{stored.speedup:.3f}x" if stored is not None else "-"
        is_ = f"{win.speedup:.3f}x ({win.target})" if win is not None else "no verified kernel"
        log(f"{p.shape}: confirmed {is_} after {spent} re-measurement(s) (build {build_s:.1f} s · measure "
            f"{measure_s:.1f} s); the store's best was {was}")
    return winners


def _confirm_main(index, problems, protocol, runner_kind, store_path, since, budget, busy=None):
    """Entry point of one confirming GPU worker process: sees only its GPU (CUDA_VISIBLE_DEVICES); `busy` (a shared
    double) holds when its measurement in progress began, 0.0 between them."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    log = lambda s: print(s, file=sys.stderr, flush=True)   # noqa: E731
    def evaluating(t):
        if busy is not None:
            busy.value = t
    try:
        confirm_leaders(problems, make_runner(runner_kind, protocol), Store(store_path), since, budget, log,
                        evaluating)
    except RunnerPoisoned as err:
        log(f"worker {index}: a kernel broke the CUDA context ({str(err)[:200]}); restarting")
        sys.exit(POISONED_EXIT)


def prebuild_leaders(problems: Sequence[Problem], store: Store, gpu: str, protocol: str, budget: int,
                     compile_workers: int, log: Callable[[str], None] = print) -> int:
    """Build every CUTLASS spec confirm_leaders may measure that is not built yet, `compile_workers` processes at a
    time, before it measures any.

    The leaders it measures are always a prefix of the stored order (a re-measured leader either holds or falls
    below the next one), so the top `budget` results per shape are all it can need. After a template change every
    stored CUTLASS leader needs nvcc again, which one measuring process would otherwise do one at a time; the
    compile pool builds them all at once, several to an nvcc run. Leaders already built (those the tune just ran)
    and Triton leaders (compiled at their first launch in the measuring process, from Triton's cache when the tune
    just ran them) are left alone: a pool costs seconds to start. A spec that fails to build is measured (and
    recorded) as failed by confirm_leaders."""
    if compile_workers < 1:
        return 0
    from ..errors import L2Error
    from ..targets import get as get_target
    from ..validate import validate
    wanted = []
    for text, target, arch in sorted({(r.spec, r.target, p.arch) for p in problems
                                      for r in store.top(p.key(), gpu, protocol, budget)}):
        if target != "cutlass":
            continue
        spec = parse_one(text)
        try:
            if get_target(target).built(validate(spec, target, arch)):
                continue
        except L2Error:
            pass   # measured, and recorded as failed, by confirm_leaders
        wanted.append((spec, target, arch))
    if not wanted:
        return 0
    start = time.perf_counter()
    with CompilePool(compile_workers) as pool:
        built = pool.build(wanted)
    failures = sum(1 for b in built if b.failure is not None)
    log(f"confirmation: built {len(wanted)} stored CUTLASS leader(s) ahead, {compile_workers} at a time "
        f"({failures} failed to build: they will be recorded as failed); build {sum(b.seconds for b in built):.1f} s "
        f"of compile-pool time in {time.perf_counter() - start:.1f} s")
    return len(wanted)


def confirm(problems: Sequence[Problem], runner, store: Store, protocol: str, budget: int, workers: int = 1,
            log: Callable[[str], None] = print, compile_workers: int = 0, trial_timeout_s: float = 0.0) -> float:
    """Confirm every shape's leader (confirm_leaders) in this process, or, for a runner kind ("gpu"), in `workers`
    processes, one per GPU, each taking every `workers`-th shape, stopped and started again where one measurement
    runs past `trial_timeout_s` (the tune's per-trial limit; 0: none); with `compile_workers`, the candidates are
    built first in a CPU pool (prebuild_leaders). Returns the round's start: export and Store.best take it as
    `confirmed_since`."""
    gpu = probe_gpu_name(runner) if isinstance(runner, str) else runner.gpu
    prebuild_leaders(problems, store, gpu, protocol, budget, compile_workers, log)
    since = time.time()
    if not isinstance(runner, str):
        confirm_leaders(problems, runner, store, since, budget, log)
        return since
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    workers = max(1, min(workers, len(problems)))
    busy = [ctx.Value("d", 0.0) for _ in range(workers)]

    def start(i):
        busy[i].value = 0.0
        pr = ctx.Process(target=_confirm_main, args=(i, list(problems[i::workers]), protocol, runner, store.path,
                                                     since, budget, busy[i]))
        pr.start()
        return pr

    supervise(start, workers, log=log, busy_since=[lambda i=i: busy[i].value for i in range(workers)],
              trial_timeout_s=trial_timeout_s)
    return since
