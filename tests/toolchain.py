"""Markers for tests that need a tool of the machine: skipped only when the tool is truly missing."""
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
