"""`l2c build spec.l2`: compile every kernel into the build cache ahead of use (no GPU needed).

CUTLASS kernels are compiled with nvcc in parallel (`-j`), several kernels per nvcc run where there are more
kernels than jobs (the CUTLASS headers are then parsed once per run), into the content-hash cache, so a later
`l2c bench`/`l2c tune`/`l2c.matmul` on a GPU machine with the same cache (`L2C_CACHE_DIR`) loads them
without compiling. Triton modules are generated and imported, then compiled for `--arch` by Triton's own
compiler (no GPU needed; skipped under TRITON_INTERPRET=1, where there is nothing to compile): Triton compiles
them again for the device at their first launch, but a kernel the GPU compiler rejects is found here. A kernel
that fails to build is reported with the compiler's message; the command exits 1 if any failed.
"""
from __future__ import annotations

import os
import threading
import time

from ..build import prebuild_many
from ..errors import BuildError
from . import validated_kernels


def add_parser(sub) -> None:
    p = sub.add_parser("build", help="compile .l2 kernels into the build cache (CUTLASS with nvcc, in parallel)")
    p.add_argument("specs", nargs="+", help=".l2 files")
    p.add_argument("--target", choices=["triton", "cutlass", "all"], default="all")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiler processes")
    p.set_defaults(func=run)


def run(args) -> int:
    valids = validated_kernels(args.specs, args.target, args.arch)   # all of them before any work
    start, lock = time.perf_counter(), threading.Lock()

    def report(i, outcome, kernels):
        valid, seconds = valids[i], time.perf_counter() - start
        with lock:
            if isinstance(outcome, BuildError):
                print(f"FAILED {valid.name} [{valid.target}] after {seconds:.0f}s: {outcome}", flush=True)
            else:
                how = " (cached)" if kernels == 0 else f" (one of {kernels} in one compiler run)" if kernels > 1 else ""
                print(f"built {valid.name} [{valid.target}]{how} at {seconds:.0f}s: {outcome}", flush=True)

    outcomes = prebuild_many(valids, max(1, args.jobs), report)
    failed = sum(isinstance(o, BuildError) for o in outcomes)
    print(f"{len(valids) - failed} built, {failed} failed in {time.perf_counter() - start:.0f}s")
    return 1 if failed else 0
