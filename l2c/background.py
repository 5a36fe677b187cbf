"""Start-up work on background threads that the interpreter waits for before it finalizes.

l2c prepares what a first tuned call needs off the caller's thread: it imports the dispatcher, Triton and the
targets' builders, asks nvcc for its version, compiles small C and C++ libraries and loads them. A daemon thread
still doing that when the interpreter finalizes is ended by `pthread_exit` wherever it next takes the GIL, and
when that is inside C++ (an extension module's initialisation, torch's or Triton's pybind11 code) the unwinding
aborts the whole process ("FATAL: exception not rethrown", status -6) after the program itself has finished.
A short command such as `l2c warmup` that fails fast meets this.

Each step of that start-up is marked (`mark`) with the thread that did it and the time it ended, and so are a
kernel's load and check on a caller's thread, so a measurement of a first call can tell which steps were done before
it and where its own time went (`timeline`).

So at exit these threads are joined, except while one waits on a compiler (`waiting_on_a_process`): a thread
blocked in a subprocess holds no C++ frame and is ended safely, so a program that exits during the C++ call table's
first compile (seconds to a minute, once per machine) does not wait for it; such a thread stops at the end of its
wait instead of going on into C++. No thread starts once the exit has begun, and the exit waits `EXIT_WAIT_S` at
most, so no stuck thread holds a program at its end.
"""
from __future__ import annotations

import atexit
import os
import threading
import time
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, Set

EXIT_WAIT_S = 60.0
FORK_WAIT_S = 10.0   # the longest a fork waits for the start-up's imports (`fork_unsafe`)

_lock = threading.Lock()
_threads: List[threading.Thread] = []
_waiting: Set[threading.Thread] = set()   # threads inside `waiting_on_a_process`: not waited for at exit
_unsafe: Dict[threading.Thread, int] = {}   # threads inside `fork_unsafe` sections, and how deep
_unsafe_left = threading.Condition(_lock)
_exiting = threading.Event()
_first_call = threading.Event()   # set once a tuned call has been resolved (`first_call_resolved`)
_marks: List[tuple] = []   # (step, thread name, time.perf_counter() when it ended)


def first_call_resolved() -> None:
    """The process's first tuned call has found what serves it (a kernel or torch): start-up work that would compete
    with that call for the interpreter may begin (`after_first_call`)."""
    _first_call.set()


def after_first_call(limit_s: float) -> bool:
    """Wait until the first tuned call was resolved, `limit_s` seconds at most; False when the exit began meanwhile
    (start nothing long then)."""
    deadline = time.monotonic() + limit_s
    while not _first_call.is_set() and not _exiting.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        _first_call.wait(min(0.05, left))
    return not _exiting.is_set()


READ_CHUNK = 16 << 20


def read_ahead(paths) -> None:
    """Read each file once, into the OS page cache, stopping when the exit begins; unreadable ones are skipped.
    For a large shared library loaded next on this thread: its dlopen holds the dynamic loader's lock, which torch
    calls on other threads wait for, and reading the file from disk under that lock stalled them (Triton's 500 MB
    library: 105-154 ms with a cold page cache, 20-29 ms read ahead first; benchmarks/NOTES.md, "#19"). The reads
    themselves release the interpreter and take no lock others wait on."""
    buffer = bytearray(READ_CHUNK)
    for path in paths:
        try:
            with open(path, "rb", buffering=0) as f:
                while not _exiting.is_set() and f.readinto(buffer):
                    pass
        except OSError:
            continue


def exiting() -> bool:
    """Whether the interpreter is ending: start no long step now."""
    return _exiting.is_set()


def mark(step: str) -> None:
    """Record that a start-up step ended now, on this thread."""
    _marks.append((step, threading.current_thread().name, time.perf_counter()))


def timeline() -> List[tuple]:
    """The start-up steps marked so far: (step, thread name, time.perf_counter() when it ended), in order."""
    return list(_marks)


def start(target: Callable[[], None], name: str) -> Optional[threading.Thread]:
    """Run `target` on a new daemon thread that the interpreter joins before it finalizes; None (nothing started)
    once the exit has begun."""
    with _lock:
        if _exiting.is_set():
            return None
        thread = threading.Thread(target=target, name=name, daemon=True)
        try:
            thread.start()
        except RuntimeError:   # Python 3.12 starts no thread once its own shutdown has begun
            return None
        _threads.append(thread)
    return thread


@contextmanager
def waiting_on_a_process() -> Iterator[None]:
    """Marks a wait on a subprocess (a compiler): the exit does not wait for this thread meanwhile, and if the exit
    began during the wait, the thread parks at its end, in Python, where the interpreter ends it safely."""
    me = threading.current_thread()
    with _lock:
        _waiting.add(me)
    try:
        yield
    finally:
        with _lock:   # (the main thread, ending the program itself, goes on)
            parked = _exiting.is_set() and me is not threading.main_thread()
            if not parked:
                _waiting.discard(me)
        if parked:
            threading.Event().wait()


@contextmanager
def fork_unsafe() -> Iterator[None]:
    """Marks start-up work that imports modules or holds l2c's locks: a process forked meanwhile would inherit a
    lock held by a thread it does not have, and its first use of what the lock guards would wait forever (a fork
    soon after `import l2c`: a multiprocessing pool's workers). A fork waits for these sections to end, FORK_WAIT_S
    at most."""
    me = threading.current_thread()
    with _lock:
        _unsafe[me] = _unsafe.get(me, 0) + 1
    try:
        yield
    finally:
        with _lock:   # (a child forked inside the section starts with none: `_in_child`)
            depth = _unsafe.pop(me, 1) - 1
            if depth:
                _unsafe[me] = depth
            else:
                _unsafe_left.notify_all()


def _before_fork() -> None:
    me = threading.current_thread()
    with _lock:   # a section of the forking thread itself cannot end while it waits
        _unsafe_left.wait_for(lambda: not (set(_unsafe) - {me}), timeout=FORK_WAIT_S)


def _in_child() -> None:
    """The child has only the thread that forked: none of the parent's others runs or holds a lock here."""
    global _lock, _unsafe_left
    _lock = threading.Lock()
    _unsafe_left = threading.Condition(_lock)
    _threads.clear()
    _waiting.clear()
    _unsafe.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_in_child)


def join_all(timeout: Optional[float] = None) -> bool:
    """Wait for every thread `start` began (those started meanwhile by the ones waited for too), except those
    waiting on a process, for `timeout` seconds at most; True when none is left to wait for."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _lock:
            _threads[:] = [thread for thread in _threads if thread.is_alive()]
            running = [thread for thread in _threads if thread not in _waiting]
        if not running:
            return True
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        running[0].join(0.05 if left is None else min(0.05, left))   # a thread may begin waiting on a process


def _join_at_exit() -> None:
    with _lock:
        _exiting.set()
    join_all(EXIT_WAIT_S)


atexit.register(_join_at_exit)
