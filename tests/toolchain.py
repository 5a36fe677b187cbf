"""Markers for tests that need a tool of the machine: skipped only when the tool is truly missing; and a way to run a
script as on a machine without the CUTLASS wheel."""
import subprocess
import sys

import pytest

from l2c.targets.cutlass.toolchain import find_nvcc
from l2c.errors import BuildError


def nvcc_missing() -> bool:
    try:
        find_nvcc()
        return False
    except BuildError:
        return True


needs_nvcc = pytest.mark.skipif(nvcc_missing(), reason="nvcc (CUDA toolkit) is not installed: CUTLASS kernels "
                                                       "cannot be compiled on this machine")


def run_without_cutlass_wheel(argv, timeout: float) -> subprocess.CompletedProcess:
    """Run the Python script `argv[0]` with `argv[1:]` in a process where `cutlass_library` (the nvidia-cutlass
    wheel, the CUTLASS headers) cannot be imported, as on a machine where it is not installed."""
    code = ("import runpy, sys; sys.modules['cutlass_library'] = None; "
            f"sys.argv = {[str(a) for a in argv]!r}; runpy.run_path(sys.argv[0], run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
