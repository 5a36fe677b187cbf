"""Gated epilogues (`epilogue gate`: act(A@B_gate) * (A@B_up) over one B of K x 2N): validation, the Triton kernels of
both families against l2c.verify's reference on the interpreter, and the residual and gated entry points of the
dispatcher (`l2c.matmul(residual=)`, `l2c.gated_matmul`)."""
import dataclasses
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import l2c
from l2c.build import build
from l2c.dispatch import default_dispatcher, set_tuned_table
from l2c.errors import L2ValidationError
from l2c.ir import KernelSpec
from l2c.knobs import ANY
from l2c.parser import parse_one
from l2c.tuned_table import TunedEntry, TunedTable, entry_from_row, served_spec
from l2c.validate import validate
from l2c.rules import output_n_step
from l2c.verify import edge_shape, verify

from .strategies import valid_specs


@pytest.fixture(scope="module", autouse=True)
def _cache_in_tmp(cache_in_tmp):
    """Every kernel of this module is built into a cache of its own."""


def gated(**knobs) -> KernelSpec:
    base = dict(name="gated", target="triton", tile_m=16, tile_n=16, tile_k=16, layout_b="col", swizzle_group=1,
                launch_warps=4, epilogue_gate="silu")
    base.update(knobs)
    return KernelSpec(**base)


def act(gate, g):
    return F.silu(g) if gate == "silu" else F.gelu(g, approximate="tanh")


def reference(a, b, gate, bias=None):
    """act(gate half) * up half, in float64."""
    y = a.double() @ b.double() + (0 if bias is None else bias.double())
    n = b.shape[-1] // 2
    return act(gate, y[..., :n]) * y[..., n:]


# ---------------------------------------------------------------------------------------------- the knob, the rules

def test_the_knob_is_spelled_only_when_set():
    plain = KernelSpec(name="p")
    assert "gate" not in plain.to_l2()
    spec = gated(epilogue_gate="gelu_tanh")
    assert "gate=gelu_tanh" in spec.to_l2()
    assert parse_one(spec.to_l2()) == spec


@pytest.mark.parametrize("knobs, rule", [
    (dict(epilogue_beta=1.0), "gated-epilogue"),
    (dict(epilogue_activation="relu"), "gated-epilogue"),
    (dict(epilogue_bias="row"), "gated-epilogue"),
    (dict(split_k_slices=2), "gated-split-k"),
    (dict(launch_family="gemv", tile_m=2, split_k_slices=2), "gated-split-k"),
    (dict(tile_m=128, tile_n=256, launch_warps=4), "accumulator-registers"),   # two 128x256 tiles over 4 warps
    (dict(launch_family="gemv", tile_m=16, tile_n=16, tile_k=64, launch_warps=4), "gemv-registers"),
    (dict(tile_m=128, tile_n=256, tile_k=128, pipeline_stages=2, launch_warps=8), "shared-memory"),
])
def test_gated_rules(knobs, rule):
    with pytest.raises(L2ValidationError) as err:
        validate(gated(**knobs), "triton")
    assert err.value.rule == rule
    # each limit that counts two accumulators or two B tiles holds for the same spec without the gate
    if rule in ("accumulator-registers", "gemv-registers", "shared-memory"):
        validate(gated(**knobs, epilogue_gate="none"), "triton")


def test_cutlass_lowers_a_gated_gemm_and_a_gated_cuda_core_gemv():
    """The CUTLASS target's gated GEMM reads tile n of the gate's and of the up projection's columns into one tile
    twice tile n wide (rules.cutlass_gemm_spec), and its shared memory is that GEMM's, whose staged epilogue writes
    the half-wide product; a gated gemv runs on CUDA cores."""
    from l2c.lower import render
    from l2c.rules import mainloop_stage_bytes
    from l2c.targets.cutlass.rules import cutlass_gemm_spec
    spec = gated(target="cutlass", tile_m=128, tile_n=128, tile_k=64, launch_warps="auto",
                 launch_schedule="cooperative", epilogue_store="staged")
    valid = validate(spec, "cutlass")
    gemm = cutlass_gemm_spec(spec)
    assert (gemm.tile_n, gemm.epilogue_gate) == (256, "none")
    assert mainloop_stage_bytes(gemm) == mainloop_stage_bytes(spec)   # two B tiles of tile n = one of 2 x tile n
    assert valid.stages == validate(gemm.replace(name="plain"), "cutlass").stages
    source = render(valid)
    assert "GatedMainloop<BuiltMainloop, 128>" in source
    assert "cutlass::epilogue::thread::SiLu<float>>>;   // gate=silu" in source
    assert "GatedMainloop" not in render(validate(gemm.replace(name="plain"), "cutlass"))
    gemv = gated(target="cutlass", launch_family="gemv", tile_m=1, tile_n=16, tile_k=256, launch_warps=4,
                 split_k_slices=2, epilogue_bias="col")
    assert validate(gemv, "cutlass").schedule == "gemv"
    # only the gated GEMM needs N in whole tiles: its edge shape keeps N at two tiles
    triton = gated(tile_m=128, tile_n=128, tile_k=64, launch_warps=8)
    assert [output_n_step(validate(s, t)) for s, t in ((spec, "cutlass"), (gemv, "cutlass"), (triton, "triton"))] == [
        128, 1, 1]
    assert edge_shape(spec, 512, 14336, 4096, output_n_step(valid)) == (136, 256, 72)
    assert edge_shape(spec, 512, 14336, 4096) == (136, 136, 72)


@pytest.mark.parametrize("knobs, field", [
    (dict(epilogue_store="tma"), "epilogue.store"),
    (dict(tile_n=32), "tile.n"),
    (dict(tile_n=256), "tile.n"),
    (dict(launch_swap="yes"), "launch.swap"),
    (dict(layout_b="row"), "layout.b"),
    (dict(layout_c="col"), "layout.c"),
    (dict(split_k_mode="stream_k"), "split_k.mode"),
    (dict(problem_n=14336 + 64), "problem.n"),
])
def test_the_gated_gemm_rule_names_the_knob(knobs, field):
    spec = gated(target="cutlass", tile_m=128, tile_n=128, tile_k=64, launch_warps="auto", epilogue_store="staged")
    validate(spec.replace(problem_n=14336), "cutlass")
    with pytest.raises(L2ValidationError) as err:
        validate(spec.replace(**knobs), "cutlass")
    assert err.value.rule == "gated-gemm" and err.value.knob == field


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data(), gate=st.sampled_from(("silu", "gelu_tanh")), bias=st.sampled_from(("none", "col")),
       tile_n=st.sampled_from((48, 64, 96, 128)),
       schedule_m=st.sampled_from((("basic", 64), ("basic", 128), ("pingpong", 64), ("pingpong", 128),
                                   ("cooperative", 128), ("auto", 64), ("auto", 128))))
def test_random_gated_gemms_are_their_doubled_gemm_with_the_gated_epilogue(data, gate, bias, tile_n, schedule_m):
    """A valid gated CUTLASS GEMM keeps the stage count and shared memory of the plain GEMM of twice its tile n (what
    CUTLASS instantiates); its source pairs the halves in the staged epilogue and reads B through GatedMainloop."""
    n = data.draw(st.one_of(st.just(ANY), st.integers(1, 64).map(lambda x: x * tile_n)))
    spec = data.draw(valid_specs("cutlass", epilogue_gate=gate, epilogue_bias=bias, tile_n=tile_n,
                                 problem_n=n, launch_family="gemm", epilogue_store="staged", layout_b="col",
                                 layout_c="row", launch_swap="no", split_k_slices=1, split_k_mode="workspace",
                                 epilogue_beta=0.0, epilogue_activation="none", launch_schedule=schedule_m[0],
                                 tile_m=schedule_m[1]))
    from l2c.lower import render
    from l2c.targets.cutlass.rules import cutlass_gemm_spec
    valid = validate(spec, "cutlass")
    plain = validate(cutlass_gemm_spec(spec).replace(name="plain"), "cutlass")
    assert (valid.stages, valid.smem_bytes, valid.schedule) == (plain.stages, plain.smem_bytes, plain.schedule)
    source = render(valid)
    assert f"GatedMainloop<BuiltMainloop, {spec.tile_n}>" in source
    assert f"if (N % {spec.tile_n} != 0)" in source
    assert "ElementD(Activation{}(value) * up)" in source
    # verification's shape with partial tiles keeps N a whole number of tiles (the kernel declines any other N)
    step = output_n_step(valid)
    assert step == spec.tile_n
    m, n, k = data.draw(st.tuples(*(st.integers(1, 8).map(lambda x, t=t: x * t)
                                    for t in (spec.tile_m, spec.tile_n, spec.tile_k))))
    edge = edge_shape(spec, m, n if spec.problem_n == ANY else spec.problem_n, k, step)
    if edge is not None:
        assert edge[1] % step == 0 and (edge[0], edge[2]) != (m, k)


def test_rules_are_listed():
    from l2c.validate import RULES
    assert {"gated-gemm", "gated-epilogue", "gated-split-k"} <= RULES.keys()


@settings(max_examples=25, deadline=None)
@given(gate=st.sampled_from(("silu", "gelu_tanh")), alpha=st.sampled_from((0.5, 1.0, 2.0)),
       bias=st.sampled_from(("none", "col")), dtype=st.sampled_from((torch.float16, torch.bfloat16)),
       m=st.integers(1, 8), n=st.sampled_from((8, 16, 64, 256)), links=st.integers(2, 8), seed=st.integers(0, 99))
def test_a_gated_chains_weights_keep_every_links_output_at_unit_rms(gate, alpha, bias, dtype, m, n, links, seed):
    """`verify.check_chain` scales a gated chain's weights per link (`_chain_weights`) so that the reference chain
    neither underflows nor overflows whatever the gate, alpha and bias: every link's output has unit RMS in the
    weights' dtype (or the bias's own, where that is more), as the GPU check relies on. A plain chain keeps its
    weights."""
    from l2c.verify import _chain_weights, reference as verify_reference
    gen = torch.Generator().manual_seed(seed)
    spec = gated(target="cutlass", launch_family="gemv", tile_m=1, tile_n=16, tile_k=256, launch_warps=4,
                 epilogue_alpha=alpha, epilogue_bias=bias, epilogue_gate=gate)
    x0 = torch.randn(m, n, generator=gen).to(dtype)
    raw = [torch.randn(n, 2 * n, generator=gen) * n ** -0.5 for _ in range(links)]
    col_bias = torch.randn(2 * n, generator=gen).to(dtype) if bias == "col" else None
    weights = _chain_weights(spec, x0, raw, None, col_bias, dtype, dtype)
    # without a bias the output's RMS grows with the weights' scale from 0: it is set to 1; with one, the bias alone
    # (weights scaled to 0, whatever the link's input) may already give more, and the scale found is then near 0
    floor = float(verify_reference(spec, x0, torch.zeros_like(weights[0]), None, col_bias).pow(2).mean().sqrt()) \
        if bias == "col" else 0.0
    x = x0
    for i, w in enumerate(weights):
        assert w.dtype == dtype
        x = verify_reference(spec, (torch.neg(x) if i % 2 else x).to(dtype), w, None, col_bias).to(dtype)
        rms = float(x.double().pow(2).mean().sqrt())
        assert torch.isfinite(x).all() and 0.9 <= rms <= max(1.1, 1.1 * floor), (i, rms, floor)
    plain = spec.replace(epilogue_gate="none", epilogue_bias="none")
    kept = _chain_weights(plain, x0, [w[:, :n] for w in raw], None, None, dtype, dtype)
    assert all(torch.equal(k, w[:, :n].to(dtype)) for k, w in zip(kept, raw))


# ---------------------------------------------------------------------------------------------- the kernels

@st.composite
def gated_cases(draw):
    """(spec, m, n, k, batch): a valid gated Triton spec of either family with small tiles, and a shape it accepts
    (N the output's columns; B is K x 2N)."""
    family = draw(st.sampled_from(("gemm", "gemv")))
    loads = draw(st.sampled_from(("pointer", "pointer", "tma", "tma_device"))) if family == "gemm" else "pointer"
    align = 8 if loads != "pointer" else 1            # TMA reads 16-byte rows (of A^T too: M for a column-major A)
    m, n, k = (draw(st.integers(1, 48 // align)) * align for _ in range(3))
    batch = draw(st.sampled_from((1, 1, 2))) if family == "gemm" and loads == "pointer" else 1
    # bf16 tl.dot is wrong in the interpreter (verified on the GPU); the gemv family multiplies without it
    types = (("f16", "f32") if family == "gemm" else ("f16", "bf16", "f32")) if loads == "pointer" else ("f16", "f32")
    types_a = draw(st.sampled_from(types))
    pins = dict(
        launch_family=family, launch_loads=loads, types_a=types_a, types_b=types_a,
        types_c=draw(st.sampled_from((types_a, "f32"))),
        types_acc=draw(st.sampled_from(("f32", "f16"))) if types_a == "f16" and family == "gemm" else "f32",
        problem_m=draw(st.sampled_from((ANY, m))), problem_n=draw(st.sampled_from((ANY, n))),
        problem_k=draw(st.sampled_from((ANY, k))), problem_batch=draw(st.sampled_from((ANY, batch))),
        layout_a=draw(st.sampled_from(("row", "col"))), layout_b=draw(st.sampled_from(("row", "col"))),
        layout_c=draw(st.sampled_from(("row", "col"))),
        split_k_slices=1, split_k_mode="workspace", epilogue_gate=draw(st.sampled_from(("silu", "gelu_tanh"))),
        epilogue_bias=draw(st.sampled_from(("none", "col"))), epilogue_alpha=draw(st.sampled_from((1.0, 0.5, -2.0))),
        epilogue_beta=0.0, epilogue_activation="none")
    if family == "gemm":
        pins.update(tile_m=draw(st.sampled_from((16, 32))), tile_n=draw(st.sampled_from((16, 32))),
                    tile_k=draw(st.sampled_from((16, 32))), launch_persistent=draw(st.sampled_from(("no", "yes"))),
                    launch_reduce="step", launch_evict="normal" if loads != "pointer" else draw(st.sampled_from(
                        ("normal", "first"))))
    else:
        pins.update(tile_m=draw(st.sampled_from((1, 2, 4, 8, 16))), tile_n=draw(st.sampled_from((8, 16, 32))),
                    tile_k=draw(st.sampled_from((16, 32, 64))), problem_batch=1, launch_persistent="no",
                    launch_reduce=draw(st.sampled_from(("step", "end"))))
    return draw(valid_specs("triton", **pins)), m, n, k, batch


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(gated_cases(), st.integers(0, 2 ** 31))
# an f16 accumulator and one output that cancels to -1.1e-3: correct, and once failed the norm check (l2c.verify)
@example((KernelSpec(name="A", target="triton", types_acc="f16", tile_m=16, tile_n=16, tile_k=16, swizzle_group=1,
                     epilogue_bias="col", epilogue_gate="silu"), 1, 1, 42, 1), 0)
def test_random_gated_specs_match_reference(case, seed):
    """verify() runs the kernel on fresh inputs against act(gate) * up of the float64 reference, and, for a kernel
    generic in a dimension the drawn shape fills exactly, again at a shape with partial tiles."""
    spec, m, n, k, batch = case
    kernel = build(validate(spec, "triton"))
    assert ("tl.dot" in kernel.source) == (spec.launch_family == "gemm")
    result = verify(kernel, m, n, k, batch=batch, device="cpu", seed=seed)
    assert result.ok, (result, spec.to_l2())


class Wrong:
    """A kernel that computes something else than its spec says, for verify to catch."""

    def __init__(self, kernel, spec, run):
        self.valid = dataclasses.replace(kernel.valid, spec=spec)
        self.kernel, self.run = kernel, run

    def __call__(self, a, b, c=None, bias=None, out=None):
        return self.run(self.kernel, a, b, bias, out)


def _swapped_halves(kernel, a, b, bias, out):
    n = b.shape[-1] // 2
    return kernel(a, torch.cat([b[:, n:], b[:, :n]], dim=1), bias=bias, out=out)


def _one_element_off(kernel, a, b, bias, out):
    result = kernel(a, b, bias=bias, out=out)
    flat = int(result.abs().argmax())
    result.view(-1)[flat] *= 1.01      # the largest, so that the 1% is far above the bound's absolute floor
    return result


@pytest.mark.parametrize("case", ["swapped halves", "other activation", "one element off by 1%"])
@pytest.mark.parametrize("family", ["gemm", "gemv"])
def test_verify_catches_a_wrong_gated_kernel(case, family):
    knobs = dict(launch_family="gemv", tile_m=4, tile_n=16, tile_k=32) if family == "gemv" else {}
    spec = gated(**knobs, epilogue_bias="col")
    kernel = build(validate(spec, "triton"))
    assert verify(kernel, 20, 40, 50, device="cpu", seed=3).ok
    if case == "swapped halves":
        wrong = Wrong(kernel, spec, _swapped_halves)
    elif case == "other activation":
        wrong = Wrong(kernel, spec.replace(epilogue_gate="gelu_tanh"), lambda kern, *args: kern(*args[:2], bias=args[2],
                                                                                                   out=args[3]))
    else:
        wrong = Wrong(kernel, spec, _one_element_off)
    result = verify(wrong, 20, 40, 50, device="cpu", seed=3)
    assert not result.ok, result


def test_verify_inputs_of_a_gated_f16_spec_stay_in_range_at_large_k():
    """act(gate) * up multiplies two K-term sums: with Normal(0, 1) operands at K = 16384 its products reach 1e8 and
    overflow f16, which failed correct kernels as "non-finite reference" (the H200 sweep at 4096 tokens); the inputs
    scale b as a layer's weights (1/sqrt(K)), so the f16 reference is finite."""
    from l2c.verify import make_inputs, reference as verify_reference
    spec = gated(types_a="f16", types_b="f16", types_c="f16")
    a, b, c, bias, _ = make_inputs(spec, 64, 32, 16384, 1, "cpu", torch.Generator().manual_seed(0))
    assert b.shape == (16384, 64) and 0.5 < float(b.double().std()) * 16384 ** 0.5 < 2
    assert torch.isfinite(verify_reference(spec, a, b, c, bias).to(torch.float16)).all()
    unscaled = reference(a, b * 16384 ** 0.5, "silu")
    assert not torch.isfinite(unscaled.to(torch.float16)).all()   # what the inputs were before


def test_launcher_checks_the_concatenated_operands():
    kernel = build(validate(gated(epilogue_bias="col"), "triton"))
    a, w = torch.randn(8, 32, dtype=torch.float16), torch.randn(2 * 24, 32, dtype=torch.float16)
    bias = torch.randn(48, dtype=torch.float16)
    y = kernel(a, w.t(), bias=bias)
    assert y.shape == (8, 24)
    assert ((y.double() - reference(a, w.t(), "silu", bias)).norm() / reference(a, w.t(), "silu", bias).norm()) < 5e-3
    with pytest.raises(ValueError, match="b must have shape"):   # B of an odd width is no concatenation
        kernel(a, torch.randn(32, 47, dtype=torch.float16), bias=bias)
    with pytest.raises(ValueError, match="bias must have shape"):  # the bias covers both halves
        kernel(a, w.t(), bias=bias[:24])


def test_generated_gated_kernels_compile_for_the_gpu(tmp_path):
    """Triton's sm_90 compiler (no interpreter) accepts the gated kernels of both families, every load path."""
    import subprocess
    import sys
    specs = [gated(name=f"g{i}", tile_m=64, tile_n=64, tile_k=32, launch_loads=loads, layout_b=lb,
                   launch_persistent=persistent, epilogue_bias="col", epilogue_alpha=0.5, epilogue_gate=gate)
             for i, (loads, lb, persistent, gate) in enumerate(
                 [("pointer", "col", "no", "silu"), ("pointer", "row", "yes", "gelu_tanh"), ("tma", "col", "no", "silu"),
                  ("tma_device", "row", "yes", "gelu_tanh")])]
    specs += [gated(name=f"v{i}", launch_family="gemv", tile_m=tm, tile_n=8, tile_k=256, launch_reduce=reduce,
                    launch_evict="first", epilogue_gate=gate) for i, (tm, reduce, gate) in
              enumerate([(1, "end", "silu"), (4, "step", "gelu_tanh")])]
    path = tmp_path / "gated.l2"
    path.write_text("\n".join(s.to_l2() for s in specs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["L2C_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-m", "l2c", "build", str(path), "--target", "triton", "-j", "2"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{len(specs)} built, 0 failed" in done.stdout


# ---------------------------------------------------------------------------------------------- tables, dispatch

def gated_entry(m, n, k, gate="silu", spec=None, m_range=None, **knobs):
    spec = spec or gated(name=f"g{m}x{n}x{k}", problem_m=m if m_range is None else ANY, problem_n=n, problem_k=k,
                         epilogue_gate=gate, **knobs)
    lo, hi = m_range or (None, None)
    return TunedEntry(m=m, n=n, k=k, batch=1, dtype="f16", layout="row,col,row", target="triton",
                      spec_text=spec.to_l2(), tflops=2.0, baseline_tflops=1.0, m_lo=lo, m_hi=hi, gate=gate)


def plain_entry(m, n, k, m_range=None):
    spec = KernelSpec(name=f"p{m}x{n}x{k}", problem_m=m if m_range is None else ANY, problem_n=n, problem_k=k,
                      tile_m=16, tile_n=16, tile_k=16, layout_b="col", swizzle_group=1, launch_warps=4)
    lo, hi = m_range or (None, None)
    return TunedEntry(m=m, n=n, k=k, batch=1, dtype="f16", layout="row,col,row", target="triton",
                      spec_text=spec.to_l2(), tflops=2.0, baseline_tflops=1.0, m_lo=lo, m_hi=hi)


def test_gated_entries_serve_only_their_gated_problem():
    table = TunedTable([gated_entry(16, 48, 40), plain_entry(32, 48, 40)])
    assert table.lookup("f16", "row,col,row", 16, 48, 40, gate="silu").gate == "silu"
    assert table.lookup("f16", "row,col,row", 16, 48, 40) is None                  # a plain call never sees it
    assert table.lookup("f16", "row,col,row", 16, 48, 40, gate="gelu_tanh") is None
    assert table.lookup("f16", "row,col,row", 32, 48, 40, gate="silu") is None     # nor a gated call a plain entry
    assert table.lookup("f16", "row,col,row", 32, 48, 40).gate == "none"
    assert table.may_serve(16, 48, 40, "silu") and not table.may_serve(16, 48, 40)
    assert table.may_serve(32, 48, 40) and not table.may_serve(32, 48, 40, "silu")
    row = gated_entry(16, 48, 40).to_row()
    assert row["gate"] == "silu" and "gate" not in plain_entry(32, 48, 40).to_row()
    read = entry_from_row(row)   # the row records its speedup: the figure the loader judges it by
    assert read.speedup == gated_entry(16, 48, 40).speedup and read.to_row() == row
    with pytest.raises(ValueError, match="gate must be one of"):
        entry_from_row(dict(row, gate="relu"))
    assert served_spec(gated_entry(16, 48, 40), 16, True, "none").epilogue_gate == "silu"
    assert served_spec(plain_entry(32, 48, 40), 40, False, "none", residual=True).epilogue_beta == 1.0


def test_a_gated_cutlass_gemv_entry_is_served_to_its_gated_calls_and_prebuilt_for_both_bias_forms(tmp_path):
    """A gated entry of the CUTLASS target's CUDA-core gemv: looked up for its gated problem only, the spec the
    dispatcher builds for it validates with and without nn.Linear's bias (2N values), and the pack's list holds
    both, gated."""
    import json
    from l2c.pack import required_kernels
    spec = KernelSpec(name="cg", target="cutlass", launch_family="gemv", layout_b="col", tile_m=2, tile_n=16,
                      tile_k=256, launch_warps=4, launch_evict="first", split_k_slices=2, epilogue_gate="silu",
                      problem_m=ANY)
    entry = TunedEntry(m=1, n=14336, k=4096, batch=1, dtype="f16", layout="row,col,row", target="cutlass",
                       spec_text=spec.to_l2(), tflops=2.0, baseline_tflops=1.0, m_lo=1, m_hi=2, gate="silu")
    table = TunedTable([entry])
    assert table.lookup("f16", "row,col,row", 2, 14336, 4096, gate="silu") is not None
    assert table.lookup("f16", "row,col,row", 2, 14336, 4096) is None
    for has_bias in (False, True):
        valid = validate(served_spec(entry, 2, has_bias, "none"), "cutlass")
        assert valid.schedule == "gemv" and valid.spec.epilogue_gate == "silu"
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"arch": "sm_90", "entries": [entry.to_row()]}))
    _, kernels, problems = required_kernels([path])
    gated_kernels = [k for k in kernels if "gate=silu" in k.spec]
    assert not problems and len(gated_kernels) == 2 and {"bias=col" in k.spec for k in gated_kernels} == {True, False}


@pytest.mark.parametrize("gate", ["silu", "gelu_tanh"])
def test_gated_fallback_runs_the_halves_apart_as_the_replaced_module_does(gate):
    """Unserved, a gated call is what the MLP module it replaces computes: a GEMM per half (views of the one
    weight), then act(g) * u, bit for bit; one GEMM over both halves was slower on the H200."""
    from torch.profiler import profile
    set_tuned_table(None)
    a, w, bias = torch.randn(7, 5), torch.randn(6, 5), torch.randn(6)
    y = w.t()
    expect = act(gate, F.linear(a, w[:3], bias[:3])) * F.linear(a, w[3:], bias[3:])
    with profile() as prof:
        got = l2c.gated_matmul(a, y, gate, bias=bias)
    assert torch.equal(got, expect)
    assert sum(e.name in ("aten::addmm", "aten::mm") for e in prof.events()) == 2
    mlp_out = default_dispatcher().gated_linear(a.reshape(7, 1, 5), w, gate, bias)
    assert torch.equal(mlp_out, expect.reshape(7, 1, 3))
    with pytest.raises(ValueError, match="gate must be one of"):
        l2c.gated_matmul(a, y, "relu")


@pytest.mark.parametrize("family", ["gemm", "gemv"])
def test_the_tuned_gated_kernel_serves_from_the_table(family):
    """The dispatcher path on the interpreter: a gated entry's spec with the call's bias, built, verified (inline)
    and called; a gated call of another gate or shape runs torch."""
    knobs = dict(launch_family="gemv", tile_m=4, tile_n=16, tile_k=32) if family == "gemv" else {}
    dispatcher = set_tuned_table(TunedTable([gated_entry(8, 40, 48, m_range=(2, 8), **knobs)]),
                                              allow_cpu=True, prepare="inline")
    a = torch.randn(5, 48, dtype=torch.float16)
    w = torch.randn(80, 48, dtype=torch.float16)
    bias = torch.randn(80, dtype=torch.float16)
    y = l2c.gated_matmul(a, w.t(), "silu", bias=bias)
    assert dispatcher.stats == {"tuned": 1, "fallback": 0}
    want = reference(a, w.t(), "silu", bias)
    assert ((y.double() - want).norm() / want.norm()).item() < 5e-3
    l2c.gated_matmul(a, w.t(), "gelu_tanh", bias=bias)          # no entry for GeGLU at this shape
    l2c.gated_matmul(a[:1], w.t(), "silu", bias=bias)           # M=1: outside the measured range
    with torch.enable_grad():
        l2c.gated_matmul(a.requires_grad_(), w.t(), "silu")     # autograd records: torch
    assert dispatcher.stats == {"tuned": 1, "fallback": 3}
    set_tuned_table(None)


def test_residual_is_added_in_the_served_kernel_and_by_addmm_elsewhere():
    dispatcher = set_tuned_table(TunedTable([plain_entry(24, 40, 48, m_range=(16, 32))]),
                                              allow_cpu=True, prepare="inline")
    a = torch.randn(20, 48, dtype=torch.float16)
    w = torch.randn(40, 48, dtype=torch.float16)
    r = torch.randn(20, 40, dtype=torch.float16)
    y = l2c.matmul(a, w.t(), residual=r)
    assert dispatcher.stats == {"tuned": 1, "fallback": 0}
    want = r.double() + a.double() @ w.double().t()
    assert ((y.double() - want).norm() / want.norm()).item() < 5e-3
    lin = l2c.nn.Linear(48, 40, bias=False, dtype=torch.float16)
    with torch.no_grad():
        lin.weight.copy_(w)
        y3 = lin(a.reshape(4, 5, 48), residual=r.reshape(4, 5, 40))
    assert y3.shape == (4, 5, 40) and dispatcher.stats["tuned"] == 2
    assert ((y3.reshape(20, 40).double() - want).norm() / want.norm()).item() < 5e-3
    # unserved (M=8): torch's addmm, exactly
    a8, r8 = a[:8].float(), r[:8].float()
    torch.testing.assert_close(l2c.matmul(a8, w.t().float(), residual=r8), torch.addmm(r8, a8, w.t().float()))
    with pytest.raises(ValueError, match="no activation"):
        l2c.matmul(a, w.t(), activation="relu", residual=r)
    set_tuned_table(None)


def test_gated_matmul_and_residual_under_torch_compile():
    """Under torch.compile both are one opaque custom op each; here a table serves the gated one (interpreter)."""
    dispatcher = set_tuned_table(TunedTable([gated_entry(6, 24, 32)]), allow_cpu=True, prepare="inline")
    a = torch.randn(6, 32, dtype=torch.float16)
    w = torch.randn(48, 32, dtype=torch.float16)
    down = torch.randn(24, 16, dtype=torch.float16)
    r = torch.randn(6, 16, dtype=torch.float16)

    def block(x):
        return l2c.matmul(l2c.gated_matmul(x, w.t(), "silu"), down, residual=r)

    y = torch.compile(block)(a)
    assert dispatcher.stats["tuned"] >= 1
    want = r.double() + reference(a, w.t(), "silu") @ down.double()
    assert ((y.double() - want).norm() / want.norm()).item() < 5e-3
    set_tuned_table(None)


def test_bench_times_a_gated_kernel_against_torchs_gated_projection_and_table_keeps_its_gate(tmp_path):
    """`l2c bench` on a gated spec: verified, timed against torch's one GEMM over both halves then act(g) * u, its
    row carrying the gate and the FLOPs of the 2N columns; `l2c table` writes a gated entry, which the dispatcher
    serves only to gated calls. (CPU figures: the machinery, not performance.)"""
    from l2c.results_file import read_rows
    from l2c.cli import main
    spec = gated(name="bench_swiglu", epilogue_bias="col")
    (tmp_path / "g.l2").write_text(spec.to_l2())
    (tmp_path / "shapes.txt").write_text("24 40 48\n")
    out, table = tmp_path / "r.jsonl", tmp_path / "t.json"
    assert main(["bench", str(tmp_path / "g.l2"), "--shapes", str(tmp_path / "shapes.txt"), "-o", str(out),
                 "--device", "cpu", "--reps", "2", "--warmup", "1"]) == 0
    (row,) = [r for r in read_rows(out) if r.get("type") == "result"]
    assert row["status"] == "ok" and row["verified"] is True and row["gate"] == "silu"
    assert row["flops"] == 2 * 24 * 80 * 48
    assert main(["table", str(out), "-o", str(table), "--every-shape"]) == 0
    import json
    (written,) = json.loads(table.read_text())["entries"]
    assert written["gate"] == "silu" and written["spec"] == spec.to_l2()
    # as a win (CPU figures never are one), the entry serves the gated call and no plain one
    served = TunedTable([entry_from_row(dict(written, tflops=2.0, baseline_tflops=1.0, speedup=2.0))])
    assert served.lookup("f16", "row,col,row", 24, 40, 48, gate="silu") is not None
    assert served.lookup("f16", "row,col,row", 24, 40, 48) is None


def test_serve_sweep_gated_stage_measures_the_gated_pool(tmp_path):
    """scripts/serve_sweep.py --stages gated on a tiny weight (CPU, interpreter): every candidate of the pool is a
    valid gated spec of the family its token count asks for, verified and timed, each row carrying the gate."""
    import subprocess
    import sys
    from pathlib import Path
    from l2c.results_file import read_rows
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TRITON_INTERPRET="1", L2C_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(repo / "scripts" / "serve_sweep.py"), "--out", str(tmp_path),
                           "--stages", "gated", "--gated-weights", "40x48", "--gated-tokens", "3,40", "--workers", "1",
                           "--gate", "gelu_tanh"], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in read_rows(tmp_path / "serve_gated_gelu_tanh_f16.jsonl") if r.get("type") == "result"]
    assert rows and all(r["status"] == "ok" and r["verified"] is True and r["gate"] == "gelu_tanh" for r in rows)
    families = {m: {"gemv" if "family=gemv" in r["spec"] else "gemm" for r in rows if r["m"] == m} for m in (3, 40)}
    assert families == {3: {"gemv", "gemm"}, 40: {"gemm"}}   # GEMV up to 16 tokens, tensor-core tiles from 2
    assert any("loads=tma" in r["spec"] for r in rows if r["m"] == 40)


def test_the_gated_stage_s_cutlass_pool_is_valid_gated_gemms_on_the_llama_weight():
    """serve_sweep's gated stage on a GPU: from 64 tokens its CUTLASS candidates are valid gated GEMMs (the staged
    epilogue, B column-major) whose tile n divides Llama-8B's 14336; `triton=False` keeps only them."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import serve_sweep
    assert not [t for t in serve_sweep.gated_pool(32, "f16", "silu", triton=False)]
    for m in (64, 512, 8192):
        texts = serve_sweep.gated_pool(m, "bf16", "silu", triton=False)
        assert len(texts) == len(serve_sweep.GATED_CUTLASS)
        for text in texts:
            spec = parse_one(text)
            valid = validate(spec, "cutlass")
            assert (spec.epilogue_gate, spec.epilogue_store, spec.layout_b) == ("silu", "staged", "col")
            assert 14336 % output_n_step(valid) == 0
        assert set(texts) <= set(serve_sweep.gated_pool(m, "bf16", "silu"))


def test_a_gated_call_of_an_odd_width_is_an_error_not_a_dropped_column():
    """b holds the gate's columns then the up projection's: an odd width is an error (it used to drop the last
    column), in a @ b's layout and in nn.Linear's."""
    set_tuned_table(None)
    a = torch.randn(4, 8)
    with pytest.raises(ValueError, match="even width"):
        l2c.gated_matmul(a, torch.randn(8, 7), "silu")
    from l2c.epilogue import torch_gated_linear
    with pytest.raises(ValueError, match="even count"):
        torch_gated_linear(a, torch.randn(7, 8), None, "silu")


def test_a_compiled_gated_call_under_autocast_is_torchs_autocast_ops():
    """Under torch.compile and an autocast region to another dtype, the gated call is traced as torch's ops (which
    autocast casts), as l2c.matmul's is: its result is autocast's dtype and value."""
    set_tuned_table(None)
    a, b = torch.randn(4, 8), torch.randn(8, 6)
    f = torch.compile(lambda a, b: l2c.gated_matmul(a, b, "silu"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = f(a, b)
        want = torch.nn.functional.silu(a @ b[:, :3]) * (a @ b[:, 3:])
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)
