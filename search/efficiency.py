"""Sample-efficiency harness: does the learned policy find fast kernels in fewer trials than Optuna alone?

Protocol: collect TPE searches on training shapes into a store, train the policy on that store, then on
held-out shapes (never seen in training) run each method for N trials over several seeds and compare
best-speedup-after-n-trials curves. Methods: `random`, `tpe` (Optuna alone) and `policy` (policy
warm start enqueued into the study + PolicySampler mixing policy and TPE draws).

The runner decides what a trial's outcome is: the analytic cost model (CPU; a MODEL, labelled as such),
a planted reward function (tests), or the GPU (real measurements). A store shared across the evaluation
runs caches outcomes per (shape, spec), so on the GPU each distinct spec is measured once per shape no
matter how many methods and seeds draw it.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Dict, List, Optional, Sequence

import optuna
from optuna.trial import TrialState

from .policy import FAIL_REWARD, Policy
from .space import Problem
from .store import Store
from .study import COUNTED, TuneConfig, make_sampler
from .warmstart import warm_start
from .workers import StudyWorker, run_studies

METHODS = ("random", "tpe", "policy")


def best_curve(study: optuna.Study, n: int) -> List[float]:
    """Best speedup after each of the first n budgeted trials (0 until one succeeds; flat after the end)."""
    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
              if t.user_attrs.get("status") in COUNTED]
    trials.sort(key=lambda t: t.number)
    curve, best = [], 0.0
    for t in trials[:n]:
        if t.state == TrialState.COMPLETE and t.value is not None:
            best = max(best, t.value)
        curve.append(best)
    return curve + [best] * (n - len(curve))


def run_search(problem: Problem, runner, store: Store, cfg: TuneConfig, policy: Optional[Policy] = None,
               study_name: str = "study") -> optuna.Study:
    """One in-memory study of cfg.n_trials budgeted trials on `problem`."""
    sampler = make_sampler(cfg, problem, policy)
    study = optuna.create_study(direction="maximize", sampler=sampler, study_name=study_name)
    if policy is not None:
        warm_start(study, problem, cfg, policy=policy)
    run_studies([StudyWorker(study, problem, runner, store, cfg)])
    return study


def collect(problems: Sequence[Problem], runner, store: Store, n_trials: int, targets, seed: int = 0) -> None:
    """Training data: a TPE search per training shape, recorded in the store."""
    cfg = TuneConfig(targets=tuple(targets), n_trials=n_trials, sampler="tpe", seed=seed, share_best=False)
    for i, p in enumerate(problems):
        run_search(p, runner, store, replace(cfg, seed=seed + i), study_name=f"train-{i}")


def _samples(store: Store, keys, runner):
    out = []
    for r in store.results(gpu=runner.gpu, protocol=runner.protocol):
        if r.problem in keys and r.params:
            reward = math.log(r.speedup) if r.status == "ok" and r.speedup else FAIL_REWARD
            out.append((Problem.from_key(r.problem), r.params, reward))
    return out


def compare(train: Optional[Sequence[Problem]], held_out: Sequence[Problem], runner, *, targets=("triton", "cutlass"),
            n_train_trials: int = 40, n_trials: int = 20, seeds: Sequence[int] = (0, 1, 2),
            methods: Sequence[str] = METHODS, train_store: Optional[Store] = None,
            eval_store: Optional[Store] = None, policy_fraction: float = 0.5, warm: int = 5,
            log=lambda s: None) -> Dict[str, object]:
    """Run the protocol above; returns a JSON-ready dict with per-method mean curves and per-shape finals.

    `train=None`: train on every problem `train_store` already holds for the runner's GPU and protocol (e.g. a
    real tune's measured outcomes) and collect nothing.
    """
    train_store = train_store or Store(":memory:")
    eval_store = eval_store or Store(":memory:")
    if train is None:
        stored = {r.problem for r in train_store.results(gpu=runner.gpu, protocol=runner.protocol)}
        train, n_train_trials = [Problem.from_key(k) for k in sorted(stored)], 0
    train_keys = {p.key() for p in train}
    if any(p.key() in train_keys for p in held_out):
        raise ValueError("a held-out shape is also a training shape")
    if n_train_trials > 0:
        log(f"collecting TPE data on {len(train)} training shape(s) x {n_train_trials} trials (stored results reused)")
        collect(train, runner, train_store, n_train_trials, targets, seed=1000)
    policy = Policy(seed=0)
    samples = _samples(train_store, train_keys, runner)   # never the held-out shapes
    policy.fit(samples)
    n_samples = len(samples)
    log(f"policy trained on {n_samples} results")
    curves: Dict[str, Dict[str, List[List[float]]]] = {m: {} for m in methods}
    for method in methods:
        for seed in seeds:
            for i, p in enumerate(held_out):
                cfg = TuneConfig(targets=tuple(targets), n_trials=n_trials, seed=seed * 100 + i,
                                 sampler="policy" if method == "policy" else method,
                                 policy_fraction=policy_fraction, warm_start=warm, share_best=False)
                study = run_search(p, runner, eval_store, cfg, policy if method == "policy" else None,
                                   study_name=f"{method}-{seed}-{i}")
                curves[method].setdefault(p.key(), []).append(best_curve(study, n_trials))
            log(f"{method} seed {seed} done")
    summary: Dict[str, object] = {}
    for method, per_shape in curves.items():
        # mean over seeds per shape, then geometric mean over shapes (speedups are ratios)
        shape_means = {k: [statistics.fmean(c[j] for c in cs) for j in range(n_trials)] for k, cs in per_shape.items()}
        mean_curve = [math.exp(statistics.fmean(math.log(max(v[j], 1e-9)) for v in shape_means.values()))
                      for j in range(n_trials)]
        summary[method] = {"geomean_best_after_n": mean_curve, "final": mean_curve[-1],
                           "per_shape_final": {k: v[-1] for k, v in shape_means.items()},
                           "curves": {k: cs for k, cs in per_shape.items()}}
    return {"runner": type(runner).__name__, "gpu": runner.gpu, "protocol": runner.protocol,
            "targets": list(targets), "n_trials": n_trials, "n_train_trials": n_train_trials, "seeds": list(seeds),
            "train_shapes": [p.key() for p in train], "train_store": str(getattr(train_store, "path", "")),
            "held_out_shapes": [p.key() for p in held_out],
            "policy_trained_on": n_samples, "methods": summary}
