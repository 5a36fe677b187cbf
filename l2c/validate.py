"""Validation: reject, before any compiler runs, a spec that cannot work on a target and architecture.

The common rules are here; each target's own are in `l2c/targets/<target>/rules.py`. A spec that passes becomes a
`ValidSpec` (`l2c.rules`): the spec plus the values the target resolved for `auto` knobs (stages, warps,
schedule) and the shared memory it will use. Templates only ever see a `ValidSpec`.
"""
from __future__ import annotations

from typing import Tuple

from .arch import ARCHS, Arch
from .errors import L2ValidationError
from .ir import KernelSpec, knob
from .knobs import ANY, KNOBS, TARGETS
from . import targets
from .rules import RULES, ValidSpec, declare, fail, gated

__all__ = ["RULES", "ValidSpec", "validate", "targets_for"]

# The longest file name built from a kernel name (a cache entry's temporary file: name, "_", a 24-digit hash,
# ".py", a random part and ".tmp") adds about 45 characters; 100 leaves room under 143-byte file-name limits.
MAX_NAME_LENGTH = 100
FP32_MAX = 3.4028234663852886e38
FP32_MIN_NORMAL = 1.1754943508222875e-38

COMMON_RULES = declare({
    "target": "a spec that names a target is lowered only for that target",
    "target-knob": "a spec that names a target may not set knobs that target does not read",
    "arch": "the architecture must be one l2c knows (sm_90)",
    "same-input-types": "A and B must have the same element type",
    "acc-type": "an f16 accumulator needs f16 inputs; f32 inputs need an f32 accumulator",
    "split-k-slices": "split-K slices may not exceed the number of K tiles of a fixed K",
    "shared-memory": "stages x (tile_m x tile_k + tile_k x tile_n) x element bytes (+ epilogue; Triton: also the tile it stores, fp32 under split-K) must fit the "
                     "architecture's shared memory per block (a gated kernel loads two B tiles per stage)",
    "accumulator-registers": "the fp32 accumulator tile spread over the threads must fit in registers "
                             "(<= 256 values per thread for Triton, above 256 threads 3/4 of a thread's share of the 64K registers; <= 128 per consumer thread for CUTLASS; a gated "
                             "kernel keeps two tiles)",
    "fp32-scalar": "epilogue alpha and beta are fp32 in the kernels: each must be finite in fp32 (|x| < 3.4e38) "
                   "and, unless 0, a normal fp32 number (|x| >= 1.18e-38), so that it neither overflows nor "
                   "rounds or flushes to 0",
    "gated-epilogue": "a gated epilogue computes act(alpha * A@B_gate + bias_gate) * (alpha * A@B_up + bias_up): its "
                      "bias is per column (2N values: the gate's, then the up projection's) or none, it reads no C "
                      "input (beta=0) and takes no `activation` (the gate names it)",
    "name-length": f"a kernel name has at most {MAX_NAME_LENGTH} characters: it names cache and output files, "
                   "which with the hash, suffix and temporary parts added must stay under the 255-byte file-name "
                   "limit (143 on encrypted home folders)",
    "name-module": "a kernel name is not the name of a package the generated code imports (torch, triton, l2c), "
                   "nor a Python special name such as `__init__`: `l2c compile` writes NAME.py into a folder "
                   "`triton/`, where a package's name would shadow that package and `__init__.py` would make the "
                   "folder itself shadow `triton`",
})
SHADOWED_MODULES = ("torch", "triton", "l2c")


def _common_rules(spec: KernelSpec, target: str, arch: Arch) -> None:
    if len(spec.name) > MAX_NAME_LENGTH:
        raise fail(spec, None, "name-length", f"kernel name of {len(spec.name)} characters")
    if spec.name in SHADOWED_MODULES or (spec.name.startswith("__") and spec.name.endswith("__")):
        raise fail(spec, None, "name-module", f"kernel name {spec.name!r}")
    for field in ("epilogue_alpha", "epilogue_beta"):
        value = float(getattr(spec, field))
        if not (value == 0.0 or FP32_MIN_NORMAL <= abs(value) <= FP32_MAX):
            raise fail(spec, field, "fp32-scalar", f"{field.split('_', 1)[1]}={value!r}")
    if spec.target not in ("any", target):
        raise fail(spec, "target", "target", f"the spec is for {spec.target}, not {target}")
    if spec.target == target:
        for read in KNOBS:
            if target not in read.targets and getattr(spec, read.field) != read.default:
                raise fail(spec, read.field, "target-knob",
                            f"{read.key} is read only by {', '.join(read.targets)}; this spec is for {target}")
    if gated(spec):
        for field, allowed in (("epilogue_beta", (0.0,)), ("epilogue_activation", ("none",)),
                               ("epilogue_bias", ("none", "col"))):
            if getattr(spec, field) not in allowed:
                raise fail(spec, field, "gated-epilogue",
                           f"{knob(field).key}={getattr(spec, field)} with gate={spec.epilogue_gate}")
    if spec.types_a != spec.types_b:
        raise fail(spec, "types_b", "same-input-types", f"A is {spec.types_a} but B is {spec.types_b}")
    if spec.types_acc == "f16" and spec.types_a != "f16":
        raise fail(spec, "types_acc", "acc-type", f"accumulator f16 with {spec.types_a} inputs")
    if spec.split_k_mode != "stream_k" and spec.split_k_slices > 1 and spec.problem_k != ANY:
        k_tiles = -(-spec.problem_k // spec.tile_k)
        if spec.split_k_slices > k_tiles:
            raise fail(spec, "split_k_slices", "split-k-slices",
                        f"{spec.split_k_slices} slices but K={spec.problem_k} has only {k_tiles} tiles of "
                        f"{spec.tile_k}")


def validate(spec: KernelSpec, target: str, arch: str = "sm_90") -> ValidSpec:
    """Check `spec` for `target` on `arch`; return the resolved ValidSpec or raise L2ValidationError."""
    if target not in TARGETS:
        raise L2ValidationError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}",
                                file=spec.origin.file, line=spec.origin.line, col=spec.origin.col)
    if arch not in ARCHS:
        raise fail(spec, None, "arch", f"unknown architecture {arch!r}")
    arch_info = ARCHS[arch]
    _common_rules(spec, target, arch_info)
    return targets.get(target).check(spec, arch_info)


def targets_for(spec: KernelSpec, requested: str = "all") -> Tuple[str, ...]:
    """The targets to lower a spec for: those its `target` knob allows (every target for `any`), narrowed to
    `requested` unless that is "all". Empty when the spec names a target other than the requested one."""
    allowed = TARGETS if spec.target == "any" else (spec.target,)
    return allowed if requested == "all" else tuple(t for t in allowed if t == requested)


for _name in TARGETS:   # importing each target declares its rules: RULES is complete once this module is imported
    targets.get(_name)
