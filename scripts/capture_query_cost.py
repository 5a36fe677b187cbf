#!/usr/bin/env python
"""What the captured-overlap rule costs an eager launch (GPU): nanoseconds per `cuStreamGetCaptureInfo_v3` on a
stream that is not capturing, the query the call-plan shim (l2c/targets/cutlass/shim.py) makes before each planned
launch of a kernel that overlaps by default. A C loop of a million queries, best of 5, compiled with the host C
compiler against the driver found at run time (as the shim finds it), so no ctypes cost is counted.

    python scripts/capture_query_cost.py OUT.json
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from l2c.targets.cutlass.shim import find_c_compiler  # noqa: E402

PROBE = r"""
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <time.h>
typedef int (*info_fn)(void*, int*, unsigned long long*, void**, void* const**, void const**, size_t*);
int main(void) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) { printf("{\"error\": \"no libcuda.so.1\"}\n"); return 1; }
  info_fn info = (info_fn)dlsym(lib, "cuStreamGetCaptureInfo_v3");
  if (!info) { printf("{\"error\": \"no cuStreamGetCaptureInfo_v3 in the driver\"}\n"); return 1; }
  int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
  int (*retain)(void**, int) = (int (*)(void**, int))dlsym(lib, "cuDevicePrimaryCtxRetain");
  int (*set_current)(void*) = (int (*)(void*))dlsym(lib, "cuCtxSetCurrent");
  int (*create)(void**, unsigned) = (int (*)(void**, unsigned))dlsym(lib, "cuStreamCreate");
  void* context = 0;
  void* stream = 0;
  if (init(0) || retain(&context, 0) || set_current(context) || create(&stream, 1)) {
    printf("{\"error\": \"no CUDA context or stream\"}\n");
    return 1;
  }
  int status = -1;
  unsigned long long id = 0;
  void* const* after = 0;
  void const* edges = 0;
  size_t count = 0;
  int first = info(stream, &status, &id, NULL, &after, &edges, &count);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < 1000000; ++i) info(stream, &status, &id, NULL, &after, &edges, &count);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e6;
    best = ns < best ? ns : best;
  }
  printf("{\"result\": %d, \"capture_status\": %d, \"dependencies\": %zu, \"ns_per_query\": %.1f}\n", first, status,
         count, best);
  return 0;
}
"""


def main() -> int:
    out = Path(sys.argv[1])
    compiler = find_c_compiler()
    if compiler is None:
        print("no host C compiler", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as work:
        source, program = Path(work) / "probe.c", Path(work) / "probe"
        source.write_text(PROBE)
        subprocess.run([compiler, "-O2", str(source), "-o", str(program), "-ldl"], check=True)
        done = subprocess.run([str(program)], capture_output=True, text=True)
    result = json.loads(done.stdout)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
