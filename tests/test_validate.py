"""Validation rules: each rejection names file:line:col, the knob and the rule; accepted specs resolve `auto`."""
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from l2c.errors import L2ValidationError
from l2c.ir import KernelSpec
from l2c.knobs import AUTO, DTYPE_BYTES
from l2c.lower import render
from l2c.parser import parse_one
from l2c.arch import ARCHS
from l2c.targets.cutlass.rules import cutlass_epilogue_smem
from l2c.validate import RULES, validate

from .strategies import valid_specs


def rejects(text: str, target: str, rule: str, knob: str = None, arch: str = "sm_90"):
    spec = parse_one(text, "v.l2")
    with pytest.raises(L2ValidationError) as info:
        validate(spec, target, arch)
    err = info.value
    assert err.rule == rule, err.render()
    assert rule in RULES
    if knob:
        assert err.knob == knob, err.render()
    assert err.render().startswith("v.l2:") and f"(rule: {rule})" in err.render()
    return err


@pytest.mark.parametrize("text, target, rule, knob", [
    ("kernel a { target cutlass }", "triton", "target", "target"),
    ("kernel a { target cutlass launch warps=8 }", "cutlass", "gemv-knobs", "launch.warps"),
    ("kernel a { target triton cluster m=2 }", "triton", "target-knob", "cluster.m"),
    ("kernel a { types a=f16 b=bf16 }", "triton", "same-input-types", "types.b"),
    ("kernel a { types a=bf16 b=bf16 acc=f16 }", "triton", "acc-type", "types.acc"),
    ("kernel a { problem k=256 tile k=64 split_k slices=8 }", "triton", "split-k-slices", "split_k.slices"),
    ("kernel a { split_k mode=stream_k }", "triton", "stream-k-target", "split_k.mode"),
    ("kernel a { tile m=256 n=256 k=128 pipeline stages=4 launch warps=8 }", "triton", "shared-memory",
     "pipeline.stages"),
    ("kernel a { tile m=256 n=256 launch warps=4 }", "triton", "accumulator-registers", "launch.warps"),
    # 512 threads share the register file: 128 registers a thread, all of them the accumulators' (ptxas refuses)
    ("kernel a { tile m=256 n=256 k=64 pipeline stages=2 launch warps=16 }", "triton", "accumulator-registers",
     "launch.warps"),
    # the epilogue converts the stored tile through shared memory: 256 x 256 fp32 values are 256 KB
    ("kernel a { types a=f16 b=f16 c=f32 tile m=256 n=256 k=32 launch warps=8 }", "triton", "shared-memory",
     "tile.n"),
    ("kernel a { tile m=256 n=256 k=32 launch warps=8 split_k slices=2 }", "triton", "shared-memory", "tile.n"),
    ("kernel a { problem m=1 n=4096 k=100 layout b=col tile m=1 n=64 k=256 launch family=gemv }", "cutlass",
     "gemv-cuda-shape", "problem.k"),
    ("kernel a { problem m=1 n=100 k=4096 layout b=col tile m=1 n=64 k=256 launch family=gemv }", "cutlass",
     "gemv-cuda-shape", "problem.n"),
    ("kernel a { problem m=70000 n=4096 k=4096 layout b=col tile m=1 n=64 k=256 launch family=gemv }", "cutlass",
     "gemv-cuda-shape", "problem.m"),
    ("kernel a { types a=f32 b=f32 c=f32 }", "cutlass", "cutlass-dtypes", "types.a"),
    ("kernel a { tile m=32 }", "cutlass", "wgmma-tile-m", "tile.m"),
    ("kernel a { tile k=16 }", "cutlass", "cutlass-tile-k", "tile.k"),
    ("kernel a { tile m=64 n=128 launch schedule=cooperative }", "cutlass", "cooperative-tile-m", "tile.m"),
    ("kernel a { tile m=256 n=64 launch schedule=pingpong }", "cutlass", "pingpong-tile-m", "tile.m"),
    ("kernel a { tile m=256 n=64 launch schedule=basic }", "cutlass", "basic-tile-m", "tile.m"),
    ("kernel a { tile m=64 n=48 }", "triton", "triton-tile-pow2", "tile.n"),
    ("kernel a { problem m=65536 n=64 k=32769 }", "triton", "triton-offsets", "problem.k"),
    ("kernel a { problem m=64 n=65536 k=32769 }", "triton", "triton-offsets", "problem.n"),
    ("kernel a { problem m=64 n=32768 k=65537 launch family=gemv tile m=1 n=64 k=64 }", "triton", "triton-offsets",
     "problem.n"),
    ("kernel a { tile m=64 n=192 }", "triton", "triton-tile-pow2", "tile.n"),
    ("kernel a { tile m=256 n=256 }", "cutlass", "accumulator-registers", "tile.n"),
    ("kernel a { tile m=64 n=8 launch swap=yes }", "cutlass", "wgmma-tile-m", "tile.n"),
    ("kernel a { tile m=192 n=64 launch schedule=cooperative swap=yes }", "cutlass", "cooperative-tile-m", "tile.n"),
    ("kernel a { target triton launch swap=yes }", "triton", "target-knob", "launch.swap"),
    ("kernel a { cluster m=4 n=4 }", "cutlass", "cluster-size", "cluster.n"),
    ("kernel a { tile m=64 split_k slices=2 }", "cutlass", "split-k-schedule", "split_k.slices"),
    ("kernel a { split_k slices=4 mode=parallel }", "triton", "parallel-split-k-target", "split_k.mode"),
    ("kernel a { problem batch=any split_k slices=4 mode=parallel }", "cutlass", "parallel-split-k", "problem.batch"),
    ("kernel a { problem k=4100 split_k slices=4 mode=parallel }", "cutlass", "parallel-split-k", "problem.k"),
    ("kernel a { problem k=4096 split_k slices=3 mode=parallel }", "cutlass", "parallel-split-k", "problem.k"),
    ("kernel a { problem n=66 layout c=col split_k slices=4 mode=parallel }", "cutlass", "parallel-split-k",
     "problem.n"),
    ("kernel a { pipeline stages=1 }", "cutlass", "cutlass-min-stages", "pipeline.stages"),
    ("kernel a { layout a=col b=col tile m=128 n=8 k=64 pipeline stages=7 launch schedule=basic }", "cutlass",
     "narrow-b-stages", "pipeline.stages"),
    ("kernel a { layout a=row b=row tile m=8 n=64 k=64 pipeline stages=7 launch schedule=basic swap=yes }",
     "cutlass", "narrow-b-stages", "pipeline.stages"),
    ("kernel a { layout a=row b=col tile m=8 n=64 k=32 pipeline stages=7 launch schedule=basic swap=yes }",
     "cutlass", "narrow-b-stages", "pipeline.stages"),
    ("kernel a { layout a=row b=col tile m=64 n=8 k=64 pipeline stages=5 launch schedule=basic }",
     "cutlass", "narrow-b-stages", "pipeline.stages"),
    ("kernel a { tile m=128 n=256 k=128 pipeline stages=5 }", "cutlass", "shared-memory", "pipeline.stages"),
    ("kernel a { problem m=4096 n=4096 k=4100 layout a=row }", "cutlass", "tma-alignment", "problem.k"),
    ("kernel a { problem m=4100 n=64 k=64 layout a=col }", "cutlass", "tma-alignment", "problem.m"),
    ("kernel a { problem m=64 n=66 k=64 types c=f16 }", "cutlass", "tma-alignment", "problem.n"),
    ("kernel a { epilogue bias=col store=direct }", "cutlass", "direct-store", "epilogue.bias"),
    ("kernel a { epilogue activation=relu store=direct }", "cutlass", "direct-store", "epilogue.activation"),
    ("kernel a { tile m=1 n=64 k=256 launch family=gemv epilogue store=direct }", "cutlass", "direct-store",
     "epilogue.store"),
    ("kernel a { target triton epilogue store=direct }", "triton", "target-knob", "epilogue.store"),
    ("kernel a { tile m=1 n=64 k=256 launch family=gemv epilogue store=staged }", "cutlass", "staged-store",
     "epilogue.store"),
])
def test_each_rule_rejects_with_its_name_and_knob(text, target, rule, knob):
    rejects(text, target, rule, knob)


def test_parallel_split_k_takes_either_schedule_and_sizes_the_partials_gemm():
    """Parallel split-K runs a plain batched GEMM (the persistent scheduler), so pingpong tiles are allowed, unlike
    the split-K scheduler's modes; its shared memory is that of the GEMM CUTLASS instantiates: fp32 row-major
    partials with no epilogue inputs, whatever the spec's own output and epilogue."""
    pingpong = validate(parse_one("kernel a { tile m=64 n=128 split_k slices=4 mode=parallel }"), "cutlass")
    assert pingpong.schedule == "pingpong"
    fused = parse_one("kernel a { types c=bf16 layout c=col tile m=128 n=128 split_k slices=8 mode=parallel "
                      "epilogue beta=1.0 bias=col activation=gelu }")
    plain_f32 = parse_one("kernel a { types c=f32 tile m=128 n=128 split_k slices=8 mode=parallel }")
    assert validate(fused, "cutlass").smem_bytes == validate(plain_f32, "cutlass").smem_bytes
    assert validate(parse_one("kernel a { problem k=4096 split_k slices=8 mode=parallel }"), "cutlass")


def test_rejection_points_at_the_offending_knob():
    err = rejects("kernel a {\n  tile m=32 n=64\n}", "cutlass", "wgmma-tile-m", "tile.m")
    assert (err.line, err.col) == (2, 10)


def test_unknown_arch_is_rejected():
    rejects("kernel a { }", "triton", "arch", arch="sm_42")


def test_f32_output_is_four_bytes_aligned():
    # 66 f32 values = 264 bytes: not a multiple of 16; 68 is.
    rejects("kernel a { problem m=64 n=66 k=64 types c=f32 layout b=col }", "cutlass", "tma-alignment", "problem.n")
    validate(parse_one("kernel a { problem m=64 n=68 k=64 types c=f32 layout b=col }"), "cutlass")


def test_any_spec_may_carry_the_other_targets_knobs():
    spec = parse_one("kernel a { launch warps=8 schedule=pingpong cluster n=2 tile m=128 }")
    assert validate(spec, "triton").warps == 8
    assert validate(spec, "cutlass").schedule == "pingpong"


def test_narrow_and_wide_cutlass_tiles_and_the_basic_schedule():
    # Tiles whose N is any multiple of 8 (a warpgroup MMA's N): cuBLAS's narrow 64x8..64x48 tiles, and 192.
    for n in (8, 16, 48, 96, 192):
        v = validate(KernelSpec(tile_m=64 if n < 192 else 128, tile_n=n, tile_k=64), "cutlass")
        assert v.stages >= 2 and v.smem_bytes <= v.arch.smem_per_block
    v = validate(KernelSpec(tile_m=64, tile_n=8, tile_k=64, launch_schedule="basic", cluster_n=4), "cutlass")
    assert v.schedule == "basic" and v.warps == 8
    # launch swap=yes: CUTLASS's tile M is the spec's tile N, so narrow and 192-row tiles lie along M
    for m in (8, 48, 192):
        v = validate(KernelSpec(tile_m=m, tile_n=128, tile_k=64, launch_swap="yes"), "cutlass")
        assert v.schedule == "cooperative" and v.stages >= 2


def test_auto_knobs_are_resolved():
    v = validate(KernelSpec(tile_m=128, tile_n=256, tile_k=64), "cutlass")
    assert v.schedule == "cooperative" and 2 <= v.stages <= 8
    assert v.smem_bytes <= ARCHS["sm_90"].smem_per_block
    v = validate(KernelSpec(tile_m=64, tile_n=64), "triton")
    assert v.warps == 4 and v.stages == 4


@settings(max_examples=200)
@given(valid_specs("cutlass"))
def test_valid_cutlass_specs_fit_shared_memory_and_registers(spec):
    v = validate(spec, "cutlass")
    assert v.smem_bytes <= v.arch.smem_per_block
    assert v.smem_bytes >= cutlass_epilogue_smem(spec, v.schedule)
    assert v.stages >= 2
    assert v.schedule in ("cooperative", "pingpong", "basic")
    assert v.warps == (8 if v.schedule == "basic" else 12)
    if spec.pipeline_stages != AUTO:
        assert v.stages == spec.pipeline_stages


@settings(max_examples=200)
@given(valid_specs("triton"))
def test_valid_triton_specs_fit(spec):
    v = validate(spec, "triton")
    assert v.smem_bytes <= v.arch.smem_per_block
    assert spec.tile_m * spec.tile_n * (4 if spec.types_c == "f32" or spec.split_k_slices > 1 else 2) <= v.smem_bytes
    assert spec.tile_m * spec.tile_n // (32 * v.warps) <= (256 if v.warps <= 8 else 65536 // (32 * v.warps) * 3 // 4)


def test_triton_tiles_just_inside_the_epilogue_and_register_limits_are_accepted():
    assert validate(parse_one("kernel a { types a=f16 b=f16 c=f32 tile m=256 n=128 k=32 launch warps=8 }"),
                    "triton").smem_bytes == 256 * 128 * 4
    assert validate(parse_one("kernel a { tile m=256 n=128 k=64 pipeline stages=2 launch warps=16 }"),
                    "triton").warps == 16


def _stored(matrix, layout):
    """A matrix as it lies in memory (packed) in a storage order: the flat buffer and its leading dimension."""
    import numpy as np
    rows, cols = matrix.shape
    return (np.ascontiguousarray(matrix).ravel(), cols) if layout == "row" else (np.ascontiguousarray(matrix.T).ravel(), rows)


def _view(buffer, rows, cols, layout, ld):
    """The rows x cols matrix a kernel reads from `buffer` in `layout` with leading dimension `ld`."""
    return buffer.reshape(-1, ld)[:rows, :cols] if layout == "row" else buffer.reshape(-1, ld)[:cols, :rows].T


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 9), n=st.integers(1, 9), k=st.integers(1, 9), la=st.sampled_from(("row", "col")),
       lb=st.sampled_from(("row", "col")), lc=st.sampled_from(("row", "col")),
       bias=st.sampled_from(("none", "row", "col")), seed=st.integers(0, 2**16))
def test_swapped_operands_describe_the_same_product_in_the_same_memory(m, n, k, la, lb, lc, bias, seed):
    """What `launch swap=yes` hands CUTLASS (l2c.targets.cutlass.rules.swapped_operands) reads A's and B's buffers as B^T and
    A^T and writes D^T into D's buffer: the same bytes as D = A @ B (+ bias), in every storage order."""
    import numpy as np
    from l2c.targets.cutlass.rules import swapped_operands
    rng = np.random.default_rng(seed)
    a, b = rng.integers(-4, 5, (m, k)), rng.integers(-4, 5, (k, n))
    vec = rng.integers(-4, 5, m if bias == "row" else n)
    spec = KernelSpec(problem_m=m, problem_n=n, layout_a=la, layout_b=lb, layout_c=lc, epilogue_bias=bias,
                      launch_swap="yes")
    d = a @ b + (vec[:, None] if bias == "row" else vec[None, :] if bias == "col" else 0)
    expected, ldd = _stored(d, lc)
    (a_buf, lda), (b_buf, ldb) = _stored(a, la), _stored(b, lb)

    g = swapped_operands(spec)
    assert (g.problem_m, g.problem_n, g.launch_swap) == (n, m, "no")
    a2 = _view(b_buf, n, k, g.layout_a, ldb)      # CUTLASS's A: N x K, read from B's buffer
    b2 = _view(a_buf, k, m, g.layout_b, lda)      # CUTLASS's B: K x M, read from A's buffer
    d2 = a2 @ b2 + (vec[:, None] if g.epilogue_bias == "row" else vec[None, :] if g.epilogue_bias == "col" else 0)
    out = np.zeros_like(expected)
    _view(out, n, m, g.layout_c, ldd)[...] = d2   # CUTLASS's D: N x M, written into D's buffer
    assert np.array_equal(out, expected)
    assert swapped_operands(g) == spec.replace(launch_swap="no")   # transposing twice changes nothing


def test_auto_stages_a_narrow_k_major_b_cannot_take_are_rounded_down_and_named_in_the_source():
    """stages=auto is CUTLASS's own count (StageCountAutoCarveout), except where CUTLASS 4.2 cannot build it (rule
    narrow-b-stages: an odd count for an 8-wide K-major B tile 32 or 64 deep): there the rules round it down to an
    even count and the template names it. Elsewhere an odd auto count stays CUTLASS's."""
    from l2c.lower import render
    pinned = validate(parse_one("kernel p { layout a=row b=row c=row tile m=8 n=128 k=64 "
                                "launch schedule=basic swap=yes }"), "cutlass")
    assert pinned.stages == 12 and pinned.stages_pinned
    source = render(pinned)
    assert "StageCount<12>" in source and "StageCountAutoCarveout" not in source
    # the direct store leaves CUTLASS room for 25 stages of the swapped 8 x 64 x 64 tile in nn.Linear's layout
    direct = validate(parse_one("kernel d { layout a=row b=col c=row tile m=8 n=64 k=64 launch schedule=basic "
                                "swap=yes epilogue store=direct }"), "cutlass")
    assert direct.stages == 24 and direct.stages_pinned and "StageCount<24>" in render(direct)
    wide = validate(parse_one("kernel w { tile m=192 n=128 k=64 launch schedule=cooperative swap=yes "
                              "cluster m=1 n=2 }"), "cutlass")   # an MN-major A beside a 192-wide B tile
    assert wide.stages == 5 and not wide.stages_pinned and "StageCountAutoCarveout" in render(wide)
    for text in ("layout a=col b=row tile m=64 n=8 k=64",            # an 8-wide MN-major B tile
                 "layout a=row b=col tile m=8 n=64 k=128 launch swap=yes",   # 128 deep
                 "layout a=row b=col tile m=16 n=64 k=64 launch swap=yes"):  # 16 wide
        assert validate(parse_one(f"kernel o {{ {text} pipeline stages=7 launch schedule=basic }}"), "cutlass")


def test_a_direct_store_takes_the_bias_a_parallel_split_k_reduction_applies():
    spec = parse_one("kernel a { tile m=16 n=64 k=128 launch schedule=basic swap=yes split_k slices=2 mode=parallel "
                     "epilogue bias=col activation=silu store=direct }")
    assert validate(spec, "cutlass").spec.epilogue_store == "direct"


@settings(max_examples=200)
@given(valid_specs("cutlass", epilogue_store="tma", epilogue_bias="none", epilogue_activation="none"))
def test_a_direct_store_frees_the_epilogue_shared_memory_for_stages(spec):
    """The same kernel with `store=direct` is valid too, never has fewer stages (stages=auto) and never needs more
    shared memory at the same stage count."""
    tma = validate(spec, "cutlass")
    direct = validate(dataclasses.replace(spec, epilogue_store="direct"), "cutlass")
    assert direct.stages >= tma.stages
    if spec.pipeline_stages != AUTO:
        assert direct.smem_bytes <= tma.smem_bytes
    assert "NoSmemWarpSpecialized" in render(direct) and "NoSmemWarpSpecialized" not in render(tma)


@settings(max_examples=200)
@given(valid_specs("cutlass", epilogue_store="tma", epilogue_bias="none", epilogue_activation="none"))
def test_a_staged_store_is_valid_wherever_its_tile_fits_beside_the_main_loop(spec):
    """The same plain kernel with `store=staged` is valid unless its staged block leaves under two stages (CUTLASS's
    split-K and stream-K schedulers included: in CUTLASS 4.2 the last split of a tile stores it whole); its epilogue
    holds one MMA step of rows (half the columns of a tile one MMA spans: 96-256 wide but 112-176, 208-240), each
    line along D's contiguous dimension padded by 16 bytes, and it renders l2c's epilogue, not CUTLASS's."""
    from l2c.targets.cutlass.rules import cutlass_gemm_spec
    staged_spec = dataclasses.replace(spec, epilogue_store="staged")
    try:
        staged = validate(staged_spec, "cutlass")
    except L2ValidationError as err:
        assert err.rule == "shared-memory", err
        return
    gemm = cutlass_gemm_spec(staged_spec)
    rows = min(gemm.tile_m, 128 if staged.schedule == "cooperative" else 64)   # one warpgroup MMA step along M
    columns = gemm.tile_n // 2 if gemm.tile_n in (96, 128, 192, 256) else gemm.tile_n
    line, lines = (columns, rows) if gemm.layout_c == "row" else (rows, columns)
    assert cutlass_epilogue_smem(gemm, staged.schedule) == -(-lines * (line * DTYPE_BYTES[gemm.types_c] + 16)
                                                             // 128) * 128
    source = render(staged)
    assert "class StagedEpilogue" in source and "epilogue::collective::CollectiveBuilder" not in source


def test_a_staged_store_kernel_fuses_a_call_s_bias_and_activation_itself():
    from l2c.tuned_table import TunedTable, served_spec
    text = ("kernel s { target cutlass tile m=16 n=64 k=128 launch schedule=basic swap=yes layout b=col "
            "epilogue store=staged }")
    table = TunedTable.serving(parse_one(text).to_l2(), "cutlass", "f16", "row,col,row")
    entry = table.lookup("f16", "row,col,row", 7, 64, 64)
    for has_bias, activation in ((True, "none"), (False, "silu"), (True, "gelu")):
        fused = served_spec(entry, 7, has_bias, activation)
        assert fused.epilogue_store == "staged" and fused.epilogue_activation == activation
        source = render(validate(fused, "cutlass"))
        assert ("StagedBias::kPerRow,   // bias=col" in source) == has_bias   # per row of D^T: swap=yes
        assert ("<float>>>;   // activation=" + activation in source) == (activation != "none")


def test_a_direct_store_kernel_asked_for_a_bias_or_activation_stores_through_tma():
    from l2c.tuned_table import TunedTable, served_spec
    text = ("kernel d { target cutlass tile m=16 n=64 k=128 launch schedule=basic swap=yes layout b=col "
            "epilogue store=direct }")
    table = TunedTable.serving(parse_one(text).to_l2(), "cutlass", "f16", "row,col,row")
    entry = table.lookup("f16", "row,col,row", 7, 64, 64)
    plain = served_spec(entry, 7, has_bias=False, activation="none")
    assert plain.epilogue_store == "direct" and validate(plain, "cutlass")
    for has_bias, activation in ((True, "none"), (False, "silu"), (True, "gelu")):
        fused = served_spec(entry, 7, has_bias, activation)
        assert fused.epilogue_store == "tma" and validate(fused, "cutlass")
        assert fused.replace(epilogue_store="direct", epilogue_bias="none", epilogue_activation="none") == plain
    parallel = TunedTable.serving(parse_one(text.replace("store=direct", "store=direct split_k slices=2 "
                                                         "mode=parallel")).to_l2(), "cutlass", "f16", "row,col,row")
    fused = served_spec(parallel.lookup("f16", "row,col,row", 7, 64, 64), 7, has_bias=True, activation="silu")
    assert fused.epilogue_store == "direct" and validate(fused, "cutlass")   # the reduction kernel applies both


def test_a_direct_store_kernel_with_stages_only_it_fits_gets_the_tma_store_with_the_stages_that_fit():
    direct = parse_one("kernel d { tile m=128 n=128 k=64 pipeline stages=7 launch schedule=cooperative "
                       "epilogue store=direct }")
    assert validate(direct, "cutlass").stages == 7
    with pytest.raises(L2ValidationError):   # the same stages beside the TMA store's shared memory do not fit
        validate(direct.replace(epilogue_store="tma", epilogue_bias="col"), "cutlass")
    fused = direct.with_epilogue("col", "none")
    assert fused.epilogue_store == "tma" and fused.pipeline_stages == AUTO
    assert validate(fused, "cutlass").stages == 6


@pytest.mark.parametrize("name", ["torch", "triton", "l2c", "__init__", "__main__"])
@pytest.mark.parametrize("target", ["triton", "cutlass"])
def test_a_kernel_named_after_a_package_the_generated_code_imports_is_refused(name, target):
    """`l2c compile` writes NAME.py into triton/: a kernel named torch or triton would shadow the package it imports,
    and triton/__init__.py would make the folder itself the `triton` package."""
    rejects(f"kernel {name} {{ }}", target, "name-module")


def test_triton_matrices_of_2_31_elements_are_accepted_and_larger_refused():
    """The Triton kernels' 32-bit offsets reach 2^31 - 1: a fixed shape whose operands hold at most 2^31 elements
    passes, one element row more is refused, and a gated B counts its 2N columns. Open extents are not judged."""
    validate(parse_one("kernel a { problem m=65536 n=64 k=32768 }"), "triton")
    validate(parse_one("kernel a { problem m=any n=64 k=65536 }"), "triton")
    gated = "kernel a {{ problem m=16 n={n} k=65536 tile m=16 n=16 k=32 epilogue gate=silu }}"
    validate(parse_one(gated.format(n=16384)), "triton")
    rejects(gated.format(n=16392), "triton", "triton-offsets", "problem.n")
