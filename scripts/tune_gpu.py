#!/usr/bin/env python
"""Tune a meaningful subset on the GPU within a time budget, resumably; then the sample-efficiency run.

    python scripts/tune_gpu.py --minutes 5 [--cutlass]

1. `l2c tune` on LLM-like and square shapes (Triton; `--cutlass` adds the CUTLASS target, whose nvcc
   builds run in the compile pool) with the store and the Optuna journal under benchmarks/store/, the
   tuned table and winning specs exported to benchmarks/results/tuned_h200/. Killed at its share of the
   budget; rerunning the script resumes (finished trials are kept, the in-flight one is retried).
2. `scripts/sample_efficiency.py --runner gpu` with the rest of the budget (also resumable: outcomes are
   cached in its store).

Everything it writes is copied to $OUT when that is set, so a remote run's stores come back and can be
put back into benchmarks/ for the next call.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = "4096x4096x4096,8192x8192x8192,16x4096x4096,128x6144x4096,2048x28672x4096,512x4096x14336"


def run(cmd, seconds: float) -> int:
    print("$ " + " ".join(cmd), flush=True)
    try:
        return subprocess.run(cmd, cwd=ROOT, timeout=max(1.0, seconds)).returncode
    except subprocess.TimeoutExpired:
        print(f"stopped at the time budget ({seconds:.0f}s); rerun to resume", flush=True)
        return 124


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--tune-share", type=float, default=0.6, help="share of the budget for l2c tune")
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--cutlass", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    budget = args.minutes * 60
    store = ROOT / "benchmarks" / "store"
    store.mkdir(parents=True, exist_ok=True)
    target = "triton,cutlass" if args.cutlass else "triton"
    tune = [sys.executable, "-m", "l2c", "tune", "--shapes", args.shapes, "--target", target,
            "--trials", str(args.trials), "--protocol", "kernel", "--store", str(store / "tune_h200.sqlite"),
            "--storage", f"journal:{store / 'tune_h200.journal'}", "--export",
            str(ROOT / "benchmarks" / "results" / "tuned_h200"), "--seed", "0"]
    rc = run(tune, budget * args.tune_share)
    left = budget - (time.time() - t0)
    rc2 = run([sys.executable, "scripts/sample_efficiency.py", "--runner", "gpu"], left - 5) if left > 30 else 124
    out = os.environ.get("OUT")
    if out:
        for src in (store, ROOT / "benchmarks" / "results"):
            shutil.copytree(src, Path(out) / "benchmarks" / src.name, dirs_exist_ok=True)
        print(f"copied benchmarks/store and benchmarks/results to {out}/benchmarks")
    return 0 if rc == rc2 == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
