"""The tuning driver: one Optuna study per (problem, target set, GPU, protocol), driven by ask/tell.

A trial goes: ask -> define-by-run point (space.suggest_params) -> validation (an invalid point is told
PRUNED with its rule and never built) -> duplicate check (a point already evaluated in the study is
PRUNED, not re-run) -> results-store lookup (a result measured before, e.g. before a crash, is reused)
-> compile (a CPU process pool for GPU runners) -> evaluate on this process's GPU -> store -> tell.
The objective is the speedup over torch.matmul; a build or verify failure is told FAIL with its reason
and can never win. Specs are built shape-generic (M, N, K `any`), so one build serves every shape.

Crash safety: every outcome reaches the store before it is told; trials left RUNNING by a dead worker
are marked FAIL (status `lost`) and their points re-enqueued when the tune is started again, so a resumed
study finishes with exactly the requested number of evaluated points and none evaluated twice.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import socket
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import optuna
from optuna.trial import TrialState

from ..errors import DataFileError
from .runners import Outcome, Runner
from .space import Problem, TARGET_PARAM, check_point, check_targets, spec_from_params, suggest_params
from .store import Result, Store

COUNTED = ("ok", "build_failed", "verify_failed")   # statuses that spend the trial budget
POISONED_EXIT = 3                                    # a worker process whose CUDA context a kernel broke
MAX_RESTARTS = 50
ORPHAN_AFTER_S = 30.0   # a RUNNING trial that never named its worker (killed between `ask` and naming) is dead
                        # after this long: a live worker names its trial in the storage call right after `ask`


@dataclass
class TuneConfig:
    targets: Tuple[str, ...] = ("triton", "cutlass")
    n_trials: int = 50
    protocol: str = "kernel"
    sampler: str = "auto"              # auto (policy+tpe when a policy is given, else tpe) | tpe | random | policy
    policy_fraction: float = 0.5
    warm_start: int = 8                # policy proposals enqueued into a fresh study
    seed: Optional[int] = None
    compile_workers: int = 0           # CPU processes building ahead of measurement (GPU runner)
    # Give up a study after this many asks per budgeted trial. Only 1-12% of uniformly drawn points validate (tiles
    # take any multiple of 8, which CUTLASS allows on one side only and Triton not at all, and launch swap=yes
    # decides which side; the gemv family takes few of them); an invalid point is pruned before any build, so
    # asking is cheap.
    max_ask_factor: int = 100
    min_asks: int = 600                # ... and never before this many: a small budget on a small problem (where
                                       # most split-K counts exceed its K tiles) may find only 1 valid point in 500
    share_best: bool = True            # enqueue each study's new best into its sibling studies
    seed_specs: Tuple = ()             # KernelSpecs a user supplies (e.g. a prebuilt pool), enqueued first
    orphan_after_s: float = ORPHAN_AFTER_S

    @property
    def max_asks(self) -> int:
        """Asks after which a study gives up on finding its budget of valid points."""
        return max(self.n_trials * self.max_ask_factor, self.min_asks)


def parse_storage(arg: Optional[str], default_dir: Path):
    """`None` -> journal file in default_dir; `journal:PATH`; `:memory:`; any Optuna RDB URL."""
    if arg == ":memory:":
        return optuna.storages.InMemoryStorage()
    if arg and arg.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend, JournalStorage
        path = arg[len("journal:"):]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        check_journal(Path(path))
        return JournalStorage(JournalFileBackend(path))
    if not arg:   # a journal file: multi-process safe and far cheaper per trial than SQLite
        return parse_storage(f"journal:{Path(default_dir) / 'studies.journal'}", default_dir)
    kwargs = {"connect_args": {"timeout": 120}} if arg.startswith("sqlite") else {}
    heartbeat = {} if arg.startswith("sqlite") else {"heartbeat_interval": 60, "grace_period": 300}
    return optuna.storages.RDBStorage(arg, engine_kwargs=kwargs, **heartbeat)


def check_journal(path: Path) -> None:
    """Raise DataFileError naming the line of `path` that is not a whole Optuna journal record: a line cut short (a
    writer killed mid-record; Optuna would skip it and append the next record to it, losing that one too) or one
    that is not a JSON record. Optuna itself raises a bare JSONDecodeError or ValueError from deep inside."""
    if not path.exists():
        return
    if path.is_dir():
        raise DataFileError(f"study journal {path}: is a directory, not a journal file")
    offset = 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.endswith(b"\n"):
                raise DataFileError(f"study journal {path}: line {number} is cut short (no line end: a writer was "
                                    f"killed mid-record?); truncate the file to its first {offset} bytes to resume")
            try:
                record = json.loads(line)
            except ValueError as err:
                raise DataFileError(f"study journal {path}: line {number} (from byte {offset}) is not a journal "
                                    f"record ({err}); remove that line to resume") from None
            if not isinstance(record, dict) or "op_code" not in record:
                raise DataFileError(f"study journal {path}: line {number} is JSON but not an Optuna journal record")
            offset += len(line)


def check_store_holds_study(study: optuna.Study, problem: Problem, store: Store, gpu: str, protocol: str) -> None:
    """Raise DataFileError when trials the study counts as evaluated have no result in the store (the store was
    emptied, replaced or is another one): the tune would take the study as done and export nothing of them."""
    missing = 0
    counted = counted_trials(study)
    for t in counted:
        if TARGET_PARAM not in t.params:
            continue
        spec = spec_from_params(t.params, problem, generic=True).to_l2()
        if store.get(problem.key(), spec, t.params[TARGET_PARAM], gpu, protocol) is None:
            missing += 1
    if missing:
        raise DataFileError(
            f"results store {store.path} has no result for {missing} of the {len(counted)} evaluated trials of "
            f"study {study.study_name!r} (was the store emptied or replaced?); restore the store, or start the "
            f"studies afresh with a new --storage, or move the journal away")


def study_name(problem: Problem, targets: Sequence[str], gpu: str, protocol: str) -> str:
    return f"l2c|{problem.key()}|{'+'.join(check_targets(targets))}|{gpu}|{protocol}"


def make_sampler(cfg: TuneConfig, problem: Problem, policy=None, seed_offset: int = 0):
    seed = None if cfg.seed is None else cfg.seed + seed_offset
    kind = cfg.sampler
    if kind == "auto":
        kind = "policy" if policy is not None else "tpe"
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if kind == "policy":
        if policy is None:
            raise ValueError("sampler 'policy' needs a trained policy")
        from .policy import PolicySampler
        return PolicySampler(policy, problem, cfg.targets, fraction=cfg.policy_fraction, seed=seed)
    raise ValueError(f"unknown sampler {cfg.sampler!r}")


def open_study(storage, problem: Problem, cfg: TuneConfig, gpu: str, sampler=None) -> optuna.Study:
    return optuna.create_study(storage=storage, study_name=study_name(problem, cfg.targets, gpu, cfg.protocol),
                               direction="maximize", sampler=sampler, load_if_exists=True)


def _point_key(params: Dict[str, object]) -> Tuple:
    return tuple(sorted((k, str(v)) for k, v in params.items()))


def counted_trials(study: optuna.Study) -> List[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
            if t.user_attrs.get("status") in COUNTED]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _orphan(t: optuna.trial.FrozenTrial) -> bool:
    """RUNNING and never named its worker: killed between `ask` and `set_user_attr("worker")`, or still
    inside that window (a live worker leaves it within milliseconds)."""
    return t.state == TrialState.RUNNING and not t.user_attrs.get("worker")


def reclaim_lost_trials(study: optuna.Study, everything: bool = False,
                        orphan_after_s: float = ORPHAN_AFTER_S) -> int:
    """Mark trials a dead worker left RUNNING as FAIL (status `lost`) and re-enqueue their points.

    A trial is dead when its worker ran on this host and that process is gone, when it never got as far as
    naming its worker (killed right after `ask`, `orphan_after_s` ago or more), or always with `everything`
    (`l2c tune --reclaim all`: the caller knows no other worker is alive, e.g. after a remote host died on
    a journal file). RDB storages with heartbeats also fail stale trials of remote workers. A point is
    re-enqueued whether it was sampled (params) or popped from the queue before any param was set
    (its enqueued `fixed_params`), so a seed or retry is never dropped.
    """
    if isinstance(study._storage, optuna.storages.RDBStorage) and study._storage.is_heartbeat_enabled():
        optuna.storages.fail_stale_trials(study)
    host = socket.gethostname()
    n = 0
    now = datetime.datetime.now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = str(t.user_attrs.get("worker", ""))
        w_host, _, w_pid = worker.rpartition(":")
        orphan = (_orphan(t) and t.datetime_start is not None
                  and (now - t.datetime_start).total_seconds() >= orphan_after_s)
        dead = everything or orphan or (w_host == host and w_pid.isdigit() and not _pid_alive(int(w_pid)))
        if not dead:
            continue
        study._storage.set_trial_user_attr(t._trial_id, "status", "lost")
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        params = dict(t.params) if TARGET_PARAM in t.params else dict(t.system_attrs.get("fixed_params") or {})
        if TARGET_PARAM in params:
            attrs = {"source": t.user_attrs.get("source", "enqueued"), "retry_of": t.number}
            study.enqueue_trial(params, user_attrs=attrs)
        n += 1
    return n


@dataclass
class _Pending:
    trial: optuna.trial.Trial
    params: Dict[str, object]
    source: str
    spec: object = None
    build: Optional[Future] = None
    cached: Optional[Result] = None


class StudyWorker:
    """Runs the trials of one study for one runner; `step()` evaluates one batch of asked trials."""

    def __init__(self, study: optuna.Study, problem: Problem, runner: Runner, store: Store, cfg: TuneConfig,
                 pool: Optional[ProcessPoolExecutor] = None, on_result: Optional[Callable] = None):
        self.study, self.problem, self.runner, self.store, self.cfg = study, problem, runner, store, cfg
        self.pool = pool
        self.on_result = on_result
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.default_source = {"RandomSampler": "random"}.get(type(study.sampler).__name__, "tpe")
        self.pending: List[_Pending] = []     # asked, building or built, not yet evaluated
        self._last_reclaim = 0.0

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
        by = getattr(self.study.sampler, "source_for", None)
        return by(trial.number) if by else self.default_source

    def _result(self, p: _Pending, status: str, outcome: Optional[Outcome] = None, reason: str = "") -> Result:
        o = outcome or Outcome(status, reason=reason)
        return Result(problem=self.problem.key(), spec=p.spec.to_l2(), target=p.params[TARGET_PARAM],
                      gpu=self.runner.gpu, protocol=self.runner.protocol, status=status, tflops=o.tflops,
                      baseline_tflops=o.baseline_tflops, speedup=o.speedup, reason=o.reason or reason,
                      source=p.source, params=p.params)

    def _tell(self, p: _Pending, r: Result) -> None:
        t = p.trial
        t.set_user_attr("status", r.status)
        t.set_user_attr("source", r.source)
        if r.reason:
            t.set_user_attr("reason", r.reason[:500])
        if r.status == "ok":
            t.set_user_attr("tflops", r.tflops)
            t.set_user_attr("baseline_tflops", r.baseline_tflops)
            self.study.tell(t, r.speedup)
        elif r.status in ("invalid", "duplicate"):
            self.study.tell(t, state=TrialState.PRUNED)
        else:
            self.study.tell(t, state=TrialState.FAIL)
        if self.on_result:
            self.on_result(self, r)

    def _ask(self) -> Optional[_Pending]:
        trial = self.study.ask()
        trial.set_user_attr("worker", self.worker_id)
        params = suggest_params(trial, self.cfg.targets)
        p = _Pending(trial, params, self._source(trial))
        p.spec = spec_from_params(params, self.problem, generic=True)
        valid, reason = check_point(params, self.problem)
        if valid is None:   # the constraint: record why, never build
            r = self._result(p, "invalid", reason=reason)
            self.store.record(r)
            self._tell(p, r)
            return None
        key = _point_key(params)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL,
                                                                TrialState.RUNNING)):
            if t.number == trial.number or _point_key(t.params) != key:
                continue
            if t.user_attrs.get("status") in COUNTED or t.state == TrialState.RUNNING:   # done, or another worker's
                r = self._result(p, "duplicate", reason=f"same point as trial {t.number}")
                self._tell(p, r)
                return None
        p.cached = self.store.get(self.problem.key(), p.spec.to_l2(), params[TARGET_PARAM], self.runner.gpu,
                                  self.runner.protocol)
        if p.cached is not None and p.cached.status not in COUNTED:
            p.cached = None
        return p

    def idle(self) -> bool:
        """Nothing in flight and the budget spent: this study is finished for this worker.

        A trial left RUNNING without a worker name (a run killed between `ask` and naming the trial) would
        hold one unit of budget forever; while the study waits only on such orphans it is not finished: they
        are reclaimed once `orphan_after_s` old and their points run here."""
        if self.pending or not self.done():
            return False
        trials = self.study.get_trials(deepcopy=False)
        if len(trials) >= self.cfg.max_asks or not any(_orphan(t) for t in trials):
            return True
        now = time.time()
        if now - self._last_reclaim >= 1.0:
            self._last_reclaim = now
            reclaim_lost_trials(self.study, orphan_after_s=self.cfg.orphan_after_s)
        return False

    def step(self, batch: int = 1) -> int:
        """Keep up to `batch` trials in flight (their builds go to the compile pool), then evaluate the ones
        whose build has finished; returns trials told. Never waits on a build: a slow nvcc run holds up only
        its own trial while the other studies keep measuring."""
        told = 0
        while len(self.pending) < batch and not self.done():
            p = self._ask()
            if p is None:
                told += 1
                continue
            if p.cached is None and self.pool is not None and getattr(self.runner, "uses_compile_pool", False):
                from .runners import precompile
                p.build = self.pool.submit(precompile, p.spec.to_l2(), p.params[TARGET_PARAM], self.problem.arch)
            self.pending.append(p)
        ready = [p for p in self.pending if p.cached is not None or p.build is None or p.build.done()]
        for p in ready:
            self.pending.remove(p)
            if p.cached is not None:
                r = replace(p.cached, source=p.source)
            else:
                failure = p.build.result() if p.build is not None else None
                if failure is not None and hasattr(self.runner, "note_build_failure"):
                    self.runner.note_build_failure(p.spec, failure)
                outcome = self.runner.evaluate(p.spec, self.problem)
                r = self._result(p, outcome.status, outcome)
                self.store.record(r)
            self._tell(p, r)
            told += 1
            poisoned = getattr(self.runner, "poisoned", None)
            if poisoned:   # recorded and told; trials still in flight are reclaimed by the next run
                from .runners import RunnerPoisoned
                raise RunnerPoisoned(poisoned)
        return told


def best_of(study: optuna.Study) -> Optional[float]:
    ok = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
    return max(ok) if ok else None


def run_studies(workers: List[StudyWorker], batch: int = 1, progress: Optional[Callable] = None) -> None:
    """Round-robin over the studies until each has spent its budget (or gave up asking) and has nothing in
    flight. When every study is waiting on a build, sleep briefly instead of spinning."""
    active = list(workers)
    while active:
        told = 0
        for w in list(active):
            if w.idle():
                active.remove(w)
                continue
            told += w.step(batch)
            if progress:
                progress()
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


def warm_start(study: optuna.Study, problem: Problem, cfg: TuneConfig, policy=None, llm=None,
               store: Optional[Store] = None, log: Callable[[str], None] = lambda s: None) -> Dict[str, int]:
    """Enqueue the user's seed specs (into any study: a resumed tune given new seeds tries them, and seeds it
    already tried are skipped), then policy and LLM proposals into a study that has not started yet."""
    added = {"seed": 0, "policy": 0, "llm": 0}
    trials = study.get_trials(deepcopy=False)
    from .space import params_from_spec
    # points already in the study: run (params) or waiting to run (enqueued: their fixed params)
    tried = {_point_key(t.params or t.system_attrs.get("fixed_params", {})) for t in trials}
    for spec in cfg.seed_specs:
        targets = cfg.targets if spec.target == "any" else (spec.target,)
        for target in (t for t in targets if t in cfg.targets):
            try:
                params = params_from_spec(spec, target)
            except ValueError as err:
                log(f"seed spec {spec.name} is outside the search space, skipped: {err}")
                continue
            if _point_key(params) in tried:
                continue
            study.enqueue_trial(params, user_attrs={"source": "seed"}, skip_if_exists=True)
            tried.add(_point_key(params))
            added["seed"] += 1
    if trials:   # a study that already ran keeps its own course: no policy or LLM warm start
        return added
    if policy is not None and cfg.warm_start > 0:
        for params in policy.propose(problem, cfg.targets, cfg.warm_start):
            study.enqueue_trial(params, user_attrs={"source": "policy"}, skip_if_exists=True)
            added["policy"] += 1
    if llm is not None:
        from ..parser import parse_one
        for target in cfg.targets:
            history = [(parse_one(r.spec), r.tflops, r.baseline_tflops)
                       for r in (store.results(problem=problem.key()) if store is not None else ())
                       if r.target == target]
            try:
                proposals = llm.propose(problem, history, cfg.warm_start or 4, target=target)
            except Exception as err:   # a dead LLM server or an infeasible problem must not stop the tune
                log(f"LLM proposer failed for {target}: {type(err).__name__}: {err}; continuing without it")
                continue
            for prop in proposals:
                try:
                    params = params_from_spec(prop.spec, prop.target)
                except ValueError as err:
                    log(f"LLM proposal outside the search space, skipped: {err}")
                    continue
                study.enqueue_trial(params, user_attrs={"source": "llm"}, skip_if_exists=True)
                added["llm"] += 1
    return added


# ---------------------------------------------------------------------------------------------------
# A whole tune: studies for many problems, one or many worker processes, progress, resumable
# ---------------------------------------------------------------------------------------------------

class Progress:
    """One status line: trials done, best speedup so far, elapsed; rewritten in place on a terminal."""

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
        return (f"trials {done}/{self.total}  best speedup {best}  geomean of per-shape bests {geo}  "
                f"elapsed {time.time() - self.t0:.0f}s")

    def __call__(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last < (self.every_s if self.tty else max(self.every_s, 10.0)):
            return
        self._last = now
        end = "\n" if force or not self.tty else ""
        print(("\r" if self.tty else "") + self.line(), end=end, file=self.stream, flush=True)


def _samplers_and_studies(storage, problems, cfg, gpu, policy, worker_index=0):
    studies = []
    for i, p in enumerate(problems):
        sampler = make_sampler(cfg, p, policy, seed_offset=1000 * worker_index + i)
        studies.append(open_study(storage, p, cfg, gpu, sampler))
    return studies


def _run_worker(problems, cfg, runner, store, storage, policy, worker_index, progress=None):
    studies = _samplers_and_studies(storage, problems, cfg, runner.gpu, policy, worker_index)
    pool = None
    if cfg.compile_workers > 0 and getattr(runner, "uses_compile_pool", False):
        import multiprocessing as mp   # spawn: a forked child of a CUDA process cannot use CUDA
        pool = ProcessPoolExecutor(cfg.compile_workers, mp_context=mp.get_context("spawn"))
    try:
        workers: List[StudyWorker] = []
        hook = (lambda w, r: share_best(w, r, workers)) if cfg.share_best and len(problems) > 1 else None
        for s, p in zip(studies, problems):
            workers.append(StudyWorker(s, p, runner, store, cfg, pool=pool, on_result=hook))
        k = worker_index % max(1, len(workers))   # workers start on different studies
        run_studies(workers[k:] + workers[:k], batch=max(1, cfg.compile_workers), progress=progress)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def _worker_main(index, problems, cfg, runner_kind, store_path, storage_arg, storage_dir, policy_path):
    """Entry point of one GPU worker process: sees only its GPU (CUDA_VISIBLE_DEVICES)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from .runners import RunnerPoisoned, make_runner
    policy = None
    if policy_path:
        from .policy import Policy
        policy = Policy.load(policy_path)
    storage = parse_storage(storage_arg, Path(storage_dir))
    try:
        _run_worker(problems, cfg, make_runner(runner_kind, cfg.protocol), Store(store_path), storage, policy, index)
    except RunnerPoisoned as err:   # the parent reclaims this worker's trials and starts a fresh process
        print(f"worker {index}: a kernel broke the CUDA context ({str(err)[:200]}); restarting",
              file=sys.stderr, flush=True)
        sys.exit(POISONED_EXIT)


def tune(problems: Sequence[Problem], cfg: TuneConfig, runner, store: Store, storage_arg: Optional[str] = None,
         storage_dir: Optional[Path] = None, workers: int = 1, policy=None, policy_path: Optional[Path] = None,
         llm=None, log: Callable[[str], None] = print, progress_stream=sys.stderr,
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
        gpu_runner, gpu = None, _probe_gpu_name(runner)
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
            log(f"{p.shape}: warm start with {added['seed']} seed spec(s), {added['policy']} policy and "
                f"{added['llm']} LLM proposal(s)")
    progress = Progress(studies, cfg.n_trials, stream=progress_stream)
    if workers == 1 and not isinstance(runner, str):
        _run_worker(problems, cfg, gpu_runner, store, storage, policy, 0, progress=progress)
    else:
        import multiprocessing as mp
        if policy is not None and policy_path is None:
            raise ValueError("worker processes load the policy from a file: pass policy_path")
        ctx = mp.get_context("spawn")

        def start(i):
            pr = ctx.Process(target=_worker_main, args=(i, list(problems), cfg, runner, store.path, storage_arg,
                                                         str(storage_dir), str(policy_path) if policy else None))
            pr.start()
            return pr

        def reclaim():   # a poisoned worker's unfinished trials go back in the queue
            for s in studies:
                reclaim_lost_trials(s, orphan_after_s=cfg.orphan_after_s)

        _supervise(start, workers, on_restart=reclaim, tick=progress, log=log)
    progress(force=True)
    return studies


def _supervise(start: Callable[[int], object], workers: int, on_restart: Callable[[], None] = lambda: None,
               tick: Callable[[], None] = lambda: None, log: Callable[[str], None] = print) -> None:
    """Run `workers` processes (`start(i)` starts number i) to the end; one that exits POISONED_EXIT (a kernel
    broke its CUDA context) is started again, after `on_restart`, up to MAX_RESTARTS times in all."""
    procs = [start(i) for i in range(workers)]
    restarts = 0
    try:
        while True:
            for i, pr in enumerate(procs):
                if pr.exitcode == POISONED_EXIT and restarts < MAX_RESTARTS:
                    on_restart()
                    restarts += 1
                    procs[i] = start(i)
            tick()
            if not any(pr.is_alive() for pr in procs) and (
                    restarts >= MAX_RESTARTS or all(pr.exitcode != POISONED_EXIT for pr in procs)):
                break
            time.sleep(1.0)
    finally:
        for pr in procs:
            pr.join()
    bad = [pr.exitcode for pr in procs if pr.exitcode]
    if bad:
        log(f"{len(bad)} worker(s) exited with status {bad}; rerun the same command to resume")


# ---------------------------------------------------------------------------------------------------
# Confirmation: a shape's exported winner is measured in the run that exports it
# ---------------------------------------------------------------------------------------------------

def confirm_leaders(problems: Sequence[Problem], runner, store: Store, since: float, budget: int,
                    log: Callable[[str], None] = print) -> Dict[str, Optional[Result]]:
    """Measure each shape's stored leader again until the leader is a result confirmed at or after `since`, or
    `budget` measurements of that shape were spent; returns each shape's best confirmed result (or None).

    Why: the store's best of a shape is the maximum over every measurement ever made of it (imports of earlier
    runs, earlier builds of the same spec text, other machines of the same model), and the tune reuses a
    stored result rather than measure it again. The maximum of many noisy or stale figures is biased high, and a
    table exported from it loses when measured apart (on the H200 a stored 0.999x for 16384x2048x16384 measured
    0.890x apart; benchmarks/NOTES.md).
    A re-measured leader that drops lets the next one lead; a re-measurement that fails to build or verify replaces
    the stored success, so it cannot win. Resumable: a restarted run skips leaders already confirmed since `since`.
    """
    from ..parser import parse_one
    from .runners import RunnerPoisoned
    winners: Dict[str, Optional[Result]] = {}
    for p in problems:
        stored = store.best(p.key(), runner.gpu, runner.protocol)
        spent = 0
        while spent < budget:
            lead = store.best(p.key(), runner.gpu, runner.protocol)
            if lead is None or (lead.confirmed is not None and lead.confirmed >= since):
                break
            outcome = runner.evaluate(parse_one(lead.spec), p)
            spent += 1
            now = time.time()
            store.record(replace(lead, status=outcome.status, tflops=outcome.tflops,
                                 baseline_tflops=outcome.baseline_tflops, speedup=outcome.speedup,
                                 reason=outcome.reason, time=now, confirmed=now))
            poisoned = getattr(runner, "poisoned", None)
            if poisoned:   # recorded as failed; the supervisor restarts this worker, which resumes here
                raise RunnerPoisoned(poisoned)
        win = winners[p.key()] = store.best(p.key(), runner.gpu, runner.protocol, confirmed_since=since)
        was = f"{stored.speedup:.3f}x" if stored is not None else "-"
        is_ = f"{win.speedup:.3f}x ({win.target})" if win is not None else "no verified kernel"
        log(f"{p.shape}: confirmed {is_} after {spent} re-measurement(s); the store's best was {was}")
    return winners


def _confirm_main(index, problems, protocol, runner_kind, store_path, since, budget):
    """Entry point of one confirming GPU worker process: sees only its GPU (CUDA_VISIBLE_DEVICES)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    from .runners import RunnerPoisoned, make_runner
    log = lambda s: print(s, file=sys.stderr, flush=True)   # noqa: E731
    try:
        confirm_leaders(problems, make_runner(runner_kind, protocol), Store(store_path), since, budget, log)
    except RunnerPoisoned as err:
        log(f"worker {index}: a kernel broke the CUDA context ({str(err)[:200]}); restarting")
        sys.exit(POISONED_EXIT)


def prebuild_leaders(problems: Sequence[Problem], store: Store, gpu: str, protocol: str, budget: int,
                     compile_workers: int, log: Callable[[str], None] = print) -> int:
    """Build every spec confirm_leaders may measure, `compile_workers` at a time, before it measures any.

    The leaders it measures are always a prefix of the stored order (a re-measured leader either holds or falls
    below the next one), so the top `budget` results per shape are all it can need. After a template change every
    stored CUTLASS leader needs nvcc again, which one measuring process would otherwise do one at a time."""
    if compile_workers < 1:
        return 0
    from .runners import precompile
    wanted = sorted({(r.spec, r.target, p.arch) for p in problems for r in store.top(p.key(), gpu, protocol, budget)})
    if not wanted:
        return 0
    import multiprocessing as mp
    with ProcessPoolExecutor(compile_workers, mp_context=mp.get_context("spawn")) as pool:
        failures = [f for f in pool.map(precompile, *zip(*wanted)) if f is not None]
    log(f"confirmation: built {len(wanted)} stored leader(s) ahead, {compile_workers} at a time "
        f"({len(failures)} failed to build: they will be recorded as failed)")
    return len(wanted)


def confirm(problems: Sequence[Problem], runner, store: Store, protocol: str, budget: int, workers: int = 1,
            log: Callable[[str], None] = print, compile_workers: int = 0) -> float:
    """Confirm every shape's leader (confirm_leaders) in this process, or, for a runner kind ("gpu"), in `workers`
    processes, one per GPU, each taking every `workers`-th shape; with `compile_workers`, the candidates are built
    first in a CPU pool (prebuild_leaders). Returns the round's start: export and Store.best take it as
    `confirmed_since`."""
    gpu = _probe_gpu_name(runner) if isinstance(runner, str) else runner.gpu
    prebuild_leaders(problems, store, gpu, protocol, budget, compile_workers, log)
    since = time.time()
    if not isinstance(runner, str):
        confirm_leaders(problems, runner, store, since, budget, log)
        return since
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    workers = max(1, min(workers, len(problems)))

    def start(i):
        pr = ctx.Process(target=_confirm_main, args=(i, list(problems[i::workers]), protocol, runner, store.path,
                                                     since, budget))
        pr.start()
        return pr

    _supervise(start, workers, log=log)
    return since


def _probe_gpu_name(kind: str) -> str:
    if kind == "gpu":
        import torch
        return torch.cuda.get_device_name(0)
    from .runners import make_runner
    return make_runner(kind).gpu


# ---------------------------------------------------------------------------------------------------
# Export: the tuned table (docs/CONTRACTS.md) and the winning .l2 specs
# ---------------------------------------------------------------------------------------------------

def export(store: Store, problems: Sequence[Problem], gpu: str, protocol: str, out_dir: Path,
           confirmed_since: Optional[float] = None) -> Dict[str, Path]:
    """Write `<arch>.json` (merged with an existing table) and `specs/*.l2`; returns the tables written. With
    `confirmed_since` (a confirm() round), a shape's winner is its best result confirmed in that round."""
    import json
    from ..parser import parse_one
    out_dir = Path(out_dir)
    (out_dir / "specs").mkdir(parents=True, exist_ok=True)
    by_arch: Dict[str, List[dict]] = {}
    for p in problems:
        best = store.best(p.key(), gpu, protocol, confirmed_since=confirmed_since)
        if best is None:
            continue
        lay = "".join(x[0] for x in (p.layout_a, p.layout_b, p.layout_c))
        name = f"gemm_{p.shape}_{p.dtype}_{lay}_{best.target}"
        text = parse_one(best.spec).to_l2()   # keeps its knob-derived name: shapes sharing it share one build
        for stale in (out_dir / "specs").glob(f"gemm_{p.shape}_{p.dtype}_{lay}_*.l2"):
            stale.unlink()   # an earlier export's winner for this shape, possibly of the other target
        (out_dir / "specs" / f"{name}.l2").write_text(text)
        by_arch.setdefault(p.arch, []).append(
            {"m": p.m, "n": p.n, "k": p.k, "batch": p.batch, "dtype": p.dtype, "layout": p.layout,
             "target": best.target, "spec": text, "tflops": best.tflops, "baseline_tflops": best.baseline_tflops,
             "speedup": best.speedup})
    written = {}
    for arch, entries in by_arch.items():
        path = out_dir / f"{arch}.json"
        table = {"format": 1, "arch": arch, "gpu": gpu, "protocol": protocol, "entries": []}
        if path.exists():
            old = json.loads(path.read_text())
            if old.get("protocol") == protocol and old.get("gpu") == gpu:
                table["entries"] = old.get("entries", [])
        key = lambda e: (e["m"], e["n"], e["k"], e.get("batch", 1), e["dtype"], e["layout"])
        merged = {key(e): e for e in table["entries"]}
        merged.update({key(e): e for e in entries})
        table["entries"] = sorted(merged.values(), key=key)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(table, indent=1) + "\n")
        tmp.replace(path)
        written[arch] = path
    return written
