"""`l2c.background`: start-up work on a background thread is finished before the interpreter finalizes, so a
program that ends while it runs neither cuts it off nor aborts in it (a daemon thread ended inside C++ code takes
the process down with status -6). Real interpreters, real threads."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    """`code` run by a fresh interpreter; the result's `seconds` is its wall time."""
    start = time.monotonic()
    ran = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, **env))
    ran.seconds = time.monotonic() - start
    return ran


def test_work_still_running_when_the_program_ends_is_finished_first(tmp_path):
    done = tmp_path / "done"
    ran = _run(f"""
        import time
        from l2c import background
        def slow():
            time.sleep(0.5)
            open({str(done)!r}, "w").write("finished")
        background.start(slow, "slow")
        """)
    assert ran.returncode == 0, ran.stderr
    assert done.read_text() == "finished"


def test_threads_started_by_a_background_thread_are_waited_for_too(tmp_path):
    done = tmp_path / "done"
    ran = _run(f"""
        import threading, time
        from l2c import background
        started = threading.Event()
        def inner():
            time.sleep(0.3)
            open({str(done)!r}, "w").write("inner")
        def outer():
            background.start(inner, "inner")
            started.set()
        background.start(outer, "outer")
        started.wait()
        """)
    assert ran.returncode == 0, ran.stderr
    assert done.read_text() == "inner"


def test_no_thread_starts_once_the_exit_has_begun(tmp_path):
    started = tmp_path / "started"
    ran = _run(f"""
        import time
        from l2c import background
        def late():
            while not background.exiting():   # the program ends: its exit waits for this thread
                time.sleep(0.01)
            open({str(started)!r}, "w").write(repr(background.start(lambda: None, "too late")))
        background.start(late, "late")
        """)
    assert ran.returncode == 0, ran.stderr
    assert started.read_text() == "None"


def test_the_exit_does_not_wait_for_a_thread_waiting_on_a_process():
    """A compile in the background (a subprocess: no C++ frame on the thread) does not hold the program's exit."""
    ran = _run("""
        import subprocess, time
        from l2c import background
        def compile_for_long():
            with background.waiting_on_a_process():
                subprocess.run(["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        background.start(compile_for_long, "compiler")
        time.sleep(0.2)
        """)
    assert ran.returncode == 0, ran.stderr
    assert ran.seconds < 15


def test_a_command_that_imports_the_dispatcher_ends_with_its_own_status():
    """The dispatcher's import starts the toolchain query (nvcc, Triton's import, the shim's compile): a command
    that returns at once still exits with its own status once that work is done."""
    ran = _run("""
        import sys
        import l2c.dispatch
        sys.exit(3)
        """)
    assert ran.returncode == 3, ran.stderr


def test_importing_l2c_after_torch_loads_what_the_first_access_needs_off_the_calling_thread():
    """`import l2c` in a PyTorch program starts the warm start: the dispatcher, l2c.ops (whose custom ops cost tens of
    milliseconds to register) and l2c.nn are imported on a background thread, so a later `l2c.matmul` finds them
    loaded; with L2C_WARM_START=0 nothing is imported ahead."""
    code = """
        import sys
        import torch
        import l2c
        from l2c import background
        background.join_all()
        print(all(name in sys.modules for name in ("l2c.dispatch", "l2c.ops", "l2c.nn")))
        """
    on = _run(code)
    assert on.returncode == 0 and on.stdout.strip() == "True", on.stderr
    off = _run(code, L2C_WARM_START="0")
    assert off.returncode == 0 and off.stdout.strip() == "False", off.stderr


def test_the_start_up_steps_are_marked_in_order_with_their_threads():
    """What a first call's measurement reads to tell which start-up steps were done before it: on the CPU the
    front end (on the importing thread), then on the start-up thread what a first call of a prebuilt CUTLASS kernel
    needs (the call-plan shim) before each target's toolchain and builder (Triton's import, its library read ahead
    of it), each marked after the one before."""
    ran = _run("""
        import json
        import torch
        import l2c.dispatch
        from l2c import background
        background.join_all()
        print(json.dumps(background.timeline()))
        """)
    assert ran.returncode == 0, ran.stderr
    marks = json.loads(ran.stdout.strip().splitlines()[-1])
    steps = [step for step, _, _ in marks]
    assert steps == ["front end", "call-plan shim", "triton libraries read", "triton toolchain and builder",
                     "cutlass toolchain and builder"]
    assert marks[0][1] != "l2c-start-up" and {thread for _, thread, _ in marks[1:]} == {"l2c-start-up"}
    times = [t for _, _, t in marks]
    assert times == sorted(times)


def test_a_thread_that_never_finishes_holds_the_exit_for_the_bound_only():
    """A stuck start-up thread cannot keep a program from ending: `join_all` gives up at its timeout, and the exit
    waits `EXIT_WAIT_S` at most."""
    ran = _run("""
        import threading, time
        from l2c import background
        background.EXIT_WAIT_S = 1.0
        background.start(threading.Event().wait, "stuck")
        start = time.monotonic()
        print(background.join_all(0.2), time.monotonic() - start)
        """)
    assert ran.returncode == 0, ran.stderr
    gave_up, seconds = ran.stdout.split()
    assert gave_up == "False" and 0.2 <= float(seconds) < 1.0


def test_work_after_the_first_call_waits_for_it_or_the_limit_and_never_past_the_exit(tmp_path):
    """`after_first_call`: returns as soon as a tuned call was resolved, else at its limit; False once the exit has
    begun, at once, so a program that ends meanwhile does not wait out the limit."""
    ran = _run("""
        import json, threading, time
        from l2c import background
        t = time.monotonic(); limit = background.after_first_call(0.3); waited = time.monotonic() - t
        t = time.monotonic(); threading.Timer(0.2, background.first_call_resolved).start()
        called = background.after_first_call(30); at_call = time.monotonic() - t
        t = time.monotonic(); again = background.after_first_call(30); after = time.monotonic() - t
        print(json.dumps([limit, waited, called, at_call, again, after]))
        """)
    assert ran.returncode == 0, ran.stderr
    limit, waited, called, at_call, again, after = json.loads(ran.stdout.strip().splitlines()[-1])
    assert limit and waited >= 0.3 and called and 0.2 <= at_call < 20 and again and after < 1
    never = tmp_path / "never"
    ending = _run(f"""
        from l2c import background
        def late():
            if background.after_first_call(30):
                open({str(never)!r}, "w")
        background.start(late, "late")
        """)
    assert ending.returncode == 0 and ending.seconds < 20 and not never.exists(), ending.stderr


def test_the_builders_wait_for_the_first_tuned_call():
    """The start-up imports the targets' builders (Triton's import: most of a second) only after the first tuned
    call was resolved or BUILDERS_AFTER_S have passed, so that it does not compete with that call for the
    interpreter: with no call, their marks come that long after the call-plan shim's at least."""
    ran = _run("""
        import json
        import torch
        import l2c.dispatch
        from l2c import background
        background.join_all()
        print(json.dumps([l2c.dispatch.BUILDERS_AFTER_S, background.timeline()]))
        """)
    assert ran.returncode == 0, ran.stderr
    limit, marks = json.loads(ran.stdout.strip().splitlines()[-1])
    at = {step: t for step, _, t in marks}
    assert at["triton toolchain and builder"] - at["call-plan shim"] >= limit > 0


def _bytes_read() -> int:
    """Bytes this process has read through read(2) and the like (Linux `/proc/self/io`, `rchar`)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_read_ahead_reads_each_file_whole_and_skips_what_it_cannot_read(tmp_path):
    """`read_ahead` puts files in the page cache by reading them (a dlopen after it then reads nothing from disk
    under the loader's lock): every byte of each readable file is read, in chunks of READ_CHUNK; a missing file or a
    folder is skipped, never raised."""
    from l2c import background
    sizes = (0, 1, background.READ_CHUNK - 1, background.READ_CHUNK + 12345)
    files = []
    for i, size in enumerate(sizes):
        files.append(tmp_path / f"lib{i}.so")
        files[-1].write_bytes(os.urandom(size))
    before = _bytes_read()
    background.read_ahead([tmp_path / "missing.so", tmp_path, *files])
    assert sum(sizes) <= _bytes_read() - before < sum(sizes) + 64 * 1024


def test_the_triton_target_names_its_compiler_library_without_importing_triton():
    """What the start-up reads ahead of Triton's import: the installed package's `_C/libtriton*.so`, found without
    importing triton (that import is the load the read-ahead is for)."""
    ran = _run("""
        import sys
        from l2c import targets
        libraries = targets.get("triton").native_libraries()
        print(libraries, "triton" in sys.modules, targets.get("cutlass").native_libraries())
        """, L2C_WARM_START="0")
    assert ran.returncode == 0, ran.stderr
    line = ran.stdout.strip().splitlines()[-1]
    assert line.endswith(" False []") and "/triton/_C/libtriton" in line and ".so'" in line


def test_a_process_forked_right_after_import_uses_l2c_and_the_fork_waits_only_for_the_start_up(tmp_path):
    """A fork while the warm start imports (a multiprocessing pool made just after `import l2c`) used to leave the
    child a module's import lock that no thread of its own releases: its first l2c call waited forever. The fork now
    waits for the start-up's imports, and the child's calls run; no fork handler complains."""
    ran = _run("""
        import faulthandler, os, sys, time
        import torch
        import l2c
        time.sleep(0.02)   # the warm start's thread is importing now
        pid = os.fork()
        if pid == 0:
            faulthandler.dump_traceback_later(40, exit=True)   # a hang fails the test instead of holding it
            y = l2c.matmul(torch.ones(4, 8), torch.ones(8, 2))
            os._exit(0 if y.shape == (4, 2) and float(y[0, 0]) == 8.0 else 5)
        print("child status", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """, L2C_CACHE_DIR=str(tmp_path))
    assert ran.returncode == 0 and "child status 0" in ran.stdout, ran.stdout + ran.stderr[-3000:]
    assert "Exception ignored" not in ran.stderr, ran.stderr[-3000:]


def test_a_job_asked_for_while_the_preparation_thread_ends_is_served_and_a_forked_child_forgets_the_parents():
    """The preparation thread's idle exit and a request racing with it (the thread made to linger past its last
    look at the queue): the request starts a new thread, so the job ends and `wait` returns. In a child forked with a
    job queued, that job, which the parent's thread serves, is forgotten: the child's `wait` returns at once."""
    ran = _run("""
        import os, threading, time
        from l2c.prepare import Job, Preparer
        leaving = threading.Event()
        def linger(frame, event, arg):   # timing only: the serving thread lingers as it ends
            if frame.f_code.co_name != "_serve":
                return None
            def local(f, ev, a):
                if ev == "return":
                    leaving.set()
                    time.sleep(0.5)
                return local
            return local
        threading.settrace(linger)
        p = Preparer(idle_exit_s=0.3)
        first, second = (Job(f"kernel broken{i} {{ tile m=", "triton", "sm_90", 32, 48, 40, "cpu") for i in (1, 2))
        p.request(first)
        assert p.wait(60) and p.state(first) == "failed"
        assert leaving.wait(30)
        p.request(second)
        print("second", p.wait(20), p.state(second))
        threading.settrace(None)
        third = Job("kernel broken3 { tile m=", "triton", "sm_90", 32, 48, 40, "cpu")
        p.request(third)
        pid = os.fork()
        if pid == 0:
            start = time.monotonic()
            ok = p.wait(10)
            os._exit(0 if ok and p.state(third) is None and time.monotonic() - start < 1 else 5)
        print("child status", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), "parent", p.wait(60))
        """)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "second True failed" in ran.stdout and "child status 0 parent True" in ran.stdout, ran.stdout


def test_a_fork_inside_a_start_up_section_leaves_the_section_in_both_processes():
    ran = _run("""
        import os
        from l2c import background
        with background.fork_unsafe():
            pid = os.fork()
        if pid == 0:
            with background.fork_unsafe():   # the child's own sections work as the parent's
                pass
            os._exit(0)
        print("child status", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """)
    assert ran.returncode == 0 and "child status 0" in ran.stdout and not ran.stderr, ran.stderr


def test_a_preparation_thread_that_could_not_start_is_started_by_the_next_request(monkeypatch):
    """A thread start that fails (a thread limit, the interpreter's shutdown) raises to the request that made it and
    records nothing: the next request starts the thread, and its job ends."""
    import threading
    import pytest
    from l2c.prepare import Job, Preparer
    real_start, failures = threading.Thread.start, [RuntimeError("can't start new thread")]

    def start_once_failing(thread):
        if failures:
            raise failures.pop()
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_once_failing)
    p = Preparer(idle_exit_s=0.3)
    first, second = (Job(f"kernel broken{i} {{ tile m=", "triton", "sm_90", 32, 48, 40, "cpu") for i in (1, 2))
    with pytest.raises(RuntimeError):
        p.request(first)
    p.request(second)
    assert p.wait(60) and p.state(second) == "failed"
