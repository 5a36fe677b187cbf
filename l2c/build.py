"""Build: a ValidSpec -> a Kernel object callable on torch tensors, through the target it was validated for.

Any failure to generate, write, import or compile a kernel is raised as `l2c.errors.BuildError` carrying the
underlying message, so a tuner records a failed candidate instead of crashing.
"""
from __future__ import annotations

import functools
from typing import Callable, Dict, List, Optional, Sequence, Union

from . import cache, targets
from .errors import BuildError, L2Error
from .kernel import Kernel
from .rules import ValidSpec


def build(valid: ValidSpec) -> Kernel:
    """Build `valid` for its target; raise BuildError on any failure."""
    try:
        return targets.get(valid.target).build(valid)
    except BuildError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of a builder is a failed candidate
        raise BuildError(f"{valid.target} build of {valid.name} failed: {type(err).__name__}: {err}") from err


def prebuild(valid: ValidSpec) -> str:
    """Fill the build cache for `valid` with no GPU and return the cached file (`l2c build`, the tuner's compile
    pool); BuildError on any failure. Each target says what that takes (`Target.prebuild`)."""
    try:
        return targets.get(valid.target).prebuild(valid)
    except BuildError:
        raise
    except Exception as err:  # noqa: BLE001
        raise BuildError(f"{valid.target} build of {valid.name} failed: {type(err).__name__}: {err}") from err


def prebuild_many(valids: Sequence[ValidSpec], workers: int,
                  done: Optional[Callable[[int, Union[str, BuildError], int], None]] = None
                  ) -> List[Union[str, BuildError]]:
    """`prebuild` for many specs, `workers` compilers at a time, each target batching as its compiler allows
    (CUTLASS: several kernels per nvcc run): the cached file or the BuildError per spec, in order, never raising.
    `done(index, outcome, kernels)` is called as each outcome is known (from worker threads); `kernels` is how
    many specs the compiler run that built it compiled (0: none, it was cached)."""
    results: List[Union[str, BuildError, None]] = [None] * len(valids)
    by_target: Dict[str, List[int]] = {}
    for i, valid in enumerate(valids):
        by_target.setdefault(valid.target, []).append(i)
    for name, indices in by_target.items():
        def report(j, outcome, kernels, indices=indices):
            if done:
                done(indices[j], outcome, kernels)
        try:
            outcomes = targets.get(name).prebuild_many([valids[i] for i in indices], workers, report)
        except Exception as err:  # noqa: BLE001
            outcomes = [BuildError(f"{name} build failed: {type(err).__name__}: {err}")] * len(indices)
        for i, outcome in zip(indices, outcomes):
            results[i] = outcome
    return results  # type: ignore[return-value]


def build_id(valid: ValidSpec) -> str:
    """What identifies the kernel a measurement timed: a hash of the target, the rendered source and the target's
    toolchain (compiler versions and flags). Every setting that changes generated code is a knob, so it is in the
    source; a template, flag or compiler change gives another id, which retires the figures of the old build."""
    from .lower import render
    target = targets.get(valid.target)
    return cache.content_hash(valid.target, render(valid), target.toolchain_id())[:24]


@functools.lru_cache(maxsize=None)
def build_id_of(spec_text: str, target: str, arch: str) -> str:
    """`build_id` of a spec text as the current templates and toolchain build it ("" when it does not validate
    for `target` or does not parse: such a spec has no build, now or ever)."""
    from .parser import parse_one
    from .validate import validate
    try:
        return build_id(validate(parse_one(spec_text, file="<store>"), target, arch))
    except (L2Error, ValueError):
        return ""
