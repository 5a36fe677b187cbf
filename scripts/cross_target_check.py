#!/usr/bin/env python
"""One spec, both targets, the same inputs: the Triton and CUTLASS kernels must agree (on the GPU).

    python scripts/cross_target_check.py --out cross_target.json

The specs are benchmarks/cross_target.l2 (prebuild their CUTLASS side with `l2c build`).

For each spec (target `any`), build the Triton and the CUTLASS kernel, run both on the same fresh random
inputs (NaN-poisoned outputs), and compare each to the float reference and to each other
(||triton - cutlass|| / ||ref||, which must be within the spec's tolerance). Exits 1 on any disagreement.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from l2c.build import build
from l2c.errors import BuildError
from l2c.parser import parse_file
from l2c.validate import validate
from l2c.verify import make_inputs, reference, tolerance

SPECS = Path(__file__).resolve().parent.parent / "benchmarks" / "cross_target.l2"
SHAPES = [(1032, 776, 520), (4096, 4096, 4096), (64, 4096, 8192)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rows, failures = [], 0
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    for spec in parse_file(SPECS):
        try:
            kernels = {t: build(validate(spec, t)) for t in ("triton", "cutlass")}
        except BuildError as err:
            failures += 1
            rows.append({"spec": spec.to_l2(), "status": "build_failed", "reason": str(err)[-2000:]})
            print(f"BUILD FAIL {spec.name}: {str(err)[-300:]}")
            continue
        for m, n, k in SHAPES:
            a, b, c, bias, out = make_inputs(spec, m, n, k, 1, "cuda", gen)
            outs = {}
            for target, kernel in kernels.items():
                dst = out.clone()   # the same NaN-poisoned layout for each target
                outs[target] = kernel(a, b, c=c, bias=bias, out=dst).double()
            torch.cuda.synchronize()
            ref = reference(spec, a, b, c, bias, torch.float32).double()
            norm = ref.norm().item()
            err = {t: (o - ref).norm().item() / norm for t, o in outs.items()}
            between = (outs["triton"] - outs["cutlass"]).norm().item() / norm
            tol = tolerance(spec, k)
            nan = any(torch.isnan(o).any().item() for o in outs.values())
            ok = not nan and between <= tol and all(e <= tol for e in err.values())
            failures += not ok
            rows.append({"spec": spec.to_l2(), "m": m, "n": n, "k": k, "status": "ok" if ok else "mismatch",
                         "rel_error_triton": err["triton"], "rel_error_cutlass": err["cutlass"],
                         "rel_diff_triton_vs_cutlass": between, "tolerance": tol})
            print(f"{'ok  ' if ok else 'FAIL'} {spec.name:<28} {m:>5}x{n:>5}x{k:>5}  triton {err['triton']:.2e}  "
                  f"cutlass {err['cutlass']:.2e}  between {between:.2e}  tol {tol:.1e}")
    if args.out:
        from l2c.results_file import environment
        from l2c.devices import get_device
        env = environment(get_device("cuda"), [], " ".join(["python"] + sys.argv), {"seed": args.seed})
        with open(args.out, "w") as f:
            json.dump({"environment": env, "checks": rows}, f, indent=1, default=str)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
