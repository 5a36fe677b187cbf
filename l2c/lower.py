"""Lowering: a ValidSpec -> source text, through the Jinja2 templates of its target.

The templates see only the validated, resolved spec (`v`), the raw knobs (`s`) and a few spelled-out
names; they never see parse trees or user text other than the canonical spec printed in the header.
"""
from __future__ import annotations

import functools

import jinja2

from .knobs import DTYPE_BYTES
from .validate import ValidSpec, cutlass_gemm_spec

# One template per (target, kernel family); the family is the Triton knob `launch family` (CUTLASS has one).
TEMPLATES = {("triton", "gemm"): "triton/gemm.py.j2", ("triton", "gemv"): "triton/gemv.py.j2",
             ("cutlass", "gemm"): "cutlass/gemm.cu.j2"}
SUFFIX_FOR_TARGET = {"triton": ".py", "cutlass": ".cu"}


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
    template = environment().get_template(TEMPLATES[valid.target, valid.spec.launch_family])
    # CUTLASS also reads the GEMM it instantiates (transposed under launch swap=yes)
    extra = {} if valid.target == "triton" else {"gemm": cutlass_gemm_spec(valid.spec)}
    return template.render(v=valid, s=valid.spec, spec_text=valid.spec.to_l2(), dtype_bytes=DTYPE_BYTES, **extra)


def file_name(valid: ValidSpec) -> str:
    return valid.spec.name + SUFFIX_FOR_TARGET[valid.target]
