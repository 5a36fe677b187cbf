#!/usr/bin/env python
"""GPU check of programmatic dependent launch on every CUTLASS-target kernel the shipped tables serve: each kernel
the pack holds (`l2c.pack.required_kernels`) runs `l2c.verify.check_chain`, a chain of calls where each reads the
previous one's output, eagerly and from a CUDA graph, with the launches overlapping (as L2C_OVERLAP=all) and
without (as L2C_OVERLAP=0); every link must match the reference.

    python scripts/overlap_check.py --out overlap_check.json
"""
from __future__ import annotations

import argparse
import json
import sys

CHAIN = (24, 1536, 6)   # M, N = K (each output is the next input), links; 1536 takes every shipped split of K


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    from l2c.errors import BuildError
    from l2c.pack import required_kernels, shipped_tables
    from l2c.parser import parse_one
    from l2c.targets.cutlass.build import build_many
    from l2c.validate import validate
    from l2c.verify import check_chain
    arch, required, problems = required_kernels(shipped_tables())
    required = [r for r in required if r.name.startswith("cutlass_")]
    valids = [validate(parse_one(r.spec), "cutlass", arch) for r in required]
    kernels = build_many(valids)
    rows, failures = [], len(problems)
    for r, kernel in zip(required, kernels):
        row = {"name": r.name, "label": r.label}
        if isinstance(kernel, BuildError):
            row["build_error"] = str(kernel)[:1000]
            failures += 1
        else:
            default = kernel.set_overlap(True)
            row["overlap"] = check_chain(kernel, *CHAIN)
            kernel.set_overlap(False)
            row["plain"] = check_chain(kernel, *CHAIN)
            kernel.set_overlap(default)
            if not (row["overlap"]["ok"] and row["plain"]["ok"]):
                failures += 1
                print(f"FAIL {r.name} ({r.label}): {row}", flush=True)
        rows.append(row)
    summary = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "kernels": len(rows),
               "failures": failures, "problems": problems, "chain": dict(zip(("m", "n_k", "links"), CHAIN)),
               "command": " ".join(sys.argv), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"overlap_check: {len(rows)} kernels, {failures} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
