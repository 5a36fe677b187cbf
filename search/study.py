"""One Optuna study per (problem, target set, GPU, protocol): the tune's settings, the study's name, opening it,
and reading which of its trials spent the budget."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import optuna
from optuna.samplers import BaseSampler
from optuna.trial import TrialState

from ..errors import DataFileError
from .recovery import ORPHAN_AFTER_S
from .policy import PolicySampler
from .space import Problem, TARGET_PARAM, check_targets, point_key, spec_from_params
from .store import Store

COUNTED = ("ok", "build_failed", "verify_failed", "killed_worker")   # statuses that spend the trial budget


@dataclass
class TuneConfig:
    targets: Tuple[str, ...] = ("triton", "cutlass")
    n_trials: int = 50
    protocol: str = "kernel"
    sampler: str = "auto"              # auto (policy+tpe when a policy is given, else tpe) | tpe | random | policy
    policy_fraction: float = 0.5
    warm_start: int = 8                # policy proposals enqueued into a fresh study
    seed: Optional[int] = None
    compile_workers: int = 0           # CPU processes building ahead of measurement (GPU runner)
    # Give up a study after this many asks per budgeted trial. Only 1-12% of uniformly drawn points validate (tiles
    # take any multiple of 8, which CUTLASS allows on one side only and Triton not at all, and launch swap=yes
    # decides which side; the gemv family takes few of them); an invalid point is pruned before any build, so
    # asking is cheap.
    max_ask_factor: int = 100
    min_asks: int = 600                # ... and never before this many: a small budget on a small problem (where
                                       # most split-K counts exceed its K tiles) may find only 1 valid point in 500
    share_best: bool = True            # enqueue each study's new best into its sibling studies
    seed_specs: Tuple = ()             # KernelSpecs a user supplies (e.g. a prebuilt pool), enqueued first
    orphan_after_s: float = ORPHAN_AFTER_S
    trial_timeout_s: float = 300.0     # a GPU worker evaluating one trial longer than this is stopped (supervisor.py)

    @property
    def max_asks(self) -> int:
        """Asks after which a study gives up on finding its budget of valid points."""
        return max(self.n_trials * self.max_ask_factor, self.min_asks)


def make_sampler(cfg: TuneConfig, problem: Problem, policy=None, seed_offset: int = 0) -> BaseSampler:
    """The sampler a study of `problem` asks: cfg.sampler, `auto` meaning the policy's when one is given."""
    seed = None if cfg.seed is None else cfg.seed + seed_offset
    kind = cfg.sampler
    if kind == "auto":
        kind = "policy" if policy is not None else "tpe"
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if kind == "policy":
        if policy is None:
            raise ValueError("sampler 'policy' needs a trained policy")
        return PolicySampler(policy, problem, cfg.targets, fraction=cfg.policy_fraction, seed=seed)
    raise ValueError(f"unknown sampler {cfg.sampler!r}")


def study_name(problem: Problem, targets: Sequence[str], gpu: str, protocol: str) -> str:
    return f"l2c|{problem.key()}|{'+'.join(check_targets(targets))}|{gpu}|{protocol}"


def open_study(storage, problem: Problem, cfg: TuneConfig, gpu: str, sampler=None) -> optuna.Study:
    return optuna.create_study(storage=storage, study_name=study_name(problem, cfg.targets, gpu, cfg.protocol),
                               direction="maximize", sampler=sampler, load_if_exists=True)


def open_studies(storage, problems: Sequence[Problem], cfg: TuneConfig, gpu: str, policy=None,
                 worker_index: int = 0) -> List[optuna.Study]:
    """Each problem's study with its own sampler, seeded apart per worker process and problem."""
    studies = []
    for i, p in enumerate(problems):
        sampler = make_sampler(cfg, p, policy, seed_offset=1000 * worker_index + i)
        studies.append(open_study(storage, p, cfg, gpu, sampler))
    return studies


def trial_point(trial) -> Tuple:
    """The point a trial runs: its params once asked, its fixed params while it waits in the queue (enqueued)."""
    return point_key(trial.params or trial.system_attrs.get("fixed_params", {}))


def counted_trials(study: optuna.Study) -> List[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
            if t.user_attrs.get("status") in COUNTED]


def best_of(study: optuna.Study) -> Optional[float]:
    ok = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
    return max(ok) if ok else None


def check_store_holds_study(study: optuna.Study, problem: Problem, store: Store, gpu: str, protocol: str) -> None:
    """Raise DataFileError when trials the study counts as evaluated have no result in the store (the store was
    emptied, replaced or is another one): the tune would take the study as done and export nothing of them."""
    missing = 0
    counted = counted_trials(study)
    for t in counted:
        if TARGET_PARAM not in t.params:
            continue
        spec = spec_from_params(t.params, problem, generic=True).to_l2()
        if store.get(problem.key(), spec, t.params[TARGET_PARAM], gpu, protocol) is None:
            missing += 1
    if missing:
        raise DataFileError(
            f"results store {store.path} has no result for {missing} of the {len(counted)} evaluated trials of "
            f"study {study.study_name!r} (was the store emptied or replaced?); restore the store, or start the "
            f"studies afresh with a new --storage, or move the journal away")
