#!/usr/bin/env python
"""Write the learned policy's top proposals for a set of shapes as a `.l2` pool, to prebuild on a CPU machine.

    python scripts/policy_pool.py --shapes shapes.txt --target cutlass -n 4 [--store STORE.sqlite] -o pool.l2
    l2c build pool.l2 --target cutlass -j 2      # nvcc here, no GPU needed
    l2c tune ... --seed-specs pool.l2             # the GPU only measures

A CUTLASS candidate costs minutes of nvcc. Inside a GPU tune that time is spent while the device waits, so
the policy's likely picks are compiled ahead on the CPU machine and enter the tune as seed specs. The specs are
shape-generic and named by their knobs (`config_name`): exactly the text the tuner would build, so the tune
finds them in the build cache. The policy is the one next to the store (`policy.pt`), or one trained on the
store here when there is none or `--retrain` is given; without a store, the policy shipped for the architecture
(l2c/policy/sm_90.pt).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", required=True, help="grid | llm | square | FILE | MxNxK,...")
    ap.add_argument("--store", default=None,
                    help="results store the policy is (or was) trained on (default: the policy shipped with l2c)")
    ap.add_argument("--target", default="cutlass", choices=["triton", "cutlass"])
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--layout", default="row,row,row")
    ap.add_argument("-n", type=int, default=4, help="proposals per shape")
    ap.add_argument("--retrain", action="store_true", help="train a fresh policy on the store")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from l2c.ir import print_spec
    from l2c.search.policy import Policy, default_policy_path, shipped_policy_path
    from l2c.search.space import problems, shapes_from_arg, spec_from_params
    from l2c.search.store import Store

    if args.store is None:
        path = shipped_policy_path("sm_90")
        if path is None:
            ap.error("no policy is shipped for sm_90: give --store")
        policy, source = Policy.load(path), str(path)
    else:
        store, source = Store(args.store), args.store
        path = default_policy_path(store.path)
        if path.exists() and not args.retrain:
            policy = Policy.load(path)
        else:
            policy = Policy(seed=0)
            if policy.fit_store(store) == 0:
                ap.error(f"{args.store} holds no results to train a policy on")
    try:
        shapes = shapes_from_arg(args.shapes)
    except (ValueError, OSError) as err:
        ap.error(str(err))
    specs = {}
    for problem in problems(shapes, dtype=args.dtype, layout=args.layout):
        for params in policy.propose(problem, [args.target], args.n):
            spec = spec_from_params(params, problem, generic=True)
            specs.setdefault(spec.name, spec)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# The learned policy's top {args.n} {args.target} proposals per shape for {args.shapes} "
              f"({args.dtype}, {args.layout}),\n# policy trained on {policy.trained_on} results ({source}). "
              f"Written by scripts/policy_pool.py; prebuild with `l2c build`.\n\n")
    out.write_text(header + "\n".join(print_spec(s) for s in specs.values()))
    print(f"wrote {out}: {len(specs)} distinct spec(s) for {len(shapes)} shape(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
