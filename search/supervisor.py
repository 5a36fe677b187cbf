"""GPU worker processes, one per GPU: started, watched and restarted when a kernel broke one's CUDA context.

A broken context (an illegal address, a device-side assert) makes every later launch in that process fail, so
the process exits POISONED_EXIT and the supervisor starts a fresh one, which resumes where it stopped.
"""
from __future__ import annotations

import time
from typing import Callable

POISONED_EXIT = 3                                    # a worker process whose CUDA context a kernel broke
MAX_RESTARTS = 50


def supervise(start: Callable[[int], object], workers: int, on_restart: Callable[[], None] = lambda: None,
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


def probe_gpu_name(kind: str) -> str:
    """The GPU a runner kind's worker processes will measure on (the study and store key)."""
    if kind == "gpu":
        import torch
        return torch.cuda.get_device_name(0)
    from .runners import make_runner
    return make_runner(kind).gpu
