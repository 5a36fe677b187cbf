"""The gemv family (`launch family=gemv`): random valid specs and shapes verified against the float64 reference
under the interpreter, its validation rules, and Triton's sm_90 compiler on representative tiles.

Unlike tl.dot, the gemv kernel's multiply-adds run right in the interpreter for bf16 too, so bf16 is tested here.
Shapes are small and examples few: the interpreter is slow.
"""
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from l2c.build import build
from l2c.errors import L2ValidationError
from l2c.ir import KernelSpec
from l2c.knobs import ANY
from l2c.lower import render
from l2c.validate import validate
from l2c.verify import make_inputs, verify

from .strategies import valid_specs, with_reduce


@pytest.fixture(scope="module", autouse=True)
def _cache_in_tmp(cache_in_tmp):
    """Every kernel of this module is built into a cache of its own."""


def gemv(**knobs) -> KernelSpec:
    base = dict(name="g", launch_family="gemv", tile_m=1, tile_n=16, tile_k=32, layout_b="col")
    base.update(knobs)
    return KernelSpec(**base)


@st.composite
def cases(draw):
    """(spec, m, n, k): a valid gemv spec with small tiles and a shape it accepts (N and K off the tiles)."""
    m, n, k = draw(st.integers(1, 40)), draw(st.integers(1, 70)), draw(st.integers(1, 90))
    types = draw(st.sampled_from(("f16", "bf16", "f32")))
    tile_k = draw(st.sampled_from((16, 32, 64)))
    fixed_k = draw(st.booleans())
    slices = draw(st.sampled_from((1, 1, 2, 3)))
    if fixed_k:
        slices = min(slices, -(-k // tile_k))
    spec = draw(valid_specs(
        "triton", launch_family="gemv", types_a=types, types_c=draw(st.sampled_from((types, "f32"))),
        problem_m=draw(st.sampled_from((ANY, m))), problem_n=draw(st.sampled_from((ANY, n))),
        problem_k=k if fixed_k else ANY, problem_batch=1, launch_persistent="no", launch_loads="pointer",
        tile_m=draw(st.sampled_from((1, 2, 4, 8, 16))), tile_n=draw(st.sampled_from((8, 16, 32))), tile_k=tile_k,
        split_k_slices=slices, layout_a=draw(st.sampled_from(("row", "col"))),
        layout_b=draw(st.sampled_from(("row", "col"))), layout_c=draw(st.sampled_from(("row", "col"))),
        epilogue_alpha=draw(st.sampled_from((1.0, 0.5, -2.0))),
        epilogue_beta=draw(st.sampled_from((0.0, 0.0, 1.0, -0.75))),
        epilogue_bias=draw(st.sampled_from(("none", "row", "col"))),
        epilogue_activation=draw(st.sampled_from(("none", "relu", "gelu", "silu")))))
    return spec, m, n, k


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cases(), st.integers(0, 2 ** 31), st.sampled_from(["inkernel", "finalize"]))
def test_random_gemv_specs_match_reference(case, seed, reduce):
    spec, m, n, k = case
    kernel = build(validate(with_reduce(spec, reduce), "triton"))
    assert "tl.dot" not in kernel.source
    result = verify(kernel, m, n, k, device="cpu", seed=seed)
    assert result.ok, (result, spec.to_l2())


def test_split_k_is_deterministic():
    """Workspace split-K sums the slices in slice order: the same call gives the same bits."""
    kernel = build(validate(gemv(tile_m=2, split_k_slices=4, epilogue_bias="col"), "triton"))
    g = torch.Generator().manual_seed(1)
    a, b, bias = torch.randn(3, 200, generator=g).half(), torch.randn(50, 200, generator=g).half().T, \
        torch.randn(50, generator=g).half()
    first = kernel(a, b, bias=bias)
    assert torch.equal(first, kernel(a, b, bias=bias))
    assert verify(kernel, 3, 50, 200, device="cpu", seed=2).ok


def test_verify_catches_a_dropped_k_tail():
    """The tests can fail: a kernel that skips the partial last K tile is caught."""
    from l2c.targets.triton.build import TritonKernel, load_module
    kernel = build(validate(gemv(name="tail"), "triton"))
    old = "    if k_full * BLOCK_K < K:"
    assert old in kernel.source
    source = kernel.source.replace(old, "    if False:")
    module, path = load_module(source, "tail_broken")
    broken = TritonKernel(kernel.valid, source, module, path)
    assert verify(kernel, 3, 20, 40, device="cpu", seed=0).ok
    result = verify(broken, 3, 20, 40, device="cpu", seed=0)
    assert not result.ok and "exceeds tolerance" in result.reason


def test_prepare_keeps_the_gemm_interface():
    """`prepare` hands launches exactly as the gemm module does (l2c.targets.triton.build replays them): the kernel's
    leading parameters by position, its constexprs and launch options by name, the call's own tensors as themselves."""
    spec = gemv(tile_m=4, split_k_slices=2, split_k_mode="atomic", epilogue_beta=0.5)
    kernel = build(validate(spec, "triton"))
    a, b, c, bias, _ = make_inputs(spec, 5, 33, 70, 1, "cpu", torch.Generator().manual_seed(0))
    out, zero, launches = kernel.module.prepare(a, b, c, bias)
    assert zero is not None and len(launches) == 2   # atomic partials, then the finalize kernel
    for jit, grid, args, meta in launches:
        assert sorted(jit.arg_names[len(args):]) == sorted(x for x in meta if x not in ("num_warps", "num_stages"))
    assert launches[0][2][0] is a and launches[0][2][1] is b and any(x is out for x in launches[-1][2])


@pytest.mark.parametrize("knobs, rule", [
    (dict(tile_m=32), "gemv-tile-m"),
    (dict(tile_n=48), "gemv-tile-pow2"),
    (dict(tile_m=16, tile_n=32, tile_k=64, launch_warps=2), "gemv-registers"),
    (dict(tile_m=4, tile_n=64, tile_k=256), "gemv-registers"),
    (dict(launch_loads="tma"), "gemv-loads"),
    (dict(problem_batch=2), "gemv-batch"),
    (dict(launch_persistent="yes"), "gemv-persistent"),
    (dict(types_acc="f16"), "gemv-acc"),
    (dict(split_k_mode="stream_k"), "stream-k-target"),
])
def test_gemv_rules(knobs, rule):
    with pytest.raises(L2ValidationError) as err:
        validate(gemv(**knobs), "triton")
    assert err.value.rule == rule


def test_gemv_on_cutlass_has_its_own_rules_and_evict_hints_pointer_loads_only():
    with pytest.raises(L2ValidationError) as err:   # the CUTLASS target's gemv family (tests/test_cutlass_gemv.py)
        validate(gemv(tile_m=64, tile_n=64, tile_k=64), "cutlass")
    assert err.value.rule == "gemv-cuda-tile-m"
    with pytest.raises(L2ValidationError) as err:
        validate(KernelSpec(launch_loads="tma", launch_evict="first"), "triton")
    assert err.value.rule == "evict-loads"
    with pytest.raises(L2ValidationError) as err:   # the gemm family keeps its tile rule
        validate(KernelSpec(tile_m=4), "triton")
    assert err.value.rule == "triton-tile-pow2"


@pytest.mark.parametrize("family", ["gemm", "gemv"])
def test_evict_first_hints_b_evict_first_and_a_evict_last(family):
    """`launch evict=first` puts the hints on every load of A and B and is spelled in the spec; the default puts
    none and is not spelled (the stored spec texts stay canonical)."""
    base = gemv() if family == "gemv" else KernelSpec(name="g", tile_m=16, tile_n=16, tile_k=16)
    plain, hinted = render(validate(base, "triton")), render(validate(base.replace(launch_evict="first"), "triton"))
    assert "eviction_policy" not in plain and "evict=" not in base.to_l2()
    for operand, hint in (("a", "evict_last"), ("b", "evict_first")):
        loads = [line for line in hinted.splitlines() if f"tl.load({operand}_ptrs" in line]
        assert loads and all(f'eviction_policy="{hint}"' in line for line in loads), loads
    assert "evict=first" in base.replace(launch_evict="first").to_l2()
    kernel = build(validate(base.replace(name=f"hinted_{family}", launch_evict="first"), "triton"))
    assert verify(kernel, 5, 24, 40, device="cpu", seed=0).ok


def test_family_is_spelled_only_when_gemv():
    assert "family=" not in KernelSpec().to_l2()
    assert "family=gemv" in gemv().to_l2()


# Representative configurations for the register report: (tile m, tile n, tile k, warps)
COMPILE_CONFIGS = [(1, 32, 256, 4), (1, 64, 256, 4), (1, 16, 512, 4), (1, 128, 128, 4), (4, 16, 256, 4),
                   (4, 32, 128, 4), (4, 32, 256, 8), (16, 16, 64, 4), (16, 16, 128, 8)]


def test_representative_gemv_kernels_compile_for_sm90_without_spilling(tmp_path):
    """Triton's sm_90 compiler (run on this CPU, no interpreter) builds the gemv kernel as a call of nn.Linear's
    layout specializes it (unit K stride of B, 16-divisible strides), with 16-byte loads of B and no spills: what
    the gemv-registers rule promises. Prints the register report (`pytest -s`)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["L2C_CACHE_DIR"] = str(tmp_path)
    configs = ";".join(",".join(map(str, c)) for c in COMPILE_CONFIGS)
    done = subprocess.run([sys.executable, "-m", "tests.gemv_registers", configs], capture_output=True, text=True,
                          env=env, timeout=900, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("gemv")]
    assert len(rows) == len(COMPILE_CONFIGS)
    for name, regs, spill, wide_loads in rows:
        assert int(spill) == 0, name
        assert int(regs) <= 255 and int(wide_loads) > 0, name
