"""The targets l2c lowers a spec to, each one folder behind one interface.

A target is its rules (`rules.py`: what its templates assume, `auto` knobs resolved), its templates and the
context they read (computed in Python), and its builder and runtime (the `Kernel` subclass it returns). Adding a
target, or a kernel family to one, is a folder here plus its templates; the stages (validate, lower, build) ask
`get(name)` and never branch on a target's name.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Union

from ..errors import BuildError
from ..knobs import TARGETS


class Target(ABC):
    """One lowering target. Subclasses are stateless; `get` returns the one instance of each."""
    name: str
    suffix: str                      # of the generated source file
    templates: Dict[str, str]        # kernel family (knob `launch family`) -> template path

    rules: object                    # its rules module: RULES and check(spec, arch) -> ValidSpec

    def check(self, spec, arch):
        """The target's own rules (the common ones already passed): a ValidSpec with `auto` knobs resolved."""
        return self.rules.check(spec, arch)

    def template(self, spec) -> str:
        return self.templates[spec.launch_family]

    def context(self, valid) -> Dict[str, object]:
        """What the templates read beyond the ValidSpec and the spec, computed here rather than in the template."""
        return {}

    @abstractmethod
    def toolchain_id(self) -> str:
        """The compiler versions and flags that turn this target's source into a kernel (part of a build id)."""

    @abstractmethod
    def build(self, valid):
        """The built Kernel (docs/CONTRACTS.md); BuildError on failure."""

    @abstractmethod
    def prebuild(self, valid) -> str:
        """Fill the build cache with no GPU; the cached file."""

    def native_libraries(self) -> List[str]:
        """The large shared libraries its builder's import loads (found without importing anything), which the
        start-up reads ahead of that import (`background.read_ahead`); none by default."""
        return []

    def built(self, valid) -> bool:
        """Whether `build(valid)` here runs no compiler, now or at its first launch (a load of milliseconds, which
        the dispatcher may do on a caller's thread). False where the target cannot tell."""
        return False

    def prebuild_many(self, valids, workers: int, done=None) -> List[Union[str, BuildError]]:
        """`prebuild` for each spec, `workers` at a time: the cached file or the BuildError per spec, in order,
        never raising; `done(index, outcome, kernels)` as each is known (`kernels`: how many specs the compiler
        run that built it compiled, 0 for none). A target whose compiler takes several kernels at once batches."""
        def one(i):
            try:
                outcome = self.prebuild(valids[i])
            except BuildError as err:
                outcome = err
            except Exception as err:  # noqa: BLE001 - one spec's failure, not the batch's
                outcome = BuildError(f"{self.name} build of {valids[i].name} failed: {type(err).__name__}: {err}")
            if done:
                done(i, outcome, 1)
            return outcome
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            return list(pool.map(one, range(len(valids))))


def get(name: str) -> Target:
    """The target named `name` (one of knobs.TARGETS)."""
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; expected one of {', '.join(TARGETS)}")
    return importlib.import_module(f"{__name__}.{name}").TARGET
