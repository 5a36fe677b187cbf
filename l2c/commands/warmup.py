"""`l2c warmup [TABLE...]`: build, and on a GPU verify, every kernel a tuned table serves, before a model runs.

The dispatcher never blocks a call on a compiler: a kernel that is not built yet is prepared in the background
while torch serves the call. Whoever wants the tuned path from the first call runs this once per machine (or
`l2c.precompile(model, example_input)` in the process itself): CUTLASS libraries land in the build cache (from the
prebuilt pack or nvcc, several kernels per nvcc run, `-j` runs at once), Triton modules are generated and, with a GPU, compiled into Triton's cache
by their first launch, and each kernel is checked against the reference at a shape it serves; on a GPU the C++
call table (l2c.native_call: the first test, torch's fallback and served CUTLASS plans) is built into the cache beside them. Each pass
is recorded for the GPU, driver and l2c version (`l2c.verified`), so every later process serves those kernels from its first
call. A kernel that fails is named with the reason and the command exits 1; the dispatcher then falls back to
torch for it, as it would.
"""
from __future__ import annotations

import os
import sys
import time


def add_parser(sub) -> None:
    p = sub.add_parser("warmup", help="build (and on a GPU verify) every kernel a tuned table serves, ahead of use")
    p.add_argument("tables", nargs="*", help="tuned tables (default: the one l2c.matmul reads for --arch: "
                                             "$L2C_TUNED_TABLE, else the one shipped for --arch "
                                             "and this GPU: l2c/tuned/<arch>.<gpu>.json or <arch>.json)")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="where kernels are verified: cuda (the default when a GPU is visible) or cpu (build only)")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="parallel builds")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..cli import UsageError
    from ..dispatch import default_table_path
    from ..errors import L2Error
    from ..parser import parse_one
    from ..tuned_table import TableError, load_table, served_kernels
    from ..validate import validate

    import torch
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    shipped = default_table_path(args.arch, gpu)
    paths = args.tables or ([shipped] if shipped else [])
    if not paths:
        raise UsageError(f"no tuned table for {args.arch}: give one")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    jobs, invalid, unbuilt, unverified = [], 0, 0, 0
    for path in paths:
        try:
            table = load_table(path)
        except TableError as err:
            raise UsageError(str(err)) from None
        kernels, unusable = served_kernels(table)
        if table.skipped:   # load_table leaves malformed entries out; a warm-up says so, and fails
            print(f"{path}: {table.skipped} malformed entries left out (first: {table.first_skipped})")
            invalid += table.skipped
        for message in unusable:   # specs that do not parse: their calls go to torch
            print(f"FAILED {path}: {message}")
        invalid += len(unusable)
        for kernel in kernels:
            try:
                jobs.append((kernel, validate(parse_one(kernel.spec_text, file=str(path)), kernel.target, table.arch)))
            except L2Error as err:
                invalid += 1
                print(f"FAILED {kernel.label}: {err}")
    total = len(jobs)
    print(f"{total} kernels in {', '.join(str(p) for p in paths)}; building with {args.jobs} job(s)"
          + ("" if device == "cuda" else " (no GPU: built, not verified)"), flush=True)
    from ..build import prebuild_many
    from ..errors import BuildError
    built, counted = [], [0]
    start = time.perf_counter()

    def report(i, outcome, kernels):   # from the build threads, as each outcome is known
        kernel, valid = jobs[i]
        counted[0] += 1
        how = "cached" if kernels == 0 else f"compiled in a run of {kernels}"
        if isinstance(outcome, BuildError):
            print(f"[{counted[0]}/{total}] FAILED to build {valid.name} [{valid.target}] ({kernel.label}): {outcome}",
                  flush=True)
        else:
            print(f"[{counted[0]}/{total}] built {valid.name} [{valid.target}] ({how}, "
                  f"{time.perf_counter() - start:.0f}s so far)", flush=True)

    from .. import native_call
    if device == "cuda":   # the C++ call table, built beside the kernels
        native_call.start_build()
    outcomes = prebuild_many([valid for _, valid in jobs], max(1, args.jobs), report)
    for job, outcome in zip(jobs, outcomes):
        if isinstance(outcome, BuildError):
            unbuilt += 1
        else:
            built.append(job)
    if device == "cuda":
        unverified = verify_served(built, device)
    failed = invalid + unbuilt + unverified
    if device == "cuda" and native_call.enabled():   # no failure without it: calls take the Python path
        loaded = native_call.build_now()
        print("C++ call table: " + ("ready" if loaded else f"not built ({native_call.failure()})"), flush=True)
    print(f"{len(built) - unverified} ready, {failed} failed", file=sys.stderr if failed else sys.stdout)
    return 1 if failed else 0


def verify_served(built, device: str) -> int:
    """Check each built (served kernel, ValidSpec) at the shape it serves, as the dispatcher's worker would, and
    record each pass (`l2c.verified`) under the job a call at that shape makes; the number that failed."""
    from ..devices import gpu_identity
    from ..prepare import Job, prepare_one
    from ..verified import VerifiedKernels
    records = VerifiedKernels(*gpu_identity())
    failed = 0
    for i, (kernel, valid) in enumerate(built, 1):
        start = time.perf_counter()
        job = Job(kernel.spec_text, kernel.target, valid.arch.name, kernel.m, kernel.n, kernel.k, device)
        ok, reason, _ = prepare_one(job)
        if ok:
            records.record(job)
        failed += not ok
        state = "verified" if ok else f"FAILED ({reason})"
        print(f"[{i}/{len(built)}] {state} {valid.name} at {kernel.m}x{kernel.n}x{kernel.k} in "
              f"{time.perf_counter() - start:.1f}s", flush=True)
    return failed
