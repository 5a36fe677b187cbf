"""`l2c.background`: start-up work on a background thread is finished before the interpreter finalizes, so a
program that ends while it runs neither cuts it off nor aborts in it (a daemon thread ended inside C++ code takes
the process down with status -6). Real interpreters, real threads."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


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
        import time
        from l2c import background
        def inner():
            time.sleep(0.3)
            open({str(done)!r}, "w").write("inner")
        def outer():
            time.sleep(0.2)
            background.start(inner, "inner")
        background.start(outer, "outer")
        """)
    assert ran.returncode == 0, ran.stderr
    assert done.read_text() == "inner"


def test_a_command_that_imports_the_dispatcher_ends_with_its_own_status():
    """The dispatcher's import starts the toolchain query (nvcc, Triton's import, the shim's compile): a command
    that returns at once still exits with its own status once that work is done."""
    ran = _run("""
        import sys
        import l2c.dispatch
        sys.exit(3)
        """)
    assert ran.returncode == 3, ran.stderr
