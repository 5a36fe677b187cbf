#!/usr/bin/env python
"""GPU check of the CUTLASS target's gemv family (templates/cutlass/gemv.cu.j2): every spec of a sample covering both
layouts of B, f16 and bf16, tile m 1-16, CUDA cores and tensor cores, K slices 1-8 (clusters), both eviction hints,
every epilogue (alpha, beta with a C input, a bias per row or column, each activation, each gate on CUDA cores) and
the row-major CUDA-core ring (pipeline stages 2-5) is built, verified with `l2c.verify` on shapes with partial tiles
in every dimension (M above tile m, N not a multiple of tile n, K not a multiple of a slice's steps), and called
twice on the same inputs, which must agree bit for bit (the slices are added in a fixed order). Then each spec runs a
chain of calls launched with programmatic dependent launch (as L2C_OVERLAP=all), where each call's input is the
previous call's output, directly or through a torch kernel between them, eagerly and replayed from a CUDA graph:
every link must match the reference on the input it was given (a call that read its input before the call before it
finished would not), and the replay must equal the eager chain bit for bit.

    python scripts/gemv_check.py --out gemv_check.json [--only ring]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

# M, N, K: rows beyond one row tile, N ragged against every tile n, K ragged against every step and slice
SHAPES = ((1, 4104, 4096), (3, 1032, 2056), (7, 776, 14344), (13, 2056, 1096), (8, 8, 8), (2, 24, 4104))
SAMPLE = (
    # layout b, dtype, tile m, tile n, tile k, warps, slices, evict, epilogue, cores[, pipeline stages]
    ("col", "f16", 1, 8, 256, 2, 1, "first", "", "cuda"),
    ("col", "f16", 2, 16, 256, 4, 2, "first", "epilogue bias=col activation=silu", "cuda"),
    ("col", "bf16", 4, 8, 512, 2, 4, "normal", "epilogue alpha=0.5 beta=1.5", "cuda"),
    ("col", "bf16", 8, 32, 256, 8, 8, "first", "epilogue bias=row activation=gelu", "cuda"),
    ("col", "f16", 8, 8, 256, 8, 1, "first", "epilogue activation=relu", "cuda"),
    ("row", "f16", 1, 64, 64, "auto", 1, "first", "", "cuda"),
    ("row", "f16", 4, 32, 128, "auto", 4, "normal", "epilogue bias=col activation=gelu", "cuda"),
    ("row", "bf16", 2, 128, 32, "auto", 2, "first", "epilogue beta=1.0 bias=row", "cuda"),
    ("row", "bf16", 8, 16, 256, "auto", 8, "first", "epilogue alpha=2.0 activation=silu", "cuda"),
    ("col", "f16", 8, 16, 128, "auto", 1, "first", "", "tensor"),
    ("col", "bf16", 16, 32, 64, 4, 2, "first", "epilogue bias=col activation=silu", "tensor"),
    ("col", "f16", 16, 64, 32, 8, 4, "normal", "epilogue alpha=0.5 beta=1.5", "tensor"),
    ("col", "bf16", 8, 16, 32, 2, 8, "first", "epilogue bias=row activation=relu", "tensor"),
    ("row", "f16", 8, 64, 32, "auto", 1, "first", "", "tensor"),
    ("row", "bf16", 16, 128, 32, 4, 2, "first", "epilogue bias=row activation=gelu", "tensor"),
    ("row", "f16", 8, 64, 32, 8, 8, "first", "epilogue beta=1.0 bias=col", "tensor"),
    ("row", "bf16", 8, 256, 16, 4, 4, "normal", "epilogue alpha=2.0 activation=relu", "tensor"),
    ("col", "f16", 1, 16, 256, 4, 2, "first", "epilogue bias=col gate=silu", "cuda"),
    ("col", "bf16", 2, 8, 512, 4, 1, "first", "epilogue gate=gelu_tanh", "cuda"),
    ("col", "f16", 4, 8, 256, 2, 8, "normal", "epilogue alpha=0.5 gate=silu", "cuda"),
    ("row", "f16", 1, 256, 64, "auto", 8, "first", "", "cuda", 4),
    ("row", "bf16", 2, 256, 32, "auto", 1, "first", "epilogue bias=col activation=silu", "cuda", 2),
    ("row", "f16", 4, 128, 64, "auto", 4, "normal", "epilogue alpha=0.5 beta=1.5", "cuda", 3),
    ("row", "bf16", 8, 64, 128, "auto", 2, "first", "epilogue bias=row activation=gelu", "cuda", 3),
    ("row", "f16", 2, 256, 64, "auto", 4, "first", "epilogue activation=relu", "cuda", 5),
)


def spec_text(layout_b, dtype, tm, tn, tk, warps, slices, evict, epilogue, cores="cuda", stages="auto"):
    from l2c.ir import config_name
    from l2c.parser import parse_one
    text = (f"kernel k {{\n  target cutlass\n  problem m=any n=any k=any\n  types a={dtype} b={dtype} c={dtype} "
            f"acc=f32\n  layout a=row b={layout_b} c=row\n  launch family=gemv warps={warps} evict={evict} "
            f"cores={cores}\n"
            f"  tile m={tm} n={tn} k={tk}\n  pipeline stages={stages}\n  split_k slices={slices}\n  {epilogue}\n}}\n")
    spec = parse_one(text)
    return spec.replace(name=config_name(spec)).to_l2()


CHAIN = (5, 1032, 6)   # M, N = K (each output is the next input), links


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--only", choices=("ring",), help="only the row-major CUDA-core ring's specs")
    args = ap.parse_args()
    sample = [row for row in SAMPLE if args.only != "ring" or len(row) > 10]
    import torch
    from l2c.errors import BuildError
    from l2c.parser import parse_one
    from l2c.targets.cutlass.build import build_many
    from l2c.validate import validate
    from l2c.verify import check_chain, make_inputs, verify
    valids = [validate(spec, "cutlass") for spec in (parse_one(spec_text(*row)) for row in sample)]
    t0 = time.monotonic()
    kernels = build_many(valids, workers=args.workers)
    build_s = time.monotonic() - t0
    rows, failures = [], 0
    for valid, kernel in zip(valids, kernels):
        row = {"spec": valid.spec.to_l2(), "name": valid.name}
        if isinstance(kernel, BuildError):
            row["build_error"] = str(kernel)[:2000]
            failures += 1
            rows.append(row)
            continue
        row["checks"] = []
        for m, n, k in SHAPES:
            result = verify(kernel, m, n, k, device="cuda")
            gen = torch.Generator(device="cuda")
            gen.manual_seed(m * n + k)
            a, b, c, bias = make_inputs(valid.spec, m, n, k, 1, torch.device("cuda"), gen)[:4]
            first = kernel(a, b, c=c, bias=bias)
            second = kernel(a, b, c=c, bias=bias)
            same = bool(torch.equal(first, second))
            ok = result.ok and same
            failures += not ok
            row["checks"].append({"m": m, "n": n, "k": k, "ok": result.ok, "rel_error": result.rel_error,
                                  "tolerance": result.tolerance, "reason": result.reason, "deterministic": same})
        default = kernel.set_overlap(True)   # the chain with overlapping launches, whatever L2C_OVERLAP chose
        row["chain"] = check_chain(kernel, *CHAIN)
        kernel.set_overlap(default)
        failures += not row["chain"]["ok"]
        rows.append(row)
        print(f"{valid.name}: " + ", ".join("ok" if c["ok"] and c["deterministic"] else f"FAIL {c['reason']}"
                                            for c in row["checks"])
              + (", chain ok" if row["chain"]["ok"] else f", chain FAIL {row['chain']}"), flush=True)
    summary = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "specs": len(valids),
               "checks": sum(len(r.get("checks", [])) + ("chain" in r) for r in rows), "failures": failures,
               "build_s": round(build_s, 1), "command": " ".join(sys.argv), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"gemv_check: {summary['checks']} checks of {len(valids)} specs, {failures} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
