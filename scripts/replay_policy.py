#!/usr/bin/env python
"""Does the learned policy, trained on measured screens, rank kernels well on shapes it has not seen? (CPU only)

    python scripts/replay_policy.py --out benchmarks/results/replay_policy_h200.json

A replay of real H200 measurements, no GPU needed. The `l2c bench` screens it reads (`SCREENS`) measured a
pool of shape-generic kernels on every grid shape (verified, `kernel` protocol). They left the tree with the other
superseded results; git keeps them (2.3 MB):

    for f in grid_pool_h200 grid_tma_pool_h200 grid_tma2_pool_h200 grid_bf16_top6_h200; do
        git show cf178e0:benchmarks/results/$f.jsonl.xz > benchmarks/results/$f.jsonl.xz; done
 They are imported into a
throwaway results store (`l2c import`'s conversion). The shapes are split into folds. For each fold the policy is
trained on the other folds' results only, exactly as `l2c tune` trains it on a store (`Policy.fit_store`). It then
orders each held-out shape's measured candidates by its log-probability. The figure is the best measured speedup
among the first k candidates in that order, against the expected best of k candidates drawn at random and
against the best of all (the oracle). It is a geomean over the held-out shapes, for k = 1, 2, 4, 8.

This measures the policy's prior over measured points only, not a search: a tune also draws points that no
screen measured. It is the same question as the GPU sample-efficiency run (benchmarks/results/
sample_efficiency_gpu.json) on hundreds of held-out shapes instead of six.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import defaultdict
from itertools import combinations
from pathlib import Path
from statistics import geometric_mean

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCREENS = ["benchmarks/results/grid_pool_h200.jsonl.xz", "benchmarks/results/grid_tma_pool_h200.jsonl.xz",
           "benchmarks/results/grid_tma2_pool_h200.jsonl.xz", "benchmarks/results/grid_bf16_top6_h200.jsonl.xz"]
KS = (1, 2, 4, 8)


def expected_best_of_random(speedups, k: int) -> float:
    """E[max of a uniformly random k-subset] (exact: order statistics of the sorted values)."""
    s = sorted(speedups)
    n = len(s)
    if k >= n:
        return s[-1]
    total = math.comb(n, k)
    # the i-th smallest (0-based) is the max of comb(i, k-1) of the subsets
    return sum(s[i] * math.comb(i, k - 1) for i in range(k - 1, n)) / total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "replay_policy_h200.json"))
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--screens", nargs="+", default=SCREENS)
    args = ap.parse_args(argv)

    from l2c.results_file import read_rows
    from l2c.commands.import_results import results_from_rows
    from l2c.search.policy import Policy
    from l2c.search.space import Problem
    from l2c.search.store import Store

    missing = [p for p in args.screens if not (ROOT / p).is_file()]
    if missing:
        ap.error(f"{', '.join(missing)}: not found (the committed screens are in git history: see this script's "
                 "docstring for the `git show` command)")
    results, cache = [], {}
    for path in args.screens:
        rs, counts = results_from_rows(read_rows(ROOT / path), "sm_90", cache)
        results += [r for r in rs if r.params and r.protocol == "kernel"]
        print(f"{path}: {counts}", flush=True)
    by_problem = defaultdict(dict)     # problem key -> {spec text: Result}; a later screen replaces an earlier one
    for r in results:
        by_problem[r.problem][r.spec] = r
    problems = sorted(by_problem)
    rng = random.Random(args.seed)
    rng.shuffle(problems)
    folds = [problems[i::args.folds] for i in range(args.folds)]

    per_shape = []
    for f, held in enumerate(folds):
        held_set = set(held)
        store = Store(":memory:")
        store.record_many(r for key in problems if key not in held_set for r in by_problem[key].values())
        policy = Policy(seed=args.seed)
        n = policy.fit_store(store)
        print(f"fold {f + 1}/{args.folds}: trained on {n} results, evaluating {len(held)} held-out problems", flush=True)
        for key in held:
            cands = [r for r in by_problem[key].values() if r.status == "ok" and r.speedup]
            failed = [r for r in by_problem[key].values() if r.status != "ok"]
            if len(cands) < 2:
                continue
            problem = Problem.from_key(key)
            scored = sorted(cands, key=lambda r: -policy.log_prob(problem, r.params))
            speedups = [r.speedup for r in cands]
            row = {"problem": key, "candidates": len(cands), "failed": len(failed), "oracle": max(speedups),
                   "policy": {}, "random": {}}
            for k in KS:
                row["policy"][k] = max(r.speedup for r in scored[:k])
                row["random"][k] = expected_best_of_random(speedups, k)
            per_shape.append(row)

    summary = {"problems": len(per_shape), "oracle": geometric_mean([r["oracle"] for r in per_shape])}
    for k in KS:
        summary[f"policy_best_of_{k}"] = geometric_mean([r["policy"][k] for r in per_shape])
        summary[f"random_best_of_{k}"] = geometric_mean([r["random"][k] for r in per_shape])
        summary[f"policy_share_of_oracle_{k}"] = sum(r["policy"][k] >= r["oracle"] for r in per_shape) / len(per_shape)
    for k in KS:
        print(f"best of {k}: policy {summary[f'policy_best_of_{k}']:.3f}x  random {summary[f'random_best_of_{k}']:.3f}x  "
              f"(oracle {summary['oracle']:.3f}x; policy's first {k} hold the best on "
              f"{100 * summary[f'policy_share_of_oracle_{k}']:.0f}% of shapes)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(["scripts/replay_policy.py"] + sys.argv[1:]), "screens": args.screens,
                               "folds": args.folds, "seed": args.seed, "summary": summary, "per_problem": per_shape},
                              indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
