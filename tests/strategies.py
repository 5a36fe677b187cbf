"""Hypothesis strategies for kernel specs, drawn from the knob table (never a hand-kept list)."""
from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from l2c.errors import L2ValidationError
from l2c.ir import KernelSpec, knob as knob_named
from l2c.knobs import ANY, AUTO, KNOBS, Knob
from l2c.validate import validate

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True).filter(
    lambda s: s not in ("kernel",))


def knob_values(knob: Knob) -> st.SearchStrategy:
    if knob.kind == "enum":
        return st.sampled_from(knob.choices)
    if knob.kind == "int":
        if knob.choices:
            return st.sampled_from(knob.choices)
        return st.integers(knob.lo, knob.hi)
    if knob.kind == "auto_int":
        return st.sampled_from((AUTO,) + tuple(knob.choices))
    if knob.kind == "dim":
        return st.one_of(st.just(ANY), st.integers(1, 1 << 16))
    if knob.kind == "float":   # zero or normal in fp32 (rule fp32-scalar); fp32_scalars below draws the others
        return st.one_of(st.just(0.0), st.floats(1.2e-38, 1e6), st.floats(-1e6, -1.2e-38))
    raise AssertionError(knob.kind)


@st.composite
def specs(draw, **fixed) -> KernelSpec:
    """Any spec the builder accepts (it need not validate for a target). `fixed` pins knobs."""
    values = {k.field: fixed[k.field] if k.field in fixed else draw(knob_values(k)) for k in KNOBS}
    return KernelSpec(name=fixed.get("name") or draw(NAMES), **values)


def _validates(spec: KernelSpec, target: str, arch: str) -> bool:
    try:
        validate(spec, target, arch)
        return True
    except L2ValidationError:
        return False


@st.composite
def valid_specs(draw, target: str, arch: str = "sm_90", **fixed) -> KernelSpec:
    """Specs that pass validation for `target`. Cross-knob equalities (B's type is A's, the target is
    `any` or this one) are drawn directly; the remaining rules are rejection-sampled."""
    pins = dict(fixed)
    pins.setdefault("target", draw(st.sampled_from(("any", target))))
    # gated epilogues validate only with a narrow epilogue (tests/test_gated.py draws them): drawn here they would
    # mostly be rejected and starve every other test's draws
    pins.setdefault("epilogue_gate", "none")
    if "types_a" not in pins:
        pins["types_a"] = draw(st.sampled_from(("f16", "bf16") if target == "cutlass" else ("f16", "bf16", "f32")))
    pins.setdefault("types_b", pins["types_a"])
    pins.setdefault("types_acc", "f32")
    align = 8 if target == "cutlass" else 1   # CUTLASS needs 16-byte (8 x 16-bit) contiguous extents
    for dim in ("problem_m", "problem_n", "problem_k"):
        if dim not in pins:
            pins[dim] = draw(st.one_of(st.just(ANY), st.integers(1, 4096 // align).map(lambda x: x * align)))
    pins.setdefault("split_k_slices", draw(st.sampled_from((1, 1, 2, 3, 4))))
    if pins["split_k_slices"] == 1:   # rule split-k-reduce: the reduction is a choice of split-K only
        pins.setdefault("split_k_reduce", "inkernel")
    if target == "cutlass":
        # CUTLASS's tile M (the spec's tile N under launch swap=yes) is 64, 128 or 256
        if pins["target"] == target:
            pins.setdefault("launch_swap", draw(st.sampled_from(("no", "yes"))))
        wgmma_m = "tile_n" if pins.get("launch_swap") == "yes" else "tile_m"
        pins.setdefault(wgmma_m, draw(st.sampled_from((64, 128, 256))))
        pins.setdefault("tile_k", draw(st.sampled_from((32, 64, 128))))
        pins.setdefault("types_c", draw(st.sampled_from(("f16", "bf16", "f32"))))
        if pins.setdefault("epilogue_store", draw(st.sampled_from(("tma", "direct", "staged")))) == "direct":
            pins.setdefault("epilogue_bias", "none")   # rule direct-store, drawn apart so as not to starve the draws
            pins.setdefault("epilogue_activation", "none")
    else:   # Triton tiles are powers of two (rule triton-tile-pow2); the tile choices include CUTLASS's others
        for dim in ("tile_m", "tile_n"):
            pins.setdefault(dim, draw(st.sampled_from(tuple(n for n in knob_named(dim).choices
                                                            if n >= 16 and n & (n - 1) == 0))))
    if pins["target"] == target:  # a spec that names its target may not set the other target's knobs
        for knob in KNOBS:
            if target not in knob.targets:
                pins.setdefault(knob.field, knob.default)
    spec = draw(specs(**pins))
    from hypothesis import assume
    assume(_validates(spec, target, arch))
    return spec


def with_reduce(spec: KernelSpec, reduce: str) -> KernelSpec:
    """`spec` with its split-K slices summed by `reduce` (knob split_k reduce) where it is a workspace-mode
    Triton split-K spec, for which the choice exists; other specs unchanged."""
    if spec.split_k_slices > 1 and spec.split_k_mode == "workspace" and spec.target in ("any", "triton"):
        return dataclasses.replace(spec, split_k_reduce=reduce)
    return spec


# Hostile inputs: values the grammar accepts that the kernels cannot hold.
FP32_MAX = 3.4028234663852886e38
FP32_MIN_NORMAL = 1.1754943508222875e-38

# Whole numbers as the DSL spells them: around 2^31, and digit strings past Python's 4300-digit int() limit.
huge_integer_texts = st.one_of(
    st.integers(2 ** 31 - 3, 2 ** 31 + 3).map(str),
    st.integers(0, 10 ** 30).map(str),
    st.integers(4290, 4400).map(lambda n: "9" * n),
    st.integers(1, 40).map(lambda n: "0" * n + "7"),
)

# Epilogue scalars beyond fp32, or so small they round (or flush) to zero in fp32, beside ordinary ones.
fp32_scalars = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([FP32_MAX, 3.5e38, 1e300, FP32_MIN_NORMAL, 1e-38, 1e-45, 1e-46, 5e-324, 0.0, -0.0]),
)


def fits_fp32(x: float) -> bool:
    """What rule fp32-scalar accepts."""
    return x == 0.0 or FP32_MIN_NORMAL <= abs(x) <= FP32_MAX
