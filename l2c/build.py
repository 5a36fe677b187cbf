"""Build: a ValidSpec -> a Kernel object callable on torch tensors, through the target it was validated for.

Any failure to generate, write, import or compile a kernel is raised as `l2c.errors.BuildError` carrying the
underlying message, so a tuner records a failed candidate instead of crashing.
"""
from __future__ import annotations

from . import targets
from .errors import BuildError
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
