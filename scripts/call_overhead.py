#!/usr/bin/env python
"""Host overhead of l2c's eager call path against torch.matmul, and correctness of its fast paths (GPU).

    python scripts/call_overhead.py --out benchmarks/results/call_overhead_h200.json

For each kernel and small shape it measures, side by side in one process:
- `launch_us`: host time per call of 400 back-to-back calls without synchronizing, divided by 400. When the
  kernel is shorter than the host work this is the host cost of one call (what limits the `call` protocol
  on small shapes); torch.matmul is timed the same way.
- `call_us`: mean of synchronized single calls (the `call` protocol's measurement, same inputs).
Sides: torch.matmul; the kernel called directly (its steady-state path: a replayed call plan); the path
without plans (CUTLASS: the fully checked `_checked_call`; Triton: the module's `launch` through Triton's JIT
dispatch); the direct kernel is built with the finalize split-K reduction (`split_k reduce=finalize`: two
launches), and for a Triton workspace split-K kernel `kernel_inkernel` is the same spec with the in-kernel
reduction (the default: one launch); for a Triton spec `kernel_tma` and `kernel_tma_device` are the same spec
with `launch loads=tma` (descriptors encoded on the host per launch) and `loads=tma_device` (built by each program);
for a CUTLASS kernel `kernel_ctypes20` replays its plans through the 20-argument entry instead of the call-plan
shim (l2c.targets.cutlass.shim); and `l2c.matmul` through the dispatcher with a one-entry tuned table for that shape.

Correctness (exits 1 on any failure): each side's result equals torch.matmul's; after a call plan exists, a
16-byte-misaligned view of the same shape and strides is still rejected (ValueError) by the kernel and
served correctly by the fallback of `l2c.matmul` (Triton: served correctly by the kernel, outside its plan);
a second dtype is not served by the first one's plan; a Triton kernel made a plan for the signature.
"""
from __future__ import annotations

import os

os.environ.setdefault("L2C_TRITON_PLANS", "1")   # verify and time the Triton launch plans (the default)

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = [(64, 64, 64), (256, 256, 256), (128, 1024, 1024), (1024, 1024, 1024)]
KERNELS = ("cutlass_64x64x128_389cd9a6", "triton_64x64x64_d4734c23", "triton_64x64x128_9ed8aade",
           "triton_64x64x64_4a111b5a")   # the last: split-K, 4 slices (two launches and a workspace)


def host_per_call(fn, n=400):
    import torch
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
        torch.cuda.synchronize()
    return statistics.median(samples) * 1e6


def synced_call(fn, n=200):
    import torch
    torch.cuda.synchronize()
    total = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        total += time.perf_counter() - t0
    return total / n * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "call_overhead_h200.json"))
    ap.add_argument("--pool", nargs="+", default=[str(ROOT / "benchmarks" / "pool_h200.l2"),
                                                  str(ROOT / "benchmarks" / "pool_h200_splitk.l2")])
    args = ap.parse_args(argv)

    import torch
    import l2c
    from l2c.results_file import environment
    from l2c.build import build
    from l2c.dispatch import TunedEntry, TunedTable, set_tuned_table
    from l2c.devices import get_device
    from l2c.parser import parse_file
    from l2c.validate import validate

    specs = {s.name: s for pool in args.pool for s in parse_file(pool)}
    rows, failures = [], []

    def check_plan(name, kernel):
        """A Triton kernel made a launch plan for the signature it was just called with."""
        if not any(kernel._plans.values()):
            from l2c.targets.triton.build import launch_hook_set
            failures.append(f"{name}: no launch plan was made (refusals {set(kernel.plan_refusals.values())}, "
                            f"launch hook set: {launch_hook_set()})")

    def check(name, got, ref, tol=3e-3):
        err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
        if not err <= tol:
            failures.append(f"{name}: relative error {err:.3g} > {tol}")
            print("FAIL", failures[-1], flush=True)   # now: a later crash must not hide it
        return err

    for kname in KERNELS:
        spec = specs[kname]
        inkernel, direct = None, spec
        if spec.target == "triton" and spec.split_k_slices > 1 and spec.split_k_mode == "workspace":
            inkernel = build(validate(spec, spec.target, "sm_90"))   # the default: reduced in the GEMM kernel
            direct = spec.replace(split_k_reduce="finalize")         # `kernel`: split-K reduced by a second kernel
        kernel = build(validate(direct, spec.target, "sm_90"))
        tmas = {}
        if spec.target == "triton":   # the same spec with TMA loads (in-kernel split-K where split)
            for loads in ("tma", "tma_device"):
                tmas[loads] = build(validate(spec.replace(name=f"{spec.name}_{loads}", launch_loads=loads),
                                             spec.target, "sm_90"))
        ctypes20 = None
        if spec.target == "cutlass":   # the same library, planned calls through the 20-argument entry (no shim)
            from l2c.targets.cutlass.kernel import load_cutlass
            ctypes20 = load_cutlass(kernel.valid, kernel.path, kernel.source)
            if kernel._run_planned is None:
                failures.append(f"{kname}: the CUTLASS call-plan shim did not build (no host C compiler?)")
            ctypes20._run_planned = None
        for (m, n, k) in SHAPES:
            g = torch.Generator(device="cuda").manual_seed(0)
            a = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=g)
            b = torch.randn(k, n, device="cuda", dtype=torch.float16, generator=g)
            ref = torch.matmul(a, b)
            row = {"kernel": kname, "target": spec.target, "m": m, "n": n, "k": k, "errors": {}}
            row["errors"]["direct"] = check(f"{kname} {m}x{n}x{k} direct", kernel(a, b), ref)
            row["errors"]["direct_again"] = check(f"{kname} {m}x{n}x{k} direct (plan)", kernel(a, b), ref)
            # the plan replayed over other tensors of the same signature (new pointers in every slot)
            a2, b2 = torch.randn_like(a), torch.randn_like(b)
            row["errors"]["direct_fresh"] = check(f"{kname} {m}x{n}x{k} direct (plan, fresh tensors)", kernel(a2, b2),
                                                  torch.matmul(a2, b2))
            for loads, tma in tmas.items():
                row["errors"][loads] = check(f"{kname} {m}x{n}x{k} {loads}", tma(a, b), ref)
                row["errors"][f"{loads}_again"] = check(f"{kname} {m}x{n}x{k} {loads} (plan)", tma(a, b), ref)
                row["errors"][f"{loads}_fresh"] = check(f"{kname} {m}x{n}x{k} {loads} (plan, fresh tensors)",
                                                        tma(a2, b2), torch.matmul(a2, b2))
                check_plan(f"{kname} {m}x{n}x{k} {loads}", tma)
            # the shape-generic spec, as tuned tables hold it (the kernel above is the same build)
            entry = TunedEntry(m=m, n=n, k=k, batch=1, dtype="f16", layout="row,row,row", target=spec.target,
                               spec_text=spec.to_l2(), tflops=2.0, baseline_tflops=1.0)
            dispatcher = set_tuned_table(TunedTable([entry]), prepare="inline")   # served from this first call
            row["errors"]["l2c.matmul"] = check(f"{kname} {m}x{n}x{k} l2c.matmul", l2c.matmul(a, b), ref)
            if dispatcher.stats["tuned"] != 1:
                failures.append(f"{kname} {m}x{n}x{k}: l2c.matmul did not use the tuned kernel {dispatcher.stats}")

            # a misaligned view with the same shape and strides as a planned call
            flat = torch.randn(m * k + 1, device="cuda", dtype=torch.float16, generator=g)
            skewed = flat[1:].view(m, k)
            if spec.target == "cutlass":
                try:
                    kernel(skewed, b)
                    failures.append(f"{kname} {m}x{n}x{k}: a misaligned A was accepted after a plan existed")
                except ValueError:
                    row["misaligned_rejected"] = True
            else:
                check_plan(f"{kname} {m}x{n}x{k}", kernel)
                row["errors"]["misaligned"] = check(f"{kname} {m}x{n}x{k} misaligned A", kernel(skewed, b),
                                                    torch.matmul(skewed, b))
            before = dict(dispatcher.stats)
            check(f"{kname} {m}x{n}x{k} l2c.matmul misaligned", l2c.matmul(skewed, b), torch.matmul(skewed, b))
            if spec.target == "cutlass" and dispatcher.stats["fallback"] != before["fallback"] + 1:
                failures.append(f"{kname} {m}x{n}x{k}: misaligned call not served by the fallback")
            # bf16 inputs of the same shapes: never served by the f16 plan
            ab, bb = a.to(torch.bfloat16), b.to(torch.bfloat16)
            if spec.target == "cutlass":
                try:
                    kernel(ab, bb)
                    failures.append(f"{kname}: bf16 inputs accepted by an f16 kernel")
                except ValueError:
                    pass
            check(f"{kname} {m}x{n}x{k} l2c.matmul bf16", l2c.matmul(ab, bb), torch.matmul(ab, bb), tol=1e-2)

            sides = {"torch.matmul": lambda: torch.matmul(a, b), "kernel": lambda: kernel(a, b),
                     "l2c.matmul": lambda: l2c.matmul(a, b)}
            if spec.target == "cutlass":
                sides["kernel_checked"] = lambda: kernel._checked_call(a, b, None, None, None)
            else:
                sides["kernel_jit"] = lambda: kernel._launch(a, b, None, None, None)
            if inkernel is not None:
                row["errors"]["inkernel"] = check(f"{kname} {m}x{n}x{k} in-kernel split-K", inkernel(a, b), ref)
                row["errors"]["inkernel_again"] = check(f"{kname} {m}x{n}x{k} in-kernel split-K (plan)",
                                                        inkernel(a, b), ref)
                sides["kernel_inkernel"] = lambda: inkernel(a, b)
            for loads, tma in tmas.items():
                sides[f"kernel_{loads}"] = lambda tma=tma: tma(a, b)
            if ctypes20 is not None:
                row["errors"]["ctypes20"] = check(f"{kname} {m}x{n}x{k} 20-argument call", ctypes20(a, b), ref)
                row["errors"]["ctypes20_again"] = check(f"{kname} {m}x{n}x{k} 20-argument call (plan)",
                                                        ctypes20(a, b), ref)
                sides["kernel_ctypes20"] = lambda: ctypes20(a, b)
            row["launch_us"] = {name: round(host_per_call(fn), 2) for name, fn in sides.items()}
            row["call_us"] = {name: round(synced_call(fn), 2) for name, fn in sides.items()}
            rows.append(row)
            print(f"{kname:28s} {m}x{n}x{k}: launch_us {row['launch_us']} call_us {row['call_us']}", flush=True)
    set_tuned_table(None)

    result = {"environment": environment(get_device("cuda"), [], " ".join(["scripts/call_overhead.py"] + sys.argv[1:]),
                                         {}),
              "rows": rows, "failures": failures}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(failures)} failure(s); wrote {out}")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
