"""Shared test setup. Triton kernels run under the CPU interpreter here: the variable must be set before
anything imports triton."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def cache_in_tmp(tmp_path_factory):
    """A build cache of the test module's own (L2C_CACHE_DIR), so that its kernels are built fresh."""
    from l2c import cache
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(cache.ENV_VAR, str(tmp_path_factory.mktemp("l2c_cache")))
        yield


RECORDER = r"""
#include <stddef.h>
#include <stdint.h>
static uint64_t seen[20];
int record(void const* a, void const* b, void const* c, void const* bias, void* d, int m, int n, int k, int l,
           int64_t x0, int64_t x1, int64_t x2, int64_t x3, int64_t x4, int64_t x5, int64_t x6, int64_t x7,
           void* w, size_t wb, void* s) {
  uint64_t v[20] = {(uint64_t)(uintptr_t)a, (uint64_t)(uintptr_t)b, (uint64_t)(uintptr_t)c,
                    (uint64_t)(uintptr_t)bias, (uint64_t)(uintptr_t)d, (uint64_t)(int64_t)m, (uint64_t)(int64_t)n,
                    (uint64_t)(int64_t)k, (uint64_t)(int64_t)l, (uint64_t)x0, (uint64_t)x1, (uint64_t)x2,
                    (uint64_t)x3, (uint64_t)x4, (uint64_t)x5, (uint64_t)x6, (uint64_t)x7, (uint64_t)(uintptr_t)w,
                    (uint64_t)wb, (uint64_t)(uintptr_t)s};
  for (int i = 0; i < 20; ++i) seen[i] = v[i];
  return m ^ n;   /* a status the caller can check */
}
uint64_t recorded(int i) { return seen[i]; }
"""


@pytest.fixture(scope="session")
def recorder(tmp_path_factory):
    """A real C function with the ABI of a CUTLASS library's `l2c_<name>_run` that records the arguments it got
    (`recorded(i)`) and returns M ^ N as its status: the entry point of call plans in the shim's and the C++
    call table's tests."""
    import ctypes
    import subprocess
    from l2c.targets.cutlass import shim as cutlass_shim
    folder = tmp_path_factory.mktemp("recorder")
    (folder / "rec.c").write_text(RECORDER)
    subprocess.run([cutlass_shim.find_c_compiler(), "-O2", "-shared", "-fPIC", str(folder / "rec.c"), "-o",
                    str(folder / "rec.so")], check=True)
    lib = ctypes.CDLL(str(folder / "rec.so"))
    lib.record.restype = ctypes.c_int
    lib.recorded.restype = ctypes.c_uint64
    lib.recorded.argtypes = [ctypes.c_int]
    return lib
