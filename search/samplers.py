"""Which proposal source drew each trial (the store credits it).

A sampler of ours that mixes sources declares it by subclassing `SourcedSampler`; Optuna's own samplers are
one source each.
"""
from __future__ import annotations

import abc
import optuna
from optuna.samplers import BaseSampler


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
