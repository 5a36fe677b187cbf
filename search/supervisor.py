"""GPU worker processes, one per GPU: started, watched and restarted when a kernel broke one's CUDA context or
hung it.

A broken context (an illegal address, a device-side assert) makes every later launch in that process fail, so
the process exits POISONED_EXIT and the supervisor starts a fresh one, which resumes where it stopped. A kernel
that never finishes (a hang) never returns to the trial loop: a worker that has evaluated one trial for longer than
the tune's `trial_timeout_s` is killed (which ends its kernel with its CUDA context) and started again the same
way; its trial is then a lost one (search/recovery.py: lost twice, a failed candidate).
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

POISONED_EXIT = 3                                    # a worker process whose CUDA context a kernel broke
MAX_RESTARTS = 50


def supervise(start: Callable[[int], object], workers: int, on_restart: Callable[[], None] = lambda: None,
              tick: Callable[[], None] = lambda: None, log: Callable[[str], None] = print,
              busy_since: Optional[Sequence[Callable[[], float]]] = None, trial_timeout_s: float = 0.0,
              poll_s: float = 1.0) -> None:
    """Run `workers` processes (`start(i)` starts number i) to the end; one that exits POISONED_EXIT (a kernel
    broke its CUDA context), or that `busy_since[i]()` says has evaluated one trial for more than `trial_timeout_s`
    (killed here), is started again, after `on_restart`, up to MAX_RESTARTS times in all."""
    procs = [start(i) for i in range(workers)]
    restarts = 0
    try:
        while True:
            for i, pr in enumerate(procs):
                since = busy_since[i]() if busy_since is not None and trial_timeout_s > 0 else 0.0
                if since and pr.is_alive() and time.time() - since > trial_timeout_s:
                    log(f"worker {i}: one trial ran past the {trial_timeout_s:g} s limit (a kernel that hangs?); "
                        f"stopping it")
                    pr.kill()
                    pr.join()
                    pr.exitcode_override = POISONED_EXIT
                if _exit_status(pr) == POISONED_EXIT and restarts < MAX_RESTARTS:
                    on_restart()
                    restarts += 1
                    procs[i] = start(i)
            tick()
            if not any(pr.is_alive() for pr in procs) and (
                    restarts >= MAX_RESTARTS or all(_exit_status(pr) != POISONED_EXIT for pr in procs)):
                break
            time.sleep(poll_s)
    finally:
        for pr in procs:
            pr.join()
    bad = [pr.exitcode for pr in procs if pr.exitcode]
    if bad:
        log(f"{len(bad)} worker(s) exited with status {bad}; rerun the same command to resume")


def _exit_status(pr) -> Optional[int]:
    """A process's exit code, POISONED_EXIT for one killed here for running past the trial time limit."""
    return getattr(pr, "exitcode_override", None) or pr.exitcode


def probe_gpu_name(kind: str) -> str:
    """The GPU a runner kind's worker processes will measure on (the study and store key)."""
    if kind == "gpu":
        import torch
        return torch.cuda.get_device_name(0)
    from .runners import make_runner
    return make_runner(kind).gpu
