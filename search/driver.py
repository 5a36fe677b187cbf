"""A whole tune: every problem's study opened, checked against the store, reclaimed and warm-started, then run
in this process or in one spawned worker process per GPU; resumable by running the same command again.

The jobs it drives: study.py (settings, names, budget), storage.py, samplers.py, recovery.py (trials a dead
worker left), warmstart.py, workers.py (the trial loop), compile_pool.py (builds ahead of measurement),
supervisor.py (GPU worker processes), progress.py; after a tune, confirm.py and export.py.
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Union

import optuna

from .compile_pool import CompilePool
from .progress import Progress
from .recovery import reclaim_lost_trials
from .runners import Runner, RunnerPoisoned, make_runner
from .space import Problem, check_targets
from .storage import parse_storage
from .store import Store
from .study import TuneConfig, check_store_holds_study, open_studies, open_study
from .supervisor import POISONED_EXIT, probe_gpu_name, supervise
from .warmstart import warm_start
from .workers import StudyWorker, run_studies, share_best


def _run_worker(problems, cfg, runner: Runner, store, storage, policy, worker_index, progress=None, evaluating=None):
    studies = open_studies(storage, problems, cfg, runner.gpu, policy, worker_index)
    pool = None
    if cfg.compile_workers > 0 and runner.uses_compile_pool:
        pool = CompilePool(cfg.compile_workers)
    try:
        workers: List[StudyWorker] = []
        hook = (lambda w, r: share_best(w, r, workers)) if cfg.share_best and len(problems) > 1 else None
        for s, p in zip(studies, problems):
            workers.append(StudyWorker(s, p, runner, store, cfg, pool=pool, on_result=hook, evaluating=evaluating))
        k = worker_index % max(1, len(workers))   # workers start on different studies
        run_studies(workers[k:] + workers[:k], batch=max(1, cfg.compile_workers), progress=progress)
    finally:
        if pool is not None:
            pool.shutdown()


def _worker_main(index, problems, cfg, runner_kind, store_path, storage_arg, storage_dir, policy_path, busy_since):
    """Entry point of one GPU worker process: sees only its GPU (CUDA_VISIBLE_DEVICES); `busy_since` (shared
    with the supervisor) holds when the trial it evaluates began, 0.0 between trials."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    policy = None
    if policy_path:
        from .policy import Policy
        policy = Policy.load(policy_path)
    storage = parse_storage(storage_arg, Path(storage_dir))
    try:
        _run_worker(problems, cfg, make_runner(runner_kind, cfg.protocol), Store(store_path), storage, policy, index,
                    evaluating=lambda since: setattr(busy_since, "value", since))
    except RunnerPoisoned as err:   # the parent reclaims this worker's trials and starts a fresh process
        print(f"worker {index}: a kernel broke the CUDA context ({str(err)[:200]}); restarting",
              file=sys.stderr, flush=True)
        sys.exit(POISONED_EXIT)


def tune(problems: Sequence[Problem], cfg: TuneConfig, runner: Union[Runner, str], store: Store,
         storage_arg: Optional[str] = None, storage_dir: Optional[Path] = None, workers: int = 1, policy=None,
         policy_path: Optional[Path] = None, llm=None, log: Callable[[str], None] = print, progress_stream=sys.stderr,
         reclaim_all: bool = False) -> List[optuna.Study]:
    """Tune every problem.

    `runner` is a Runner (evaluated in this process) or a runner kind ("gpu"): then `workers` spawned
    processes, one per GPU, evaluate; one whose CUDA context a faulting kernel broke is restarted.
    """
    cfg = replace(cfg, targets=check_targets(cfg.targets))
    storage_dir = Path(storage_dir or Path(store.path).parent)
    if (workers > 1 or isinstance(runner, str)) and storage_arg == ":memory:":
        raise ValueError("worker processes need a shared storage (a journal: file, SQLite file or an RDB URL)")
    if isinstance(runner, str):   # a runner kind: measured in worker processes, one per GPU
        gpu_runner, gpu = None, probe_gpu_name(runner)
    else:
        gpu_runner, gpu = runner, runner.gpu
    storage = parse_storage(storage_arg, storage_dir)
    studies = [open_study(storage, p, cfg, gpu) for p in problems]
    for s, p in zip(studies, problems):
        check_store_holds_study(s, p, store, gpu, cfg.protocol)
        lost = reclaim_lost_trials(s, everything=reclaim_all, orphan_after_s=cfg.orphan_after_s)
        if lost:
            log(f"{p.shape}: {lost} trial(s) lost by an earlier run re-enqueued")
        added = warm_start(s, p, cfg, policy=policy, llm=llm, store=store, log=log)
        if any(added.values()):
            log(f"{p.shape}: warm start with {added['seed']} seed spec(s), {added['pack']} prebuilt CUTLASS "
                f"kernel(s), {added['policy']} policy and "
                f"{added['llm']} LLM proposal(s)")
    progress = Progress(studies, cfg.n_trials, stream=progress_stream)
    if workers == 1 and not isinstance(runner, str):
        _run_worker(problems, cfg, gpu_runner, store, storage, policy, 0, progress=progress)
    else:
        import multiprocessing as mp
        if policy is not None and policy_path is None:
            raise ValueError("worker processes load the policy from a file: pass policy_path")
        ctx = mp.get_context("spawn")
        busy = [ctx.Value("d", 0.0) for _ in range(workers)]

        def start(i):
            busy[i].value = 0.0
            pr = ctx.Process(target=_worker_main, args=(i, list(problems), cfg, runner, store.path, storage_arg,
                                                         str(storage_dir), str(policy_path) if policy else None,
                                                         busy[i]))
            pr.start()
            return pr

        def reclaim():   # a poisoned worker's unfinished trials go back in the queue
            for s in studies:
                reclaim_lost_trials(s, orphan_after_s=cfg.orphan_after_s)

        supervise(start, workers, on_restart=reclaim, tick=progress, log=log,
                  busy_since=[lambda i=i: busy[i].value for i in range(workers)], trial_timeout_s=cfg.trial_timeout_s)
    progress(force=True)
    return studies
