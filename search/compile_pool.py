"""The compile pool: CPU processes that build candidates ahead of measurement, so the measuring process finds them
in the build cache. Why batched: a CUTLASS kernel alone costs 34-47 s of one core in nvcc, nearly all of it
parsing the CUTLASS headers and instantiating their templates; in one nvcc run of 8 about 10 s each
(`l2c.build.prebuild_many`, benchmarks/NOTES.md). One kernel per nvcc run made a CUTLASS tune compiler-bound.

The candidates a trial round asks for (`CompilePool.request`) are held until `flush`, then grouped the way the
CUTLASS builder groups kernels into nvcc runs (`plan_jobs`: at least one run per idle process, at most
`BATCH_SIZE` kernels each); each group is one pool job and one nvcc run. A Triton candidate is a job of its own
(Triton compiles kernel by kernel). A build failure is the candidate's (`Built.failure`: recorded, never a
winner) and never stops the others; a job lost with its process gives no verdict, and the measuring process then
builds that candidate itself and gets its own.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

Request = Tuple[str, str, str]   # (spec text, target, arch)
log = logging.getLogger("l2c.search")


@dataclass(frozen=True)
class Built:
    """What the pool made of one candidate."""
    failure: Optional[str] = None   # why it failed to build ("build: ..."); None: built, or no job gave a verdict
    seconds: float = 0.0            # its share of the pool's time: the job's wall time, shared evenly by the
                                    # kernels the job's compiler run(s) compiled
    kernels: int = 0                # kernels in the compiler run that built it (0: cached, failed before, or lost)


def build_batch(requests: Sequence[Request]) -> List[Built]:
    """One pool job, run in a pool process: the requests' specs parsed and validated, then built together by
    `l2c.build.prebuild_many` with one compiler at a time (one nvcc run for up to BATCH_SIZE CUTLASS kernels;
    a run that fails is split until each failing kernel has the verdict it gets alone). Never raises: a spec that
    fails anywhere on the way is a failed candidate, and the others still build."""
    from ..build import prebuild_many
    from ..parser import parse_one
    from ..validate import validate
    start = time.perf_counter()
    failures: Dict[int, str] = {}
    valids = {}
    for i, (text, target, arch) in enumerate(requests):
        try:
            valids[i] = validate(parse_one(text, file="<search>"), target, arch)
        except Exception as err:  # noqa: BLE001 - a spec that does not validate here fails as a candidate
            failures[i] = f"build: {type(err).__name__}: {err}"
    order = list(valids)
    kernels = [0] * len(requests)

    def done(j, outcome, compiled):
        kernels[order[j]] = compiled

    for i, outcome in zip(order, prebuild_many([valids[i] for i in order], 1, done)):
        if not isinstance(outcome, str):
            failures[i] = f"build: {outcome}"
    elapsed = time.perf_counter() - start
    weights = [1 if k else 0 for k in kernels]
    if not any(weights):   # nothing compiled (cached, or failed before): the job's time is everyone's
        weights = [1] * len(requests)
    total = sum(weights) or 1
    return [Built(failures.get(i), elapsed * weights[i] / total, kernels[i]) for i in range(len(requests))]


def plan_jobs(members: Sequence[Tuple[str, str]], free: int) -> List[List[int]]:
    """Indices of `(target, spec name)` members grouped into pool jobs: the CUTLASS ones as
    `l2c.targets.cutlass.build.plan_batches` groups kernels into nvcc runs (a run per process left `free` by the
    other jobs, never more than BATCH_SIZE kernels or one kernel of a name per run), every other one alone."""
    alone = [[i] for i, (target, _) in enumerate(members) if target != "cutlass"]
    cutlass = [i for i, (target, _) in enumerate(members) if target == "cutlass"]
    if not cutlass:
        return alone
    from ..targets.cutlass.build import plan_batches
    runs = plan_batches([members[i][1] for i in cutlass], max(0, free - len(alone)))
    return [[cutlass[j] for j in run] for run in runs] + alone


def _warm() -> None:
    """A pool process's start: import what a job uses, so that a job's time is building."""
    from .. import build, parser, validate  # noqa: F401
    from ..targets import cutlass, triton  # noqa: F401


class Ticket:
    """One request's place in the pool: `done()` once its job finished, `result()` (waiting) its Built."""

    def __init__(self, shared: bool = False):
        self._future: Optional[Future] = None
        self._index = 0
        self._shared = shared   # the same build as an earlier request: its time is counted there

    def _attach(self, future: Future, index: int) -> None:
        self._future, self._index = future, index

    def done(self) -> bool:
        return self._future is not None and self._future.done()

    def result(self) -> Built:
        if self._future is None:
            raise RuntimeError("the compile pool was not flushed after this request")
        try:
            built = self._future.result()[self._index]
        except Exception as err:  # noqa: BLE001 - the job was lost with its process: no verdict; the runner builds it
            if self._index == 0 and not self._shared:   # once per job
                log.warning("a compile-pool job was lost (%s: %s); its candidates are built where they are "
                            "measured", type(err).__name__, err)
            return Built()
        return replace(built, seconds=0.0) if self._shared else built


class CompilePool:
    """`workers` spawned CPU processes (a forked child of a CUDA process cannot use CUDA) building requests in
    batched jobs. `request` holds a candidate; `flush` sends everything held as jobs (`plan_jobs`)."""

    def __init__(self, workers: int):
        self.workers = max(1, workers)
        self._executor = self._start()
        self._held: Dict[Request, Tuple[str, List[Ticket]]] = {}   # request -> (spec name, its tickets)
        self._sent: Dict[Request, Ticket] = {}                    # requests in jobs not yet finished
        self._jobs: List[Future] = []

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"), initializer=_warm)

    def request(self, spec, target: str, arch: str) -> Ticket:
        """Hold a build of `spec` (a KernelSpec) for `target` and `arch` until the next `flush`. A request for a
        build already held or in a job shares it."""
        key = (spec.to_l2(), target, arch)
        if key in self._held:
            ticket = Ticket(shared=True)
            self._held[key][1].append(ticket)
            return ticket
        sent = self._sent.get(key)
        if sent is not None and not sent.done():
            ticket = Ticket(shared=True)
            ticket._attach(sent._future, sent._index)
            return ticket
        ticket = Ticket()
        self._held[key] = (spec.name, [ticket])
        return ticket

    def flush(self) -> None:
        """Send every held request, grouped into jobs for the processes now idle (more per job when none is)."""
        if not self._held:
            return
        self._jobs = [f for f in self._jobs if not f.done()]
        self._sent = {k: t for k, t in self._sent.items() if not t.done()}
        keys = list(self._held)
        for job in plan_jobs([(key[1], self._held[key][0]) for key in keys], self.workers - len(self._jobs)):
            future = self._submit([keys[i] for i in job])
            self._jobs.append(future)
            for index, i in enumerate(job):
                tickets = self._held[keys[i]][1]
                for ticket in tickets:
                    ticket._attach(future, index)
                self._sent[keys[i]] = tickets[0]
        self._held.clear()

    def _submit(self, requests: List[Request]) -> Future:
        try:
            return self._executor.submit(build_batch, requests)
        except BrokenProcessPool:   # a process died (its jobs' candidates are built by the runner): start anew
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = self._start()
            return self._executor.submit(build_batch, requests)

    def build(self, requests: Sequence[Tuple[object, str, str]]) -> List[Built]:
        """Request each `(spec, target, arch)`, flush, and wait for every result."""
        tickets = [self.request(*r) for r in requests]
        self.flush()
        return [t.result() for t in tickets]

    def shutdown(self) -> None:
        self._executor.shutdown(cancel_futures=True)

    def __enter__(self) -> "CompilePool":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
