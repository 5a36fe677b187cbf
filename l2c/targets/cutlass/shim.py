"""A seven-argument C entry point that replays a CUTLASS call plan, so an eager call crosses ctypes cheaply.

Every generated CUTLASS library exports `l2c_<name>_run` with 20 arguments (templates/cutlass/gemm.cu.j2).
ctypes converts each argument in Python, so one such call costs about 3.7 µs of host time on the CPU machine
against 0.6 µs for five pointer arguments, and in the `call` protocol that time is on the critical path of
every small GEMM (torch.matmul's whole launch is about 13 µs on the H200 host). A call plan fixes 14 of the 20
arguments (sizes, strides, workspace bytes) the first time a call signature is seen; this shim holds them in a C
struct together with the entry point's address and forwards them, so a planned call passes only the struct,
the three operand pointers, the output pointer, the call's own workspace and the stream.

A plan whose workspace pointer is NULL takes the workspace passed with each call: kernels that write theirs
(split-K, stream-K, parallel split-K) get one per call from torch's caching allocator on the call's stream, so
calls on several streams, or a captured graph beside eager calls, never share one. A plan that holds a pointer
(a kernel that writes no workspace) ignores the per-call argument.

The shim also decides, inside a CUDA-graph capture, whether a launch overlaps the node before it (programmatic
dependent launch): only where that node is l2c's own previous launch, which lets its successor start early; after
another library's kernel an overlapped launch cost about half a microsecond in a replayed graph. It asks the
driver (`cuStreamGetCaptureInfo_v3`, found in the already loaded libcuda; not on the legacy default stream, where
eager calls usually run and no capture can be) and keeps no state but this thread's last captured node, so both
the Python path and the C++ call table go through it.

The shim is C source compiled once per machine with the host C compiler into the build cache (keyed by its
text and the compiler's path). It does not touch the generated CUTLASS libraries, so no kernel is rebuilt.
Without a C compiler `planned_call()` returns None and kernels keep the 20-argument call.
"""
from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from ... import background, cache

# The plan struct and the call that replays it, shared with the C++ call table (l2c/native_call.py).
PLAN_STRUCT = r"""
typedef int (*l2c_run_fn)(void const*, void const*, void const*, void const*, void*, int, int, int, int,
                          int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                          void*, size_t, void*);

struct l2c_call_plan {
  l2c_run_fn run;
  int m, n, k, batch;
  int64_t lda, batch_stride_a, ldb, batch_stride_b, ldc, batch_stride_c, ldd, batch_stride_d;
  void* workspace;
  size_t workspace_bytes;
  int (*set_overlap)(int);   /* the library's l2c_<name>_set_overlap where captured launches follow the rule below */
};
"""

RUN_PLANNED = r"""
/* cuStreamGetCaptureInfo_v3 (CUDA 12.3 and later), declared here so that the shim needs no CUDA header. */
typedef int (*l2c_capture_info_fn)(void* stream, int* status, unsigned long long* id, void** graph,
                                   void* const** dependencies, void const** edge_data, size_t* count);

static l2c_capture_info_fn capture_info_in_use;   /* the driver's, looked up once it is loaded; or a stand-in */

/* A stand-in for the driver's query (tests on a machine without a driver); NULL goes back to the driver's. */
void l2c_use_capture_info(l2c_capture_info_fn stand_in) {
  __atomic_store_n(&capture_info_in_use, stand_in, __ATOMIC_RELEASE);
}

static int driver_lacks_capture_info;   /* the loaded driver has no such symbol: do not look again each launch */

static l2c_capture_info_fn capture_info(void) {
  l2c_capture_info_fn fn = __atomic_load_n(&capture_info_in_use, __ATOMIC_ACQUIRE);
  if (fn == NULL && !__atomic_load_n(&driver_lacks_capture_info, __ATOMIC_RELAXED)) {
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);   /* the driver torch loaded, if any */
    if (driver != NULL) {
      fn = (l2c_capture_info_fn)dlsym(driver, "cuStreamGetCaptureInfo_v3");
      dlclose(driver);
      if (fn != NULL) {
        __atomic_store_n(&capture_info_in_use, fn, __ATOMIC_RELEASE);
      } else {
        __atomic_store_n(&driver_lacks_capture_info, 1, __ATOMIC_RELAXED);
      }
    }
  }
  return fn;
}

/* The plan's 20-argument entry with this call's pointers (no C input: C is D's layout and is not read). */
static int launch(struct l2c_call_plan const* p, void const* a, void const* b, void const* bias, void* d,
                  void* workspace, void* stream) {
  return p->run(a, b, NULL, bias, d, p->m, p->n, p->k, p->batch, p->lda, p->batch_stride_a, p->ldb,
                p->batch_stride_b, p->ldc, p->batch_stride_c, p->ldd, p->batch_stride_d, workspace,
                p->workspace_bytes, stream);
}

static pthread_mutex_t switching = PTHREAD_MUTEX_INITIALIZER;

/* The node the last captured launch of this thread added, and its capture. */
static __thread unsigned long long last_capture;
static __thread void* last_node;

/* The allocating call without a C input: C is D's layout and is not read (beta = 0). The plan's workspace, or
   where it holds none, this call's own.

   A plan with `set_overlap` launches with programmatic dependent launch as its library is set, except inside a
   CUDA-graph capture where the node it would follow is not the one this thread's previous launch of a plan added
   (another library's kernel, a copy, several nodes): there it launches without. Eager launches and captured ones
   after an l2c kernel measured faster with the overlap; captured ones after another kernel about 0.5 us slower
   (benchmarks/NOTES.md, "The overlapped launch"). */
int l2c_run_planned(struct l2c_call_plan const* p, void const* a, void const* b, void const* bias, void* d,
                    void* workspace, void* stream) {
  void* used = p->workspace != NULL ? p->workspace : workspace;
  /* the legacy default stream (NULL), where eager calls usually run, cannot be captured: no query there */
  l2c_capture_info_fn info = p->set_overlap != NULL && stream != NULL ? capture_info() : NULL;
  int capturing = 0;
  unsigned long long capture = 0;
  void* const* after = NULL;
  void const* edges = NULL;
  size_t count = 0;
  if (info == NULL || info(stream, &capturing, &capture, NULL, &after, &edges, &count) != 0 || capturing != 1) {
    return launch(p, a, b, bias, d, used, stream);
  }
  int const after_own = count == 1 && after[0] == last_node && capture == last_capture;
  int status;
  if (after_own) {
    status = launch(p, a, b, bias, d, used, stream);
  } else {
    /* the switch is the library's, shared by all threads: one captured launch at a time turns it off and back */
    pthread_mutex_lock(&switching);
    int const previous = p->set_overlap(0);
    status = launch(p, a, b, bias, d, used, stream);
    p->set_overlap(previous);
    pthread_mutex_unlock(&switching);
  }
  last_node = NULL;
  if (status == 0 && info(stream, &capturing, &capture, NULL, &after, &edges, &count) == 0 && capturing == 1 &&
      count == 1) {
    last_capture = capture;
    last_node = after[0];
  }
  return status;
}
"""

SOURCE = ("\n#include <dlfcn.h>\n#include <pthread.h>\n#include <stddef.h>\n#include <stdint.h>\n\n"
          + PLAN_STRUCT.lstrip("\n") + "\n" + RUN_PLANNED.lstrip("\n"))

_FIELDS = ("m", "n", "k", "batch", "lda", "batch_stride_a", "ldb", "batch_stride_b", "ldc", "batch_stride_c",
           "ldd", "batch_stride_d", "workspace", "workspace_bytes")


class CallPlanStruct(ctypes.Structure):
    """Mirror of `struct l2c_call_plan` above."""
    _fields_ = [("run", ctypes.c_void_p)] + [(f, ctypes.c_int) for f in _FIELDS[:4]] + \
        [(f, ctypes.c_int64) for f in _FIELDS[4:12]] + [("workspace", ctypes.c_void_p),
                                                         ("workspace_bytes", ctypes.c_size_t),
                                                         ("set_overlap", ctypes.c_void_p)]


def find_host_compiler(variable: str, *names: str) -> Optional[str]:
    """The path of $`variable`, else of the first of `names` on PATH; None when there is none."""
    for name in (os.environ.get(variable), *names):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def find_c_compiler() -> Optional[str]:
    """$CC, else cc, else gcc (the host compiler nvcc itself needs); None when there is none."""
    return find_host_compiler("CC", "cc", "gcc")


@functools.lru_cache(maxsize=None)
def shim_library() -> Optional[ctypes.CDLL]:
    """The compiled shim, built into the cache on first use; None (and a one-line warning) if it cannot be built."""
    compiler = find_c_compiler()
    if compiler is None:
        return None
    digest = cache.content_hash(SOURCE, compiler)[:24]
    try:
        folder = cache.cache_dir("native")   # an unusable cache folder (a file, no permission) is a failed build
        library = folder / f"cutlass_call_plan_{digest}.so"
        # another process may be compiling it: neither that wait nor the compile is one the exit waits for
        with background.waiting_on_a_process(), cache.locked(library):
            if not cache.intact_library(library):
                with tempfile.TemporaryDirectory(dir=folder, prefix=".cutlass_call_plan.") as work:
                    c, so = Path(work) / "shim.c", Path(work) / "shim.so"
                    c.write_text(SOURCE)
                    done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", str(c), "-o", str(so), "-ldl",
                                           "-pthread"],
                                          capture_output=True, text=True)
                    if done.returncode != 0:
                        raise OSError(f"{compiler} failed: {(done.stdout + done.stderr).strip()[:500]}")
                    os.replace(so, library)
        lib = cache.load_library(library)
    except OSError as err:
        import warnings
        warnings.warn(f"l2c: CUTLASS kernels keep the 20-argument call (the call-plan shim did not build: {err})")
        return None
    entry = lib.l2c_run_planned
    entry.argtypes = [ctypes.c_void_p] * 7
    entry.restype = ctypes.c_int
    lib.l2c_use_capture_info.argtypes = [ctypes.c_void_p]
    lib.l2c_use_capture_info.restype = None
    return lib


def planned_call():
    """The shim's `l2c_run_planned(plan, a, b, bias, d, workspace, stream)` ctypes function, or None."""
    lib = shim_library()
    return None if lib is None else lib.l2c_run_planned


def make_plan(run_function, arguments, set_overlap=None) -> CallPlanStruct:
    """A plan struct for the 20-argument entry `run_function` (a ctypes function) with `arguments` fixed:
    (M, N, K, L, lda, bsa, ldb, bsb, ldc, bsc, ldd, bsd, workspace pointer, workspace bytes); a workspace pointer
    of 0 makes each call pass its own. With `set_overlap` (the library's switch, a ctypes function) a launch
    inside a CUDA-graph capture overlaps only an l2c kernel (`l2c_run_planned`)."""
    if len(arguments) != len(_FIELDS):
        raise ValueError(f"a call plan fixes {len(_FIELDS)} arguments, got {len(arguments)}")
    plan = CallPlanStruct()
    plan.run = ctypes.cast(run_function, ctypes.c_void_p).value
    plan.set_overlap = ctypes.cast(set_overlap, ctypes.c_void_p).value if set_overlap is not None else None
    for name, value in zip(_FIELDS, arguments):
        setattr(plan, name, value)
    return plan
