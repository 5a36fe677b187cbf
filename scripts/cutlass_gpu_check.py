#!/usr/bin/env python
"""GPU check of the CUTLASS target: build a broad sample of specs, verify each, time the good ones vs torch.matmul.

On the H200: every sampled spec is compiled (`build_many`, one nvcc per CPU), loaded, and verified with
`l2c.verify.verify` (fresh random inputs, NaN-poisoned output, float reference) on several odd-but-aligned
shapes (not multiples of any tile, but 16-byte aligned as TMA requires). Kernels that pass every check are
timed with the `kernel` protocol (warm up, then many back-to-back launches between two CUDA events, median
over repetitions, interleaved with torch.matmul on the same inputs). The headline kernel, fp16 4096^3 with a
cooperative 128x256x64 cluster 1x2 kernel, is always in the sample. It also records whether CUTLASS
instantiated the stage count and shared memory that l2c's validation predicted.

    python scripts/cutlass_gpu_check.py --out cutlass_gpu_check.json

Compile elsewhere and only run here: `--compile-only --manifest m.json` builds and writes the .so paths
(set L2C_CACHE_DIR to a folder you carry to the GPU machine); `--manifest m.json` then loads from it.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from l2c.errors import BuildError, L2ValidationError
from l2c.ir import KernelSpec
from l2c.validate import validate

HEADLINE = KernelSpec(name="headline_coop_128x256x64_c1x2", tile_m=128, tile_n=256, tile_k=64, cluster_m=1,
                      cluster_n=2, launch_schedule="cooperative")
HEADLINE_SHAPE = (4096, 4096, 4096)

# Shapes for verification: multiples of 8 (16-byte rows for 16-bit types), never multiples of a tile.
VERIFY_SHAPES = [(1032, 776, 520), (8, 1928, 4104), (2056, 24, 264), (520, 1000, 1096)]
# split_k mode=parallel needs K a multiple of slices x 8 (16-byte slices) and N a multiple of 4
PARALLEL_VERIFY_SHAPES = [(1032, 776, 4096), (8, 1928, 2112), (2056, 24, 1024), (520, 1000, 12288)]
# a gated GEMM (epilogue gate) needs N a multiple of its tile n (48, 64, 96 or 128: 384 is one of all)
GATED_VERIFY_SHAPES = [(1032, 1152, 520), (8, 1536, 4104), (2056, 384, 264), (520, 3840, 1096)]
VERIFY_BATCH = 3   # for kernels with problem batch=any
TIME_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 8192, 1024), (512, 4096, 4096), (128, 12288, 4096)]


def sample_specs(count: int, seed: int, only: str = ""):
    """`count` specs: the headline kernel, hand-picked corner cases, then random valid specs over the CUTLASS knobs;
    with `only`, just the hand-picked specs whose name contains it."""
    fixed = [
        HEADLINE,
        KernelSpec(name="pingpong_64x128x64", tile_m=64, tile_n=128, tile_k=64, launch_schedule="pingpong"),
        KernelSpec(name="pingpong_128x128x64_c2x1", tile_m=128, tile_n=128, cluster_m=2, launch_schedule="pingpong"),
        KernelSpec(name="coop_256x128x64", tile_m=256, tile_n=128, tile_k=64, launch_schedule="cooperative"),
        KernelSpec(name="coop_128x128x128_s3", tile_m=128, tile_n=128, tile_k=128, pipeline_stages=3),
        KernelSpec(name="splitk4_workspace", tile_m=128, tile_n=128, split_k_slices=4, split_k_mode="workspace"),
        KernelSpec(name="splitk3_atomic", tile_m=128, tile_n=256, split_k_slices=3, split_k_mode="atomic"),
        KernelSpec(name="streamk_128x256", tile_m=128, tile_n=256, split_k_mode="stream_k", cluster_n=2),
        KernelSpec(name="bf16_f32out_colmajor", types_a="bf16", types_b="bf16", types_c="f32", layout_a="col",
                   layout_b="col", layout_c="col", tile_m=128, tile_n=128),
        KernelSpec(name="fused_c_colbias_gelu", tile_m=128, tile_n=256, cluster_n=2, epilogue_alpha=0.75,
                   epilogue_beta=0.5, epilogue_bias="col", epilogue_activation="gelu"),
        KernelSpec(name="rowbias_silu_nt", layout_a="col", tile_m=128, tile_n=128, epilogue_bias="row",
                   epilogue_activation="silu"),
        KernelSpec(name="relu_tn_batched", layout_b="col", problem_batch="any", tile_m=128, tile_n=64,
                   epilogue_activation="relu", swizzle_raster="n", swizzle_group=16),
        KernelSpec(name="tiny_64x16x32", tile_m=64, tile_n=16, tile_k=32),
        KernelSpec(name="parallel8_c2x1", tile_m=128, tile_n=128, tile_k=64, cluster_m=2, split_k_slices=8,
                   split_k_mode="parallel"),
        KernelSpec(name="parallel4_fused_nt", tile_m=128, tile_n=256, cluster_n=2, layout_b="col", split_k_slices=4,
                   split_k_mode="parallel", epilogue_alpha=0.75, epilogue_beta=0.5, epilogue_bias="col",
                   epilogue_activation="gelu"),
        KernelSpec(name="parallel4_pingpong_colc", types_a="bf16", types_b="bf16", types_c="f32", layout_a="col",
                   layout_c="col", tile_m=64, tile_n=128, launch_schedule="pingpong", split_k_slices=4,
                   split_k_mode="parallel", epilogue_beta=-1.0, epilogue_bias="row", epilogue_activation="silu"),
        # Session 7: tile N of 8..48 and 192, and the basic (non-persistent) schedule, with every epilogue input
        KernelSpec(name="s7_narrow_basic_64x8_c1x4_fused", tile_m=64, tile_n=8, tile_k=64, cluster_n=4,
                   launch_schedule="basic", epilogue_alpha=0.75, epilogue_beta=0.5, epilogue_bias="col",
                   epilogue_activation="relu"),
        KernelSpec(name="s7_narrow_pingpong_64x32_c2x4_bf16_nt_colc", types_a="bf16", types_b="bf16", types_c="bf16",
                   layout_b="col", layout_c="col", tile_m=64, tile_n=32, tile_k=64, cluster_m=2, cluster_n=4,
                   launch_schedule="pingpong"),
        KernelSpec(name="s7_narrow_basic_64x48_rowbias_batched", problem_batch="any", layout_a="col", tile_m=64,
                   tile_n=48, tile_k=64, launch_schedule="basic", epilogue_bias="row", epilogue_activation="silu"),
        KernelSpec(name="s7_narrow_basic_parallel4_64x16", tile_m=64, tile_n=16, tile_k=64, cluster_n=2,
                   launch_schedule="basic", split_k_slices=4, split_k_mode="parallel", epilogue_beta=1.0),
        KernelSpec(name="s7_wide_coop_128x192_c2x1_f32out", types_a="bf16", types_b="bf16", types_c="f32", tile_m=128,
                   tile_n=192, tile_k=64, cluster_m=2, launch_schedule="cooperative"),
        # launch swap=yes (CUTLASS computes D^T = B^T A^T) in every layout, with every epilogue input and split-K
        KernelSpec(name="s7_swap_192x128_coop_c1x2_fused", tile_m=192, tile_n=128, tile_k=64, cluster_n=2,
                   launch_schedule="cooperative", launch_swap="yes", epilogue_alpha=0.75, epilogue_beta=0.5,
                   epilogue_bias="row", epilogue_activation="gelu"),
        KernelSpec(name="s7_swap_32x64_c4x1_bf16_nt_colc", types_a="bf16", types_b="bf16", types_c="bf16",
                   layout_b="col", layout_c="col", tile_m=32, tile_n=64, tile_k=64, cluster_m=4,
                   launch_schedule="pingpong", launch_swap="yes", epilogue_bias="col"),
        KernelSpec(name="s7_swap_parallel4_48x64_tn", layout_a="col", tile_m=48, tile_n=64, tile_k=64,
                   launch_schedule="pingpong", launch_swap="yes", split_k_slices=4, split_k_mode="parallel",
                   epilogue_beta=1.0, epilogue_bias="col", epilogue_activation="relu"),
        KernelSpec(name="s7_swap_basic_batched_16x128_rowbias", problem_batch="any", tile_m=16, tile_n=128,
                   tile_k=64, launch_schedule="basic", launch_swap="yes", epilogue_bias="row"),
        KernelSpec(name="s7_swap_splitk3_coop_128x256_c2x1", tile_m=128, tile_n=256, tile_k=64, cluster_m=2,
                   launch_schedule="cooperative", launch_swap="yes", split_k_slices=3, split_k_mode="workspace"),
        # Session 38: epilogue store=staged (l2c's epilogue through shared memory) in every schedule and layout of
        # D, with C, both biases, activations, a batch, f32 output, swap=yes, split-K (CUTLASS's scheduler and
        # parallel) and stream-K (`--only staged`)
        KernelSpec(name="staged_coop_256x128_c1x2_c_colbias_gelu", tile_m=256, tile_n=128, tile_k=64, cluster_n=2,
                   launch_schedule="cooperative", epilogue_alpha=0.75, epilogue_beta=0.5, epilogue_bias="col",
                   epilogue_activation="gelu", epilogue_store="staged"),
        KernelSpec(name="staged_swap_16x64_basic_nt_colbias_silu", layout_b="col", tile_m=16, tile_n=64, tile_k=128,
                   launch_schedule="basic", launch_swap="yes", epilogue_bias="col", epilogue_activation="silu",
                   epilogue_store="staged"),
        KernelSpec(name="staged_rowbias_relu_nt", layout_a="col", tile_m=128, tile_n=128, epilogue_bias="row",
                   epilogue_activation="relu", epilogue_store="staged"),
        KernelSpec(name="staged_coop_128x256_headline", tile_m=128, tile_n=256, tile_k=64, cluster_n=2,
                   launch_schedule="cooperative", epilogue_store="staged"),
        KernelSpec(name="staged_pingpong_128x128_bf16_colc_batched", types_a="bf16", types_b="bf16", types_c="bf16",
                   layout_c="col", problem_batch="any", tile_m=128, tile_n=128, launch_schedule="pingpong",
                   epilogue_store="staged"),
        KernelSpec(name="staged_pingpong_64x256_tn", layout_b="col", tile_m=64, tile_n=256, tile_k=64,
                   launch_schedule="pingpong", epilogue_store="staged"),
        KernelSpec(name="staged_basic_64x8_c1x4_f32out", types_c="f32", tile_m=64, tile_n=8, tile_k=64,
                   cluster_n=4, launch_schedule="basic", epilogue_beta=1.0, epilogue_store="staged"),
        KernelSpec(name="staged_swap_8x64_basic_nt", layout_b="col", tile_m=8, tile_n=64, tile_k=64,
                   launch_schedule="basic", launch_swap="yes", epilogue_store="staged"),
        KernelSpec(name="staged_swap_parallel4_48x64_tn_colbias", layout_a="col", tile_m=48, tile_n=64, tile_k=64,
                   launch_schedule="pingpong", launch_swap="yes", split_k_slices=4, split_k_mode="parallel",
                   epilogue_bias="col", epilogue_activation="relu", epilogue_store="staged"),
        KernelSpec(name="staged_splitk3_workspace_coop_128x128_c", tile_m=128, tile_n=128, split_k_slices=3,
                   split_k_mode="workspace", epilogue_beta=1.0, epilogue_store="staged"),
        KernelSpec(name="staged_streamk_128x256_c1x2", tile_m=128, tile_n=256, split_k_mode="stream_k",
                   cluster_n=2, epilogue_store="staged"),
        # Session 39: column halves at 96 and 128 wide (fp32 partial sums of parallel split-K, the cooperative
        # tile whose whole staged block cost a pipeline stage; a swapped tile 96 wide in CUTLASS's N)
        KernelSpec(name="staged_parallel4_coop_128x128_f32_halves", tile_m=128, tile_n=128, tile_k=64,
                   launch_schedule="cooperative", split_k_slices=4, split_k_mode="parallel",
                   epilogue_store="staged"),
        # Session 40: the gated CUTLASS GEMM (epilogue gate: B's gate and up columns in one tile through a nested TMA
        # layout, act(gate) * up paired in the staged epilogue), every schedule, both gates, a bias, bf16, clusters
        KernelSpec(name="gated_basic_64x64_silu", layout_b="col", tile_m=64, tile_n=64, tile_k=64,
                   launch_schedule="basic", epilogue_gate="silu", epilogue_store="staged"),
        KernelSpec(name="gated_pingpong_64x128_gelu_colbias_bf16", types_a="bf16", types_b="bf16", types_c="bf16",
                   layout_b="col", tile_m=64, tile_n=128, tile_k=64, launch_schedule="pingpong",
                   epilogue_gate="gelu_tanh", epilogue_bias="col", epilogue_store="staged"),
        KernelSpec(name="gated_coop_128x128_c2x1_silu", layout_b="col", tile_m=128, tile_n=128, tile_k=64,
                   cluster_m=2, launch_schedule="cooperative", epilogue_gate="silu", epilogue_store="staged"),
        KernelSpec(name="gated_coop_256x64_c1x2_alpha_k128", layout_b="col", tile_m=256, tile_n=64, tile_k=128,
                   cluster_n=2, launch_schedule="cooperative", epilogue_alpha=0.5, epilogue_gate="silu",
                   epilogue_store="staged"),
        KernelSpec(name="gated_pingpong_128x48_colbias_bf16", types_a="bf16", types_b="bf16", types_c="bf16",
                   layout_b="col", tile_m=128, tile_n=48, tile_k=64, launch_schedule="pingpong",
                   epilogue_gate="silu", epilogue_bias="col", epilogue_store="staged"),
        KernelSpec(name="staged_swap_96x64_pingpong_nt_halves", layout_b="col", tile_m=96, tile_n=64, tile_k=64,
                   launch_schedule="pingpong", launch_swap="yes", epilogue_bias="col", epilogue_store="staged"),
    ]
    rng = random.Random(seed)
    choices = {
        "types_a": ("f16", "bf16"), "types_c": ("f16", "bf16", "f32"),
        "layout_a": ("row", "col"), "layout_b": ("row", "col"), "layout_c": ("row", "col"),
        "tile_m": (64, 128, 256), "tile_n": (8, 16, 32, 48, 64, 96, 128, 192, 256), "tile_k": (32, 64, 128),
        "pipeline_stages": ("auto", 2, 3, 4, 5, 6), "launch_schedule": ("auto", "cooperative", "pingpong", "basic"),
        "cluster_m": (1, 2), "cluster_n": (1, 2), "swizzle_group": (1, 2, 4, 8), "swizzle_raster": ("m", "n"),
        "split_k_slices": (1, 1, 1, 2, 4),
        "split_k_mode": ("workspace", "workspace", "atomic", "stream_k", "parallel"),
        "epilogue_beta": (0.0, 0.0, 1.0), "epilogue_bias": ("none", "row", "col"),
        "epilogue_activation": ("none", "relu", "gelu", "silu"), "problem_batch": (1, 1, "any"),
    }
    if only:
        fixed = [spec for spec in fixed if only in spec.name]
        count = len(fixed)
    specs, seen = [], set()
    for spec in fixed:
        validate(spec, "cutlass")
        specs.append(spec)
        seen.add(spec.replace(name="kernel"))
    attempts = 0
    while len(specs) < count and attempts < 100_000:
        attempts += 1
        knobs = {name: rng.choice(values) for name, values in choices.items()}
        knobs["types_b"] = knobs["types_a"]
        spec = KernelSpec(name=f"rand{len(specs):03d}", **knobs)
        if spec.replace(name="kernel") in seen:
            continue
        try:
            validate(spec, "cutlass")
        except L2ValidationError:
            continue
        seen.add(spec.replace(name="kernel"))
        specs.append(spec)
    return specs[:max(count, 1)]


def time_kernel_protocol(candidate, baseline, warmup_s: float = 1.0, iters: int = 50, reps: int = 15):
    """Median seconds per launch of `candidate()` and `baseline()`: back-to-back launches between CUDA events,
    repetitions interleaved (alternating which side goes first), after a timed warm-up of both."""
    import torch
    for fn in (candidate, baseline):
        end = time.perf_counter() + warmup_s / 2
        while time.perf_counter() < end:
            fn()
        torch.cuda.synchronize()
    samples = {"candidate": [], "baseline": []}
    for rep in range(reps):
        order = [("candidate", candidate), ("baseline", baseline)]
        if rep % 2:
            order.reverse()
        for name, fn in order:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            stop.record()
            stop.synchronize()
            samples[name].append(start.elapsed_time(stop) / 1e3 / iters)
    return statistics.median(samples["candidate"]), statistics.median(samples["baseline"])


def timing_operands(spec, m, n, k, seed):
    import torch
    from l2c.verify import make_inputs
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    a, b, c, bias, out = make_inputs(spec, m, n, k, 1, torch.device("cuda"), gen)
    out.zero_()
    return a, b, c, bias, out


def time_one(kernel, m, n, k, seed):
    """Time the kernel against torch.matmul on the same A and B (the baseline has no fused epilogue)."""
    import torch
    spec = kernel.valid.spec
    a, b, c, bias, out = timing_operands(spec, m, n, k, seed)
    base_out = torch.empty(m, n, dtype=a.dtype, device="cuda")
    cand_s, base_s = time_kernel_protocol(lambda: kernel(a, b, c=c, bias=bias, out=out),
                                          lambda: torch.matmul(a, b, out=base_out))
    flops = 2 * m * n * k
    return {"m": m, "n": n, "k": k, "candidate_s": cand_s, "baseline_s": base_s,
            "candidate_tflops": flops / cand_s / 1e12, "baseline_tflops": flops / base_s / 1e12,
            "speedup": base_s / cand_s,
            "baseline_note": "torch.matmul(a, b) in the input dtype; the candidate's fused epilogue is extra work"}


def environment(settings):
    """The environment row every result file carries (l2c.bench's: GPU, driver, CUDA, torch, triton, CUTLASS)."""
    from l2c.results_file import environment as bench_environment
    from l2c.devices import get_device
    return bench_environment(get_device("cuda"), ["kernel"], " ".join(["python"] + sys.argv), settings)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=False, help="JSON result file")
    parser.add_argument("--count", type=int, default=32, help="specs to sample (including the hand-picked ones)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="only the hand-picked specs whose name contains this text")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--manifest", help="JSON of spec -> .so: written with --compile-only, read otherwise")
    parser.add_argument("--compile-only", action="store_true", help="build the sample and stop (no GPU needed)")
    parser.add_argument("--no-timing", action="store_true", help="verify only")
    args = parser.parse_args(argv)
    if not args.compile_only and not args.out:
        parser.error("--out is required unless --compile-only")

    from l2c.targets.cutlass.build import build_many
    from l2c.targets.cutlass.kernel import load_cutlass
    from l2c.parser import parse_one

    started = time.perf_counter()
    if args.manifest and not args.compile_only:
        entries = json.loads(Path(args.manifest).read_text())
        valids = [validate(parse_one(e["spec"]), "cutlass") for e in entries]
        kernels = []
        for valid, entry in zip(valids, entries):
            try:
                kernels.append(load_cutlass(valid, entry["library"]) if entry.get("library")
                               else BuildError(entry["error"]))
            except BuildError as err:
                kernels.append(err)
        build_s = None
    else:
        valids = [validate(s, "cutlass") for s in sample_specs(args.count, args.seed, args.only)]
        t0 = time.perf_counter()
        kernels = build_many(valids, workers=args.workers)
        build_s = time.perf_counter() - t0
        print(f"built {sum(not isinstance(k, BuildError) for k in kernels)}/{len(kernels)} kernels in "
              f"{build_s:.0f} s", flush=True)
        if args.manifest:
            Path(args.manifest).write_text(json.dumps([
                {"spec": v.spec.to_l2(), "library": None if isinstance(k, BuildError) else str(k.path),
                 "error": str(k) if isinstance(k, BuildError) else None}
                for v, k in zip(valids, kernels)], indent=1))
    if args.compile_only:
        return 0 if not any(isinstance(k, BuildError) for k in kernels) else 1

    import torch
    from l2c.verify import verify
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to verify", file=sys.stderr)
        return 2

    report = {"environment": environment(vars(args)), "build_seconds": build_s, "kernels": []}
    for index, (valid, kernel) in enumerate(zip(valids, kernels)):
        spec = valid.spec
        entry = {"name": spec.name, "spec": spec.to_l2(), "schedule": valid.schedule,
                 "predicted_stages": valid.stages, "predicted_smem_bytes": valid.smem_bytes}
        report["kernels"].append(entry)
        if isinstance(kernel, BuildError):
            entry.update(status="build_failed", error=str(kernel)[:4000])
            print(f"{spec.name}: BUILD FAILED", flush=True)
            continue
        entry.update(stages=kernel.stages, smem_bytes=kernel.shared_memory_bytes,
                     stages_match=kernel.stages == valid.stages)
        checks = []
        if spec.parallel_split_k:   # a K the slices cannot split evenly is refused (ValueError: torch serves it)
            try:
                a, b, c, bias, _ = timing_operands(spec, 64, 64, 8 * spec.split_k_slices + 8, args.seed)
                kernel(a, b, c=c, bias=bias)
                entry["rejects_uneven_k"] = False
            except ValueError:
                entry["rejects_uneven_k"] = True
        shapes = (PARALLEL_VERIFY_SHAPES if spec.parallel_split_k else
                  GATED_VERIFY_SHAPES if spec.epilogue_gate != "none" else VERIFY_SHAPES)
        for m, n, k in shapes:
            batch = VERIFY_BATCH if spec.problem_batch == "any" else spec.problem_batch
            result = verify(kernel, m, n, k, batch=batch, device="cuda", seed=args.seed + index)
            checks.append({"m": m, "n": n, "k": k, "batch": batch, "ok": result.ok, "rel_error": result.rel_error,
                           "tolerance": result.tolerance, "reason": result.reason})
        entry["verify"] = checks
        entry["status"] = "ok" if all(c["ok"] for c in checks) and entry.get("rejects_uneven_k", True) else "wrong"
        print(f"{spec.name}: {entry['status']} (max rel err "
              f"{max(c['rel_error'] for c in checks):.2e})", flush=True)
        if entry["status"] != "ok" or args.no_timing or spec.epilogue_gate != "none":   # gated: timed by l2c bench
            continue
        shapes = [HEADLINE_SHAPE] if spec.name == HEADLINE.name else TIME_SHAPES[:2]
        if spec.problem_batch not in (1, "any"):
            continue
        entry["timing"] = []
        for m, n, k in shapes:
            try:
                timing = time_one(kernel, m, n, k, args.seed)
            except (ValueError, RuntimeError) as err:
                timing = {"m": m, "n": n, "k": k, "error": str(err)}
            entry["timing"].append(timing)
            if "speedup" in timing:
                print(f"  {m}x{n}x{k}: {timing['candidate_tflops']:.0f} TFLOP/s vs torch "
                      f"{timing['baseline_tflops']:.0f} (x{timing['speedup']:.3f})", flush=True)
        if spec.name == HEADLINE.name:
            for m, n, k in TIME_SHAPES[1:]:
                entry["timing"].append(time_one(kernel, m, n, k, args.seed))

    ok = [e for e in report["kernels"] if e.get("status") == "ok"]
    report["summary"] = {
        "sampled": len(report["kernels"]), "built": sum(e.get("status") != "build_failed" for e in report["kernels"]),
        "verified": len(ok), "wrong": [e["name"] for e in report["kernels"] if e.get("status") == "wrong"],
        "build_failed": [e["name"] for e in report["kernels"] if e.get("status") == "build_failed"],
        "stage_mismatches": [e["name"] for e in report["kernels"] if e.get("stages_match") is False],
        "headline": next((e.get("timing") for e in report["kernels"] if e["name"] == HEADLINE.name), None),
        "wall_seconds": time.perf_counter() - started,
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report["summary"], indent=1))
    return 0 if not report["summary"]["wrong"] and not report["summary"]["build_failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
