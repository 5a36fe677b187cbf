"""The IR: `KernelSpec`, a typed, immutable record with one field per knob, and its canonical printer.

`KernelSpec` is generated from the knob table so that a new knob is one row in `l2c.knobs`. Equality
and hashing cover the kernel name and the knobs, never where the spec came from (`origin`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from .knobs import ANY, AUTO, KNOBS, KNOBS_BY_FIELD, SECTIONS, Knob, knobs_in


@dataclass(frozen=True)
class Origin:
    """Where a spec was written: file name and the (line, col) of each knob that was spelled out."""
    file: str = "<spec>"
    line: int = 1
    col: int = 1
    positions: Tuple[Tuple[str, int, int], ...] = ()

    def position_of(self, knob_field: str) -> Tuple[int, int]:
        for f, line, col in self.positions:
            if f == knob_field:
                return line, col
        return self.line, self.col


_KNOB_FIELDS = [(k.field, object, field(default=k.default)) for k in KNOBS]

_SpecBase = dataclasses.make_dataclass(
    "_SpecBase",
    [("name", str, field(default="kernel"))] + _KNOB_FIELDS
    + [("origin", Origin, field(default=Origin(), compare=False, hash=False, repr=False))],
    frozen=True,
)


class KernelSpec(_SpecBase):
    """One GEMM kernel: D = act(alpha * op(A) @ op(B) + beta * C + bias), every knob explicit."""

    __slots__ = ()

    def replace(self, **changes) -> "KernelSpec":
        return dataclasses.replace(self, **changes)

    @property
    def parallel_split_k(self) -> bool:
        """Whether (on the CUTLASS target) the K slices run as a batched GEMM of fp32 partial sums plus a reduction
        kernel that applies the epilogue (split_k mode=parallel)."""
        return self.split_k_mode == "parallel" and self.split_k_slices > 1

    def with_epilogue(self, bias: str, activation: str) -> "KernelSpec":
        """This kernel with a call's bias and activation fused. A bias or activation in the GEMM's own epilogue
        needs an epilogue with shared memory (rule direct-store; under parallel split-K the reduction kernel applies
        them instead), so there a `store=direct` kernel stores through TMA instead of being a kernel that cannot be
        built: the same main loop and tiles, with as many stages as fit beside that epilogue (a count pinned for the
        direct store may not)."""
        if self.epilogue_store == "direct" and (bias != "none" or activation != "none") and not self.parallel_split_k:
            return self.replace(epilogue_bias=bias, epilogue_activation=activation, epilogue_store="tma",
                                pipeline_stages=AUTO)
        return self.replace(epilogue_bias=bias, epilogue_activation=activation)

    def knob_values(self) -> Dict[str, object]:
        return {k.field: getattr(self, k.field) for k in KNOBS}

    @property
    def fixed_shape(self) -> Optional[Tuple[int, int, int]]:
        dims = (self.problem_m, self.problem_n, self.problem_k)
        return None if ANY in dims else dims  # type: ignore[return-value]

    @property
    def shape_generic(self) -> bool:
        """Generic in M, N and K: one build serves every problem size (what a token range or a cell serves)."""
        return self.problem_m == self.problem_n == self.problem_k == ANY

    def to_l2(self) -> str:
        return print_spec(self)


def _spell(knob: Knob, value: object) -> str:
    if knob.kind == "float":
        return repr(float(value))
    return str(value)


def print_spec(spec: KernelSpec) -> str:
    """Canonical `.l2` text: every section in table order, every knob spelled out (except a knob added later,
    `spelled_at_default=False`, at its default: the texts stored before it existed stay canonical).

    parse(print_spec(s)) == s for every spec the builder accepts, and printing is idempotent.
    """
    lines = [f"kernel {spec.name} {{"]
    width = max(len(s) for s in SECTIONS)
    for section in SECTIONS:
        knobs = [k for k in knobs_in(section) if k.spelled_at_default or getattr(spec, k.field) != k.default]
        if len(knobs) == 1 and not knobs[0].name:
            value = _spell(knobs[0], getattr(spec, knobs[0].field))
        else:
            value = " ".join(f"{k.name}={_spell(k, getattr(spec, k.field))}" for k in knobs)
        lines.append(f"  {section.ljust(width)} {value}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def config_name(spec: KernelSpec) -> str:
    """A name derived from the knobs alone, e.g. `cutlass_128x256x64_3f9c2a1b`.

    Generated specs (the tuner's, the tuned table's) are named this way so that the same configuration
    always has the same text, hence the same build-cache key: one build serves every shape that uses it.
    """
    import hashlib
    digest = hashlib.sha256(print_spec(spec.replace(name="_")).encode()).hexdigest()[:8]
    return f"{spec.target}_{spec.tile_m}x{spec.tile_n}x{spec.tile_k}_{digest}"


def print_specs(specs) -> str:
    return "\n".join(print_spec(s) for s in specs)


def knob(field_name: str) -> Knob:
    return KNOBS_BY_FIELD[field_name]
