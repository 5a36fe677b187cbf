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


def compiled_c(tmp_path_factory, name: str, source: str):
    """`source` compiled by the host C compiler into a shared library of its own, loaded with ctypes."""
    import ctypes
    import subprocess
    from l2c.targets.cutlass import shim as cutlass_shim
    folder = tmp_path_factory.mktemp(name)
    (folder / f"{name}.c").write_text(source)
    subprocess.run([cutlass_shim.find_c_compiler(), "-O2", "-shared", "-fPIC", str(folder / f"{name}.c"), "-o",
                    str(folder / f"{name}.so")], check=True)
    return ctypes.CDLL(str(folder / f"{name}.so"))


@pytest.fixture(scope="session")
def recorder(tmp_path_factory):
    """A real C function with the ABI of a CUTLASS library's `l2c_<name>_run` that records the arguments it got
    (`recorded(i)`) and returns M ^ N as its status: the entry point of call plans in the shim's and the C++
    call table's tests."""
    import ctypes
    lib = compiled_c(tmp_path_factory, "recorder", RECORDER)
    lib.record.restype = ctypes.c_int
    lib.recorded.restype = ctypes.c_uint64
    lib.recorded.argtypes = [ctypes.c_int]
    return lib


CAPTURE_STAND_IN = r"""
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>
/* A stream capture as the driver's cuStreamGetCaptureInfo_v3 reports it, driven by the test: the nodes the next
   launch would follow (`tail`), the capture's id, and a library whose launches record their overlap setting. */
static int capturing;
static unsigned long long capture_id;
static void* tail[2];
static size_t tail_count;
static uintptr_t next_node = 1;
static int overlap = 1;
static int seen[4096];
static int launches;

int capture_info(void* stream, int* status, unsigned long long* id, void** graph, void* const** dependencies,
                 void const** edge_data, size_t* count) {
  *status = capturing;
  if (id) *id = capture_id;
  if (graph) *graph = NULL;
  if (dependencies) *dependencies = tail;
  if (edge_data) *edge_data = NULL;
  if (count) *count = capturing ? tail_count : 0;
  return 0;
}
static int launch_us;        /* each launch takes this long (threads' launches then interleave) */
static int always_joined;    /* every launch follows two nodes: no launch is after its thread's own */
static void add_node(void) {
  if (capturing && !always_joined) {
    tail[0] = (void*)next_node++;
    tail_count = 1;
  }
}
int launch(void const* a, void const* b, void const* c, void const* bias, void* d, int m, int n, int k, int l,
           int64_t x0, int64_t x1, int64_t x2, int64_t x3, int64_t x4, int64_t x5, int64_t x6, int64_t x7,
           void* w, size_t wb, void* s) {
  if (launch_us) usleep(launch_us);
  int const i = __atomic_fetch_add(&launches, 1, __ATOMIC_RELAXED);
  if (i < 4096) seen[i] = overlap;
  add_node();
  return 0;
}
/* The call-plan shim's entry as the C++ call table calls it: records the plan it was handed. */
static void const* planned_plan;
static int planned_calls;
int planned(void const* plan, void const* a, void const* b, void const* bias, void* d, void* w, void* s) {
  planned_plan = plan;
  ++planned_calls;
  return 0;
}
uintptr_t last_planned(void) { return (uintptr_t)planned_plan; }
int planned_count(void) { return planned_calls; }
int set_overlap(int on) { int old = overlap; overlap = on != 0; return old; }
void other_kernel(void) { add_node(); }
void join(void) {   /* a second stream's work joins: the next launch follows two nodes */
  if (capturing) { tail[0] = (void*)next_node++; tail[1] = (void*)next_node++; tail_count = 2; }
}
void begin_capture(unsigned long long id) {   /* each graph numbers its nodes afresh: handles may repeat */
  capturing = 1; capture_id = id; tail_count = 0; next_node = 1;
}
void end_capture(void) { capturing = 0; tail_count = 0; }
void reset(int on) { launches = 0; overlap = on; capturing = 0; tail_count = 0; launch_us = 0; always_joined = 0; }
void joined_and_slow(int us) {   /* a capture where every launch follows two nodes and takes `us` microseconds */
  capturing = 1; capture_id = 1; tail[0] = (void*)1; tail[1] = (void*)2; tail_count = 2; always_joined = 1;
  launch_us = us;
}
int launches_seen(void) { return launches; }
int overlap_of(int i) { return seen[i]; }
int overlap_now(void) { return overlap; }
"""


@pytest.fixture(scope="session")
def capture_library(tmp_path_factory):
    """The compiled CAPTURE_STAND_IN (see `capture_stand_in`)."""
    import ctypes
    lib = compiled_c(tmp_path_factory, "capture", CAPTURE_STAND_IN)
    lib.launch.restype = ctypes.c_int
    lib.set_overlap.argtypes = [ctypes.c_int]
    lib.begin_capture.argtypes = [ctypes.c_ulonglong]
    lib.reset.argtypes = [ctypes.c_int]
    lib.overlap_of.argtypes = [ctypes.c_int]
    lib.joined_and_slow.argtypes = [ctypes.c_int]
    lib.last_planned.restype = ctypes.c_size_t
    return lib


@pytest.fixture
def capture_stand_in(capture_library):
    """A real C stand-in for the driver's capture query (`capture_info`) and a CUTLASS library (`launch`, the
    20-argument entry, and `set_overlap`), whose launches record the library's overlap setting at launch time: this
    machine has no driver to capture with. The shim asks the stand-in for the test's length
    (`l2c_use_capture_info`)."""
    import ctypes
    from l2c.targets.cutlass import shim as cutlass_shim
    shim_lib = cutlass_shim.shim_library()
    shim_lib.l2c_use_capture_info(ctypes.cast(capture_library.capture_info, ctypes.c_void_p).value)
    capture_library.reset(1)
    yield capture_library
    shim_lib.l2c_use_capture_info(None)
