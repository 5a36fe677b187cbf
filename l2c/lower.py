"""Lowering: a ValidSpec -> source text, through the Jinja2 templates of its target.

The templates see only the validated, resolved spec (`v`), the raw knobs (`s`) and a few spelled-out
names; they never see parse trees or user text other than the canonical spec printed in the header.
"""
from __future__ import annotations

import functools

import jinja2

from . import targets
from .knobs import DTYPE_BYTES
from .rules import ValidSpec


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("l2c._templates", ""),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(valid: ValidSpec) -> str:
    """Source text of the kernel module (Triton .py or CUTLASS .cu) for one validated spec."""
    target = targets.get(valid.target)
    template = environment().get_template(target.template(valid.spec))
    return template.render(v=valid, s=valid.spec, spec_text=valid.spec.to_l2(), dtype_bytes=DTYPE_BYTES,
                           **target.context(valid))


def file_name(valid: ValidSpec) -> str:
    return valid.spec.name + targets.get(valid.target).suffix
