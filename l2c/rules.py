"""What every target's validation shares: the named rules, the rejection that cites one, the accepted spec
(`ValidSpec`) and the operand facts several targets' rules read.

Each rule has a name and a one-line statement, shown with the rejection and listed by `l2c check --rules`;
`l2c.validate` declares the common rules and each target's `rules.py` its own. A rejection is an
`L2ValidationError` naming file:line:col of the offending knob, the knob and the rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .arch import Arch
from .errors import L2ValidationError
from .ir import KernelSpec
from .knobs import DTYPE_BYTES, KNOBS

RULES: Dict[str, str] = {}   # every declared rule: name -> statement


def declare(rules: Dict[str, str]) -> Dict[str, str]:
    """Add a module's rules to RULES (names are unique across modules) and return them."""
    clash = set(rules) & set(RULES)
    if clash:
        raise ValueError(f"rules declared twice: {sorted(clash)}")
    RULES.update(rules)
    return rules


@dataclass(frozen=True)
class ValidSpec:
    """A spec accepted for one target and architecture, with every `auto` knob resolved."""
    spec: KernelSpec
    target: str
    arch: Arch
    stages: int
    warps: int                 # Triton warps per program (CUTLASS: threads / 32 of the kernel)
    schedule: str              # CUTLASS schedule; "none" for Triton
    smem_bytes: int            # estimated shared memory per block
    stages_pinned: bool = False   # CUTLASS: stages=auto resolved to a count the template must name (not CUTLASS's own)

    @property
    def name(self) -> str:
        return self.spec.name


def fail(spec: KernelSpec, knob_field: Optional[str], rule: str, message: str) -> L2ValidationError:
    line, col = spec.origin.position_of(knob_field) if knob_field else (spec.origin.line, spec.origin.col)
    knob_key = next((k.key for k in KNOBS if k.field == knob_field), None)
    return L2ValidationError(f"{message} — {RULES[rule]}", file=spec.origin.file, line=line, col=col,
                             knob=knob_key, rule=rule)


def gated(spec: KernelSpec) -> bool:
    """Whether the spec's epilogue is gated (`epilogue gate`): B holds the gate's and the up projection's columns."""
    return spec.epilogue_gate != "none"


def output_n_step(valid: ValidSpec) -> int:
    """What N (D's columns) must be a multiple of for a kernel built as `valid`: tile n for the CUTLASS target's gated
    GEMM (rule gated-gemm: each tile holds tile n columns of each half of B), else 1."""
    spec = valid.spec
    return spec.tile_n if valid.target == "cutlass" and gated(spec) and spec.launch_family == "gemm" else 1


def mainloop_stage_bytes(spec: KernelSpec) -> int:
    ab = DTYPE_BYTES[spec.types_a]
    b_tiles = 2 if gated(spec) else 1   # a gated kernel loads the gate's and the up projection's tile of B
    return (spec.tile_m * spec.tile_k + b_tiles * spec.tile_k * spec.tile_n) * ab


def alignment_checks(spec: KernelSpec) -> List[Tuple[str, str, object, int]]:
    """(knob field, operand, contiguous extent, element bytes) for each operand TMA reads or writes."""
    ab, cb = DTYPE_BYTES[spec.types_a], DTYPE_BYTES[spec.types_c]
    m, n, k = spec.problem_m, spec.problem_n, spec.problem_k
    return [
        ("problem_k" if spec.layout_a == "row" else "problem_m", "A", k if spec.layout_a == "row" else m, ab),
        ("problem_n" if spec.layout_b == "row" else "problem_k", "B", n if spec.layout_b == "row" else k, ab),
        ("problem_n" if spec.layout_c == "row" else "problem_m", "D", n if spec.layout_c == "row" else m, cb),
    ]
