"""Which Optuna sampler a study asks, and which proposal source drew each trial (the store credits it).

A sampler of ours that mixes sources declares it by subclassing `SourcedSampler`; Optuna's own samplers are
one source each.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING

import optuna
from optuna.samplers import BaseSampler

from .space import Problem

if TYPE_CHECKING:
    from .study import TuneConfig


class SourcedSampler(BaseSampler):
    """A sampler that draws trials from more than one source and says which drew a trial."""

    @abc.abstractmethod
    def source_for(self, number: int) -> str:
        """The source (`policy`, `tpe`, ...) that drew trial `number`."""


def source_of(sampler: BaseSampler, number: int) -> str:
    """The source that drew trial `number` of a study asking `sampler`."""
    if isinstance(sampler, SourcedSampler):
        return sampler.source_for(number)
    return "random" if isinstance(sampler, optuna.samplers.RandomSampler) else "tpe"


def make_sampler(cfg: "TuneConfig", problem: Problem, policy=None, seed_offset: int = 0) -> BaseSampler:
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
        from .policy import PolicySampler
        return PolicySampler(policy, problem, cfg.targets, fraction=cfg.policy_fraction, seed=seed)
    raise ValueError(f"unknown sampler {cfg.sampler!r}")
