#!/usr/bin/env python
"""Check the Triton target on a real GPU: what the CPU interpreter tests cannot cover.

    python scripts/gpu_check.py [--random N] [--seed S] [--only TEXT] [--out FILE]

- bf16 inputs (bf16 `tl.dot` is broken in the Triton interpreter, so tests/ cannot run it);
- production tiles (64..256), warps and pipeline stages, compiled for the real device;
- every layout, epilogue, split-K mode, persistent grid and batch, on odd and even shapes;
- TMA loads (`launch loads=tma`, host-built tensor descriptors, and `tma_device`, descriptors each program builds;
  column-major operands through their transposes) alone and with split-K, persistent grids and fused epilogues,
  on shapes whose rows they accept; `tma_device` launches on two streams at once and in a CUDA graph;
- N random valid Triton specs drawn from the knob table (tiles of any size);
- the call path: a split-K kernel called again with `out` given allocates no device memory;
- split-K under both reductions (knob `split_k reduce`: a finalize kernel, or in the GEMM kernel through per-tile
  semaphores), and, for the in-kernel one, races between SMs: a deterministic (workspace) split-K result on
  thousands of programs must be bitwise equal to the finalize kernel's, call after call;
- one speed sanity line (4096^3 f16) against torch.matmul, for orientation only (use `l2c bench` to measure).

Each kernel is verified with l2c.verify (fresh random inputs, NaN-poisoned output, reference in float64 or
float32). Exits 1 if any check fails.
"""
from __future__ import annotations

import os

os.environ.setdefault("L2C_TRITON_PLANS", "1")   # verify and time the Triton launch plans (the default)

import argparse
import random
import sys
import time

import torch

from l2c.build import build
from l2c.errors import BuildError, L2ValidationError
from l2c.ir import KernelSpec
from l2c.knobs import ANY, AUTO, KNOBS
from l2c.parser import parse_one
from l2c.targets.triton.rules import TMA_LOADS
from l2c.validate import validate
from l2c.verify import verify

ODD_SHAPES = [(1, 1, 1), (127, 255, 129), (1000, 1000, 1000), (333, 4097, 77)]
EVEN_SHAPES = [(512, 512, 512), (2048, 1024, 4096)]
# odd M, and N and K whose fp16 rows are multiples of 16 bytes: what `launch loads=tma` kernels accept
TMA_SHAPES = [(1, 8, 8), (127, 256, 136), (1000, 1000, 1000), (333, 4096, 80)]

FIXED = [
    # (spec body, shapes, batch)
    ("types a=bf16 b=bf16 c=bf16 tile m=128 n=128 k=64", ODD_SHAPES + EVEN_SHAPES, 1),
    ("types a=bf16 b=bf16 c=f32 layout a=col b=col c=col tile m=128 n=256 k=64 launch warps=8", ODD_SHAPES, 1),
    ("types a=bf16 b=bf16 c=bf16 tile m=64 n=128 k=64 split_k slices=4 mode=workspace "
     "epilogue beta=0.5 bias=col activation=gelu", ODD_SHAPES, 1),
    ("types a=bf16 b=bf16 c=bf16 tile m=128 n=128 k=64 launch persistent=yes split_k slices=3 mode=atomic "
     "epilogue bias=row activation=silu", ODD_SHAPES, 1),
    ("types a=f16 b=f16 c=f16 tile m=128 n=256 k=64 launch warps=8 pipeline stages=3", ODD_SHAPES + EVEN_SHAPES, 1),
    ("types a=f16 b=f16 c=f16 acc=f16 tile m=128 n=128 k=32", ODD_SHAPES, 1),
    ("types a=f16 b=f16 c=f16 layout a=col tile m=128 n=128 k=64 launch persistent=yes swizzle group=8 raster=n",
     ODD_SHAPES + EVEN_SHAPES, 1),
    ("types a=f16 b=f16 c=f16 layout b=col tile m=64 n=64 k=64 problem batch=any epilogue alpha=0.5 beta=-1.0 "
     "activation=relu", [(127, 255, 129), (512, 512, 512)], 4),
    ("types a=f32 b=f32 c=f32 math=tf32 tile m=64 n=64 k=32", ODD_SHAPES, 1),
    ("types a=f32 b=f32 c=f32 math=ieee tile m=64 n=64 k=32 split_k slices=2", ODD_SHAPES, 1),
    ("types a=f16 b=f16 c=f16 tile m=128 n=128 k=64 launch loads=tma", TMA_SHAPES + EVEN_SHAPES, 1),
    ("types a=f32 b=f32 c=f32 math=tf32 tile m=64 n=64 k=32 launch loads=tma warps=4", TMA_SHAPES, 1),
    ("types a=f16 b=f16 c=f16 tile m=64 n=128 k=64 launch loads=tma split_k slices=4 mode=workspace "
     "epilogue beta=0.5 bias=col activation=gelu", TMA_SHAPES, 1),
    ("types a=f16 b=f16 c=f32 tile m=128 n=64 k=64 launch loads=tma persistent=yes split_k slices=3 mode=atomic "
     "epilogue bias=row activation=silu", TMA_SHAPES, 1),
    ("types a=f16 b=f16 c=f16 layout b=col tile m=128 n=128 k=64 launch loads=tma epilogue bias=col activation=gelu",
     TMA_SHAPES + EVEN_SHAPES, 1),
    ("types a=f16 b=f16 c=f16 layout a=col b=col c=col tile m=64 n=128 k=64 launch loads=tma split_k slices=4",
     [(8, 8, 8), (128, 256, 136), (1000, 1000, 1000), (336, 4096, 80)], 1),
    # descriptors built by each program (`tma_device`): the same features
    ("types a=f16 b=f16 c=f16 tile m=128 n=128 k=64 launch loads=tma_device", TMA_SHAPES + EVEN_SHAPES, 1),
    ("types a=f32 b=f32 c=f32 math=tf32 tile m=64 n=64 k=32 launch loads=tma_device warps=4", TMA_SHAPES, 1),
    ("types a=f16 b=f16 c=f16 tile m=64 n=128 k=64 launch loads=tma_device split_k slices=4 mode=workspace "
     "epilogue beta=0.5 bias=col activation=gelu", TMA_SHAPES, 1),
    ("types a=f16 b=f16 c=f32 tile m=128 n=64 k=64 launch loads=tma_device persistent=yes split_k slices=3 "
     "mode=atomic epilogue bias=row activation=silu", TMA_SHAPES, 1),
    ("types a=f16 b=f16 c=f16 layout b=col tile m=128 n=128 k=64 launch loads=tma_device persistent=yes "
     "epilogue bias=col activation=gelu", TMA_SHAPES + EVEN_SHAPES, 1),
    ("types a=f16 b=f16 c=f16 layout a=col b=col c=col tile m=64 n=128 k=64 launch loads=tma_device "
     "split_k slices=4", [(8, 8, 8), (128, 256, 136), (1000, 1000, 1000), (336, 4096, 80)], 1),
    ("problem m=4096 n=4096 k=4096 types a=f16 b=f16 c=f16 tile m=128 n=256 k=64 launch warps=8 pipeline stages=3",
     [(4096, 4096, 4096)], 1),
]


def random_specs(count: int, rng: random.Random):
    """Valid Triton specs with every searchable knob drawn from the knob table."""
    found = 0
    while found < count:
        values = {}
        for knob in KNOBS:
            if not knob.searchable or "triton" not in knob.targets:
                continue
            if knob.choices:
                values[knob.field] = rng.choice(((AUTO,) if knob.kind == "auto_int" else ()) + tuple(knob.choices))
            else:
                values[knob.field] = rng.choice((1, 1, 2, 3, 4, 8))
        if values.get("split_k_mode") == "stream_k":
            continue
        dtype = rng.choice(("f16", "bf16", "f32"))
        spec = KernelSpec(name=f"random_{found}", types_a=dtype, types_b=dtype,
                          types_c=rng.choice(("f16", "bf16", "f32")),
                          types_math=rng.choice(("tf32", "ieee")), layout_a=rng.choice(("row", "col")),
                          layout_b=rng.choice(("row", "col")), layout_c=rng.choice(("row", "col")),
                          epilogue_beta=rng.choice((0.0, 1.0)), epilogue_bias=rng.choice(("none", "row", "col")),
                          epilogue_activation=rng.choice(("none", "relu", "gelu", "silu")),
                          problem_batch=rng.choice((1, ANY)), **values)
        try:
            yield validate(spec, "triton")
            found += 1
        except L2ValidationError:
            continue


RECORDS = []   # one row per (spec, shape): written to --out as JSON


def with_reduce(valid, reduce: str):
    """`valid` with its workspace-mode Triton split-K slices summed by `reduce` (knob split_k reduce); other
    specs, which have no such choice, unchanged."""
    spec = valid.spec
    if valid.target != "triton" or spec.split_k_slices == 1 or spec.split_k_mode != "workspace":
        return valid
    return validate(spec.replace(split_k_reduce=reduce), valid.target, valid.arch.name)


def run_check(valid, shapes, batch, seed, failures, reduce="finalize"):
    valid = with_reduce(valid, reduce)
    try:
        kernel = build(valid)
    except BuildError as err:
        failures.append((valid.name, "build", str(err)))
        RECORDS.append({"spec": valid.spec.to_l2(), "target": valid.target, "status": "build_failed",
                        "splitk_reduce": reduce, "reason": str(err)[-2000:]})
        print(f"BUILD FAIL {valid.name}: {err}")
        return None
    for m, n, k in shapes:
        t0 = time.perf_counter()
        res = verify(kernel, m, n, k, batch=batch, device="cuda", seed=seed)
        status = "ok  " if res.ok else "FAIL"
        print(f"{status} {valid.name:<12} {reduce[:3]} {m:>5}x{n:>5}x{k:>5} b{batch}  rel {res.rel_error:.2e} "
              f"tol {res.tolerance:.1e}  {time.perf_counter() - t0:5.1f}s  {res.reason}")
        RECORDS.append({"spec": valid.spec.to_l2(), "target": valid.target, "m": m, "n": n, "k": k,
                        "batch": batch, "splitk_reduce": reduce, "status": "ok" if res.ok else "verify_failed",
                        "rel_error": res.rel_error, "tolerance": res.tolerance, "reason": res.reason})
        if not res.ok:
            failures.append((valid.name, f"{m}x{n}x{k}x{batch} {reduce}", res.reason))
            print(valid.spec.to_l2())
    return kernel


def check_no_allocation(failures, reduce="finalize"):
    """A split-K kernel called again with `out` given takes only its own workspace from torch's caching allocator
    (one fp32 buffer; the in-kernel reduction adds its tile semaphores) and no new device memory from the driver:
    the buffers are per call so that two streams or a graph beside eager calls never share one, and the allocator
    hands back the blocks the first call freed. Atomic mode always reduces in the finalize kernel."""
    for mode in ("atomic", "workspace"):
        valid = with_reduce(validate(parse_one(f"kernel alloc_{mode} {{ types a=f16 b=f16 c=f16 tile m=64 n=64 "
                                               f"k=64 split_k slices=4 mode={mode} }}"), "triton"), reduce)
        kernel = build(valid)
        a = torch.randn(300, 5000, device="cuda", dtype=torch.float16)
        b = torch.randn(5000, 200, device="cuda", dtype=torch.float16)
        out = kernel(a, b)
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats()
        kernel(a, b, out=out)
        torch.cuda.synchronize()
        after = torch.cuda.memory_stats()
        blocks = after["allocation.all.allocated"] - before["allocation.all.allocated"]
        segments = after["segment.all.allocated"] - before["segment.all.allocated"]
        expected = 2 if mode == "workspace" and reduce == "inkernel" else 1
        ok = blocks == expected and segments == 0
        print(f"{'ok  ' if ok else 'FAIL'} call path ({mode}, {reduce}): {blocks} allocator blocks (expected "
              f"{expected}: the workspace), {segments} new device segments on a repeated split-K call")
        if not ok:
            failures.append(("alloc", f"call path {mode} {reduce}",
                             f"{blocks} blocks (expected {expected}), {segments} segments"))


def check_inkernel_matches_finalize(failures, calls=20):
    """Races between SMs in the in-kernel reduction: workspace-mode split-K sums the slices in slice order under
    both reductions, so their results must be bitwise equal, on every call. 2048x2048 with 64x64 tiles and 8
    slices is 8192 programs; the persistent variant also runs many tiles per program."""
    a = torch.randn(2048, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 2048, device="cuda", dtype=torch.float16)
    for persistent in ("no", "yes"):
        body = (f"types a=f16 b=f16 c=f16 tile m=64 n=64 k=64 launch persistent={persistent} "
                "split_k slices=8 mode=workspace epilogue bias=col activation=gelu")
        bias = torch.randn(2048, device="cuda", dtype=torch.float16)
        kernels = {}
        for reduce in ("finalize", "inkernel"):
            kernels[reduce] = build(with_reduce(validate(parse_one(f"kernel race_{persistent} {{ {body} }}"), "triton"),
                                                reduce))
        want = kernels["finalize"](a, b, bias=bias)
        differ = sum(not torch.equal(kernels["inkernel"](a, b, bias=bias), want) for _ in range(calls))
        torch.cuda.synchronize()
        print(f"{'ok  ' if differ == 0 else 'FAIL'} in-kernel split-K (persistent={persistent}): {differ} of {calls} "
              f"calls differ bitwise from the finalize kernel")
        RECORDS.append({"check": "inkernel_matches_finalize", "persistent": persistent, "calls": calls,
                        "differ": differ})
        if differ:
            failures.append(("inkernel race", f"persistent={persistent}", f"{differ} of {calls} calls differ"))


def check_device_descriptors_on_streams_and_graphs(failures):
    """`tma_device` programs build their descriptors in a scratch buffer the module keeps per stream: launches on
    two streams at once must not share it, and a launch captured into a CUDA graph gets its own (the graph may be
    replayed on another stream while eager launches run). Each result is compared with torch.matmul."""
    kernel = build(validate(parse_one("kernel scratch { types a=f16 b=f16 c=f16 tile m=64 n=64 k=64 "
                                      "launch loads=tma_device }"), "triton"))
    def inputs():
        return (torch.randn(1024, 2048, device="cuda", dtype=torch.float16),
                torch.randn(2048, 512, device="cuda", dtype=torch.float16))
    def close(out, a, b):
        want = a.float() @ b.float()
        return bool(((out.float() - want).abs().max() / want.abs().max()) < 1e-2)
    results = {}
    (a1, b1), (a2, b2) = inputs(), inputs()
    kernel(a1, b1)   # compile and plan
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    outs = []
    for _ in range(20):
        outs.append(kernel(a1, b1))
        with torch.cuda.stream(side):
            outs.append(kernel(a2, b2))
    torch.cuda.synchronize()
    results["two_streams"] = all(close(o, *(a1, b1) if i % 2 == 0 else (a2, b2)) for i, o in enumerate(outs))
    static_a, static_b = inputs()
    graph = torch.cuda.CUDAGraph()
    kernel(static_a, static_b)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        graph_out = kernel(static_a, static_b)
    a3, b3 = inputs()
    static_a.copy_(a3)
    static_b.copy_(b3)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(10):
            graph.replay()
    eager = [kernel(a1, b1) for _ in range(10)]
    torch.cuda.synchronize()
    results["graph_replay"] = close(graph_out, a3, b3)
    results["eager_beside_graph"] = all(close(o, a1, b1) for o in eager)
    for name, ok in results.items():
        print(f"{'ok  ' if ok else 'FAIL'} tma_device scratch: {name.replace('_', ' ')}")
        if not ok:
            failures.append(("tma_device scratch", name, "result differs from torch.matmul"))
    RECORDS.append({"check": "tma_device_scratch", **results})


def speed_line():
    import triton.testing
    valid = validate(parse_one(f"kernel speed {{ {FIXED[-1][0]} }}"), "triton")
    kernel = build(valid)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    out = torch.empty(4096, 4096, device="cuda", dtype=torch.float16)
    ms_l2c = triton.testing.do_bench(lambda: kernel(a, b, out=out))
    ms_torch = triton.testing.do_bench(lambda: torch.matmul(a, b, out=out))
    tflops = lambda ms: 2 * 4096 ** 3 / ms / 1e9
    print(f"info 4096^3 f16: l2c triton {tflops(ms_l2c):.0f} TFLOP/s, torch.matmul {tflops(ms_torch):.0f} TFLOP/s "
          f"(do_bench, for orientation only)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--random", type=int, default=24, help="number of random valid specs (default 24)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", help="check only the fixed specs whose body contains this text (the other checks "
                                  "still run; --random 0 skips the random specs)")
    p.add_argument("--out", help="write every check as JSON here (commit it under benchmarks/results/)")
    p.add_argument("--splitk-reduce", choices=("finalize", "inkernel", "both"), default="both",
                   help="split-K reductions to check split-K specs under (default both)")
    args = p.parse_args(argv)
    reduces = ("finalize", "inkernel") if args.splitk_reduce == "both" else (args.splitk_reduce,)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device", file=sys.stderr)
        return 2
    import triton
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    failures = []
    def each_reduce(valid):
        return reduces if valid.spec.split_k_slices > 1 else reduces[:1]

    for i, (body, shapes, batch) in enumerate(FIXED):
        if args.only and args.only not in body:
            continue
        valid = validate(parse_one(f"kernel fixed_{i} {{ {body} }}"), "triton")
        for reduce in each_reduce(valid):
            run_check(valid, shapes, batch, args.seed + i, failures, reduce)
    rng = random.Random(args.seed)
    for valid in random_specs(args.random, rng):
        tma = valid.spec.launch_loads in TMA_LOADS
        m, n, k = rng.choice(TMA_SHAPES[1:] if tma else ODD_SHAPES[1:] + EVEN_SHAPES[:1])
        if tma and valid.spec.layout_a == "col":
            m = -(-m // 8) * 8   # a column-major A is read along M: TMA needs its columns 16-byte aligned
        batch = rng.choice((1, 1, 3)) if valid.spec.problem_batch == ANY else 1
        seed = rng.randrange(2 ** 31)
        for reduce in each_reduce(valid):
            run_check(valid, [(m, n, k)], batch, seed, failures, reduce)
    for reduce in reduces:
        check_no_allocation(failures, reduce)
    check_device_descriptors_on_streams_and_graphs(failures)
    if "inkernel" in reduces:
        check_inkernel_matches_finalize(failures)
    speed_line()
    if args.out:
        import json
        from l2c.results_file import environment
        from l2c.devices import get_device
        env = environment(get_device("cuda"), [], " ".join(["python"] + sys.argv), {"seed": args.seed})
        with open(args.out, "w") as f:
            json.dump({"environment": env, "checks": RECORDS,
                       "failures": [list(x) for x in failures]}, f, indent=1, default=str)
    print(f"\n{len(failures)} failure(s)")
    for f in failures:
        print("  ", *f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
