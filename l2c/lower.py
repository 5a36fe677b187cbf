"""Lowering: a ValidSpec -> source text, through the Jinja2 templates of its target.

The templates see only the validated, resolved spec (`v`), the raw knobs (`s`) and a few spelled-out
names; they never see parse trees or user text other than the canonical spec printed in the header.
"""
from __future__ import annotations

import functools
import os

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
    if valid.target == "triton":
        extra = {"splitk_reduce": triton_splitk_reduce()}
    else:   # the GEMM CUTLASS instantiates (transposed under launch swap=yes)
        extra = {"gemm": cutlass_gemm_spec(valid.spec)}
    return template.render(v=valid, s=valid.spec, spec_text=valid.spec.to_l2(), dtype_bytes=DTYPE_BYTES, **extra)


SPLITK_REDUCE_DEFAULT = "inkernel"


def triton_splitk_reduce() -> str:
    """How a Triton workspace-mode split-K kernel reduces its slices: `inkernel` (the default: the last slice of
    each tile to finish reduces it in the GEMM kernel, one launch; verified on the H200 and cheaper than a
    second launch, benchmarks/NOTES.md) or `finalize` (a second kernel; L2C_TRITON_SPLITK=finalize). Atomic mode
    always uses the finalize kernel. The generated source differs, so each has its own build-cache entry;
    `l2c tune` refuses the non-default one, because the results store keys results by spec text."""
    value = os.environ.get("L2C_TRITON_SPLITK", SPLITK_REDUCE_DEFAULT)
    if value not in ("finalize", "inkernel"):
        raise ValueError(f"L2C_TRITON_SPLITK={value!r}: expected finalize or inkernel")
    return value


def file_name(valid: ValidSpec) -> str:
    return valid.spec.name + SUFFIX_FOR_TARGET[valid.target]
