"""`l2c build spec.l2`: compile every kernel into the build cache ahead of use (no GPU needed).

CUTLASS kernels are compiled with nvcc in parallel (`-j`) into the content-hash cache, so a later
`l2c bench`/`l2c tune`/`l2c.matmul` on a GPU machine with the same cache (`L2C_CACHE_DIR`) loads them
without compiling. Triton modules are generated and imported, then compiled for `--arch` by Triton's own
compiler (no GPU needed; skipped under TRITON_INTERPRET=1, where there is nothing to compile): Triton compiles
them again for the device at their first launch, but a kernel the GPU compiler rejects is found here. A kernel
that fails to build is reported with the compiler's message; the command exits 1 if any failed.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

from ..build import prebuild
from ..errors import BuildError
from . import validated_kernels


def add_parser(sub) -> None:
    p = sub.add_parser("build", help="compile .l2 kernels into the build cache (CUTLASS with nvcc, in parallel)")
    p.add_argument("specs", nargs="+", help=".l2 files")
    p.add_argument("--target", choices=["triton", "cutlass", "all"], default="all")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="parallel nvcc processes")
    p.set_defaults(func=run)


def _build_one(valid):
    start = time.perf_counter()
    try:
        return valid, prebuild(valid), None, time.perf_counter() - start
    except BuildError as err:
        return valid, None, err, time.perf_counter() - start


def run(args) -> int:
    valids = validated_kernels(args.specs, args.target, args.arch)   # all of them before any work
    failed = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for valid, path, err, seconds in pool.map(_build_one, valids):
            if err is None:
                print(f"built {valid.name} [{valid.target}] in {seconds:.0f}s: {path}", flush=True)
            else:
                failed += 1
                print(f"FAILED {valid.name} [{valid.target}] after {seconds:.0f}s: {err}", flush=True)
    print(f"{len(valids) - failed} built, {failed} failed")
    return 1 if failed else 0
