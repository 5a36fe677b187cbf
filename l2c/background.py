"""Start-up work on background threads that the interpreter waits for before it finalizes.

l2c prepares what a first tuned call needs off the caller's thread: it imports the dispatcher, Triton and the
targets' builders, asks nvcc for its version, compiles small C and C++ libraries and loads them. A daemon thread
still doing that when the interpreter finalizes is ended by `pthread_exit` wherever it next takes the GIL, and
when that is inside C++ (an extension module's initialisation, torch's or Triton's pybind11 code) the unwinding
aborts the whole process ("FATAL: exception not rethrown", status -6) after the program itself has finished.
A short command such as `l2c warmup` that fails fast meets this. So these threads are joined at exit: each runs
a bounded job, and a program ends only once its start-up work has.
"""
from __future__ import annotations

import atexit
import threading
from typing import Callable, List

_lock = threading.Lock()
_threads: List[threading.Thread] = []


def start(target: Callable[[], None], name: str) -> threading.Thread:
    """Run `target` on a new daemon thread that the interpreter joins before it finalizes."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    with _lock:
        _threads.append(thread)
    thread.start()
    return thread


def join_all() -> None:
    """Wait for every thread `start` began, including those started meanwhile by the ones being waited for."""
    while True:
        with _lock:
            alive = [thread for thread in _threads if thread.is_alive()]
            _threads[:] = alive
        if not alive:
            return
        for thread in alive:
            thread.join()


atexit.register(join_all)
