#!/usr/bin/env python
"""Does the learned policy beat Optuna alone in sample efficiency on held-out shapes?

    python scripts/sample_efficiency.py --runner model     # CPU: analytic cost MODEL (not a measurement)
    python scripts/sample_efficiency.py --runner gpu       # H200: real build + verify + measure

Trains the policy on TPE searches of the training shapes, then runs random, TPE and policy(+TPE) for
--trials trials per held-out shape and seed, and writes best-speedup-after-n curves (geometric mean over
shapes of the mean over seeds) to benchmarks/results/sample_efficiency_<runner>.json. Outcomes are cached
in a results store (default benchmarks/store/sample_efficiency_<runner>.sqlite), so a rerun after a kill
or a time limit resumes and each distinct (shape, spec) is measured once.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Off-grid, LLM-like shapes for the model; the GPU default is smaller (each trial is a real compile).
MODEL_SHAPES = [(m, n, k) for m in (16, 128, 512, 2048, 8192) for n in (1024, 4096, 14336)
                for k in (1024, 4096, 8192)]
GPU_SHAPES = [(m, n, k) for m in (16, 256, 2048) for n in (1024, 4096) for k in (1024, 4096)]


def environment(runner_kind: str) -> dict:
    import optuna
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__, "optuna": optuna.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:])}
    if runner_kind == "gpu":   # the GPU, driver, CUDA, triton and CUTLASS versions, as l2c bench records them
        from l2c.results_file import environment as bench_environment
        from l2c.devices import get_device
        env.update({k: v for k, v in bench_environment(get_device("cuda"), [], env["command"], {}).items()
                    if k in ("gpu", "driver", "cuda", "triton", "cutlass", "sm", "sm_count")})
    else:
        env["note"] = "outcomes from the analytic cost model of search/costmodel.py: a MODEL, not measurements"
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runner", choices=["model", "gpu"], default="model")
    ap.add_argument("--target", default=None, help="targets (default: triton,cutlass for model, triton for gpu)")
    ap.add_argument("--train", type=int, default=None, help="training shapes (default 24 model / 6 gpu)")
    ap.add_argument("--held-out", type=int, default=None, help="held-out shapes (default 8 model / 2 gpu)")
    ap.add_argument("--train-trials", type=int, default=None, help="TPE trials per training shape (40 / 16)")
    ap.add_argument("--trials", type=int, default=None, help="trials per held-out search (20 / 10)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per method and shape (5 / 2)")
    ap.add_argument("--store", default=None)
    ap.add_argument("--train-store", default=None,
                    help="train the policy on every result this store holds for the runner's GPU and protocol "
                         "(e.g. a real tune's store) instead of collecting TPE searches; held-out shapes must "
                         "not be in it")
    ap.add_argument("--methods", default=",".join(("random", "tpe", "policy")))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    gpu = args.runner == "gpu"

    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sys.path.insert(0, str(ROOT))
    from l2c.search.efficiency import compare
    from l2c.search.runners import make_runner
    from l2c.search.space import problems
    from l2c.search.store import Store

    targets = tuple((args.target or ("triton" if gpu else "triton,cutlass")).split(","))
    n_train = args.train or (6 if gpu else 24)
    n_held = args.held_out or (2 if gpu else 8)
    shapes = list(GPU_SHAPES if gpu else MODEL_SHAPES)
    random.Random(0).shuffle(shapes)
    if n_train + n_held > len(shapes):
        ap.error(f"only {len(shapes)} shapes available")
    probs = problems(shapes)
    train, held = probs[:n_train], probs[n_train:n_train + n_held]
    store_path = Path(args.store or ROOT / "benchmarks" / "store" / f"sample_efficiency_{args.runner}.sqlite")
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"sample_efficiency_{args.runner}.json")
    store = Store(store_path)
    runner = make_runner(args.runner, "kernel")
    train_store, n_train_trials = store, args.train_trials or (16 if gpu else 40)
    if args.train_store:   # train on everything that store holds: compare() derives the training problems
        train, train_store = None, Store(args.train_store)
        trained_on = {r.problem for r in train_store.results()}
        held = [p for p in probs if p.key() not in trained_on][:n_held]
        if len(held) < n_held:
            ap.error(f"only {len(held)} shapes of the list are not in {args.train_store}")
    t0 = time.time()
    result = compare(train, held, runner, targets=targets, methods=tuple(args.methods.split(",")),
                     n_train_trials=n_train_trials, n_trials=args.trials or (10 if gpu else 20),
                     seeds=tuple(range(args.seeds or (2 if gpu else 5))), train_store=train_store, eval_store=store,
                     log=lambda s: print(f"[{time.time() - t0:6.0f}s] {s}", file=sys.stderr, flush=True))
    result["environment"] = environment(args.runner)
    result["seconds"] = round(time.time() - t0, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    n = result["n_trials"]
    print(f"{'MODEL' if not gpu else result['gpu']}: geomean over {len(held)} held-out shapes of the best speedup "
          f"after n trials (mean over {len(result['seeds'])} seeds)")
    marks = sorted(m for m in {1, 3, 5, n // 2, n} if 1 <= m <= n)
    print("method  " + "  ".join(f"n={m:<3d}" for m in marks))
    for method, s in result["methods"].items():
        curve = s["geomean_best_after_n"]
        print(f"{method:7s} " + "  ".join(f"{curve[m - 1]:5.3f}" for m in marks))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
