"""Kernel preparation off the caller's thread: build and verify in a background worker process.

A tuned kernel that is not built yet costs nvcc tens of seconds, and a Triton kernel's first launch compiles
for about a second; neither may happen inside a user's forward pass. The dispatcher hands each (kernel, call
shape) it would like to serve to a `Preparer`, keeps running torch for that call, and serves the kernel only
once the worker reports it built and verified (fresh random inputs against the reference, on the same GPU).

The worker is a separate process (`python -m l2c.prepare`): its CUDA context cannot disturb the caller's
streams or a CUDA-graph capture in progress, a kernel that crashes takes down only the worker, and what it
builds lands in the shared build caches (l2c's content-hashed cache for CUTLASS libraries and Triton modules,
Triton's own cache for compiled binaries), so the caller's own build of the same kernel is a cache hit.
The worker starts on the first request and exits after `IDLE_EXIT_S` without work.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import queue
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from . import settings

log = logging.getLogger("l2c.prepare")

IDLE_EXIT_S = 30.0
JOB_TIMEOUT_S = 900.0   # L2C_PREPARE_TIMEOUT_S: one job's limit; a CUTLASS build alone is 35-60 s of one core


def job_timeout_s() -> float:
    """How long the worker may spend on one job (L2C_PREPARE_TIMEOUT_S, default JOB_TIMEOUT_S); a value that is not
    a number of seconds a timer can wait (positive, at most threading.TIMEOUT_MAX) is warned of once and the
    default used."""
    text = settings.value("L2C_PREPARE_TIMEOUT_S")
    if text is None:
        return JOB_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if 0 < value <= threading.TIMEOUT_MAX:
        return value
    _warn_timeout(text)
    return JOB_TIMEOUT_S


@functools.lru_cache(maxsize=None)
def _warn_timeout(text: str) -> None:
    log.warning("l2c: L2C_PREPARE_TIMEOUT_S=%r is not a number of seconds (positive, finite); using %g", text,
                JOB_TIMEOUT_S)


QUEUED, READY, FAILED = "queued", "ready", "failed"


@dataclass(frozen=True)
class Job:
    """One kernel to build and verify at one call shape; or, with `candidates` (an online-tuning job, see
    l2c.online), the candidate specs to build, verify and time against torch there, `spec_text` empty."""
    spec_text: str
    target: str
    arch: str
    m: int
    n: int
    k: int
    device: str          # "cuda" or "cpu" (the Triton interpreter, in tests)
    candidates: Tuple[str, ...] = ()
    bias: bool = False
    activation: str = "none"

    @property
    def key(self) -> Tuple:
        return (self.spec_text, self.target, self.arch, self.m, self.n, self.k, self.device, tuple(self.candidates),
                self.bias, self.activation)

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "candidates": list(self.candidates)})


class Preparer:
    """Queues jobs for one worker process and records each job's outcome: queued, ready or failed."""

    def __init__(self, idle_exit_s: float = IDLE_EXIT_S):
        self.idle_exit_s = idle_exit_s
        self._state: Dict[Tuple, str] = {}
        self._reasons: Dict[Tuple, str] = {}
        self._queue: "queue.Queue[Job]" = queue.Queue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._thread: Optional[threading.Thread] = None
        self.seconds: Dict[Tuple, float] = {}   # wall time the worker spent on each job
        self.replies: Dict[Tuple, dict] = {}    # each finished job's reply (an online job's winner is in it)
        _PREPARERS.add(self)

    def state(self, job: Job) -> Optional[str]:
        return self._state.get(job.key)

    def reason(self, job: Job) -> str:
        return self._reasons.get(job.key, "")

    def request(self, job: Job) -> str:
        """The job's state, queueing it the first time it is asked for."""
        state = self._state.get(job.key)
        if state is not None:
            return state
        with self._lock:
            if job.key in self._state:
                return self._state[job.key]
            self._state[job.key] = QUEUED
            self._pending += 1
            self._queue.put(job)
            if self._thread is None:   # (None from the serving thread's own exit, under this lock)
                self._thread = _started(self._serve)
        return QUEUED

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until every queued job has an outcome; False if `timeout` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def reply(self, job: Job) -> dict:
        return self.replies.get(job.key, {})

    def _finish(self, job: Job, ok: bool, reason: str, seconds: float, reply: Optional[dict] = None) -> None:
        with self._idle:
            self.replies[job.key] = reply or {}
            self._state[job.key] = READY if ok else FAILED
            if not ok:
                self._reasons[job.key] = reason
            self.seconds[job.key] = seconds
            self._pending -= 1
            self._idle.notify_all()
        if not ok:
            log.warning("tuned kernel not served (torch runs this call): %s at %dx%dx%d: %s",
                        job.spec_text.split("{", 1)[0].strip(), job.m, job.n, job.k, reason)

    def _serve(self) -> None:
        worker: Optional[subprocess.Popen] = None
        try:
            while True:
                try:
                    job = self._queue.get(timeout=self.idle_exit_s)
                except queue.Empty:
                    return
                start = time.monotonic()
                try:
                    if worker is None or worker.poll() is not None:
                        worker = _start_worker()
                    worker.stdin.write(job.to_json() + "\n")
                    worker.stdin.flush()
                    limit = job_timeout_s()
                    timer = threading.Timer(limit, worker.kill)   # a job that hangs stops its worker
                    timer.start()
                    try:
                        line = worker.stdout.readline()
                    finally:
                        timer.cancel()
                    if not line and time.monotonic() - start >= limit:
                        reply = {"ok": False, "reason": f"the preparation worker took longer than {limit:g} s "
                                                        "(L2C_PREPARE_TIMEOUT_S): stopped"}
                        worker.wait()
                    else:
                        reply = json.loads(line) if line else {"ok": False, "reason": _died(worker)}
                    if not isinstance(reply, dict):
                        raise ValueError(f"a reply that is not an object: {line[:200]!r}")
                except Exception as err:  # noqa: BLE001 - whatever goes wrong, the job ends (torch serves it)
                    reply = {"ok": False, "reason": f"the preparation worker failed: {type(err).__name__}: {err}"}
                    worker = _stop(worker)
                self._finish(job, bool(reply.get("ok")), str(reply.get("reason", "")), time.monotonic() - start,
                             reply)
        finally:
            _stop(worker)
            with self._lock:   # a request from now on starts a new thread; one queued just before, this ends
                self._thread = _started(self._serve) if not self._queue.empty() else None

    def forget_in_child(self) -> None:
        """In a child forked from this process: the serving thread and its worker stayed in the parent, so the jobs
        not finished there are forgotten (a later call asks again) and the locks are new (one may have been held)."""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue = queue.Queue()
        self._thread = None
        for key, state in list(self._state.items()):
            if state == QUEUED:
                del self._state[key]
        self._pending = 0


def _started(serve) -> threading.Thread:
    """A started serving thread; the error of a start that failed (a thread limit, the interpreter's shutdown) is
    raised before anything records the thread, so the next request tries again."""
    thread = threading.Thread(target=serve, name="l2c-prepare", daemon=True)
    thread.start()
    return thread


_PREPARERS: "weakref.WeakSet[Preparer]" = weakref.WeakSet()


def _in_child() -> None:
    for preparer in list(_PREPARERS):
        preparer.forget_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)


def _start_worker() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "l2c.prepare"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=dict(os.environ), bufsize=1)


def _died(worker: subprocess.Popen) -> str:
    code = worker.wait()
    return f"the preparation worker exited with status {code} while building or verifying this kernel"


def _stop(worker: Optional[subprocess.Popen]) -> None:
    if worker is not None and worker.poll() is None:
        try:
            worker.stdin.close()
            worker.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            worker.kill()
    return None


def prepare_one(job: Job) -> Tuple[bool, str, Optional[object]]:
    """Build `job`'s kernel and verify it at its shape (what the worker does for each request): (ok, why not,
    the built kernel or None)."""
    from .build import build
    from .errors import BuildError, L2Error
    from .parser import parse_one
    from .validate import validate
    from .verify import verify
    try:
        kernel = build(validate(parse_one(job.spec_text, file="<tuned table>"), job.target, job.arch))
    except (L2Error, BuildError) as err:
        return False, f"build failed: {err}", None
    result = verify(kernel, job.m, job.n, job.k, device=job.device)
    return result.ok, "" if result.ok else f"verification failed: {result.reason}", kernel


def _release_device_memory() -> None:
    """Hand the GPU memory a job's inputs took back to the driver before replying: the worker idles up to
    IDLE_EXIT_S with its CUDA context, and verifying one large weight (an LLM's lm_head: about 9 GiB) would
    otherwise stay cached in it, beside the caller's own tensors (and every other dispatcher's worker)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def main() -> int:
    """The worker: one JSON job a line on stdin, one JSON reply a line on stdout, until stdin closes."""
    out = sys.stdout
    sys.stdout = sys.stderr   # anything a compiler or library prints must not corrupt the replies
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = {}
        try:
            fields = json.loads(line)
            job = Job(**{**fields, "candidates": tuple(fields.get("candidates", ()))})
            if job.candidates:
                from .online import tune_one
                choice = tune_one(list(job.candidates), job.m, job.n, job.k, job.bias, job.activation, job.device)
                ok, reason = True, choice.note
                reply = {"spec": choice.spec, "speedup": choice.speedup, "timings": choice.timings,
                         "timed": choice.timed}
            else:
                ok, reason, _ = prepare_one(job)
        except Exception as err:  # noqa: BLE001 - every failure is a reply, never a dead worker
            ok, reason = False, f"{type(err).__name__}: {err}"
        _release_device_memory()
        out.write(json.dumps({"ok": ok, "reason": reason, **reply}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
