"""The CUTLASS template turns each knob into the right CUTLASS type or argument (no compiler needed).

Each test renders one spec and looks for the C++ that knob must produce; the property test renders random
valid specs. Real compiles are in test_cutlass_build.py.
"""
from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings

from l2c.ir import KernelSpec
from l2c.lower import render
from l2c.targets.cutlass.rules import cutlass_epilogue_smem, cutlass_gemm_spec
from l2c.validate import validate
from tests.strategies import valid_specs


def src(**knobs) -> str:
    return render(validate(KernelSpec(name=knobs.pop("name", "k"), **knobs), "cutlass"))


def squash(text: str) -> str:
    """Whitespace-insensitive view of the source, for matching multi-line template instantiations."""
    return re.sub(r"\s+", " ", text)


def test_header_carries_the_canonical_spec():
    spec = KernelSpec(name="hdr", tile_m=128, tile_n=128)
    text = render(validate(spec, "cutlass"))
    for line in spec.to_l2().rstrip().splitlines():
        assert f"// {line}\n" in text


@pytest.mark.parametrize("schedule,kernel,epilogue", [
    ("cooperative", "KernelTmaWarpSpecializedCooperative", "TmaWarpSpecializedCooperative"),
    ("pingpong", "KernelTmaWarpSpecializedPingpong", "TmaWarpSpecialized;"),
])
def test_schedule_pairs_mainloop_and_epilogue(schedule, kernel, epilogue):
    text = src(tile_m=128, launch_schedule=schedule)
    assert f"using KernelSchedule = cutlass::gemm::{kernel};" in text
    assert f"using EpilogueSchedule = cutlass::epilogue::{epilogue}" in text


def test_auto_schedule_resolves_by_tile_m():
    assert "KernelTmaWarpSpecializedCooperative" in src(tile_m=256, tile_n=128)
    assert "KernelTmaWarpSpecializedPingpong" in src(tile_m=64, tile_n=128)


def test_tile_and_cluster_shapes():
    text = src(tile_m=128, tile_n=256, tile_k=64, cluster_m=2, cluster_n=1)
    assert "using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;" in text
    assert "using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;" in text
    assert "cute::Shape<cute::_1, cute::_4, cute::_1>" in src(cluster_n=4)


def test_fixed_stages_use_stage_count():
    text = src(pipeline_stages=3)
    assert "using StageCount = cutlass::gemm::collective::StageCount<3>;" in text
    assert "StageCountAutoCarveout" not in text


def test_auto_stages_carve_out_the_epilogue():
    text = squash(src(pipeline_stages="auto"))
    assert ("StageCountAutoCarveout< static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>"
            in text)


@pytest.mark.parametrize("raster,order", [("m", "AlongM"), ("n", "AlongN")])
def test_raster_order(raster, order):
    assert f"kRasterOrder = RasterOrderOptions::{order};" in src(swizzle_raster=raster)


@pytest.mark.parametrize("group,emitted", [(1, 1), (2, 2), (4, 4), (8, 8), (16, 8)])
def test_swizzle_size(group, emitted):
    text = src(swizzle_group=group)
    assert f"constexpr int kMaxSwizzleSize = {emitted};" in text
    # a persistent kernel lowers it per call so that CUTLASS's scheduler runs no padded tile (checked against
    # CUTLASS's rule on real builds in test_cutlass_build); the basic schedule has no persistent scheduler
    assert "args.scheduler.max_swizzle_size = swizzle_without_padding(" in text
    basic = src(swizzle_group=group, tile_m=64, tile_n=64, launch_schedule="basic")
    assert "args.scheduler.max_swizzle_size = kMaxSwizzleSize;" in basic and "swizzle_without_padding" not in basic


def test_plain_kernel_uses_the_persistent_scheduler():
    text = src()
    assert "using TileScheduler = cutlass::gemm::PersistentScheduler;" in text
    assert "DecompositionMode" not in text


@pytest.mark.parametrize("mode,reduction", [("workspace", "Deterministic"), ("atomic", "Nondeterministic")])
def test_split_k_uses_stream_k_scheduler_in_split_k_mode(mode, reduction):
    text = src(tile_m=128, split_k_slices=4, split_k_mode=mode)
    assert "using TileScheduler = cutlass::gemm::StreamKScheduler;" in text
    assert "constexpr int kSplits = 4;" in text
    assert "args.scheduler.splits = kSplits;" in text
    assert "args.scheduler.decomposition_mode = DecompositionMode::SplitK;" in text
    assert f"kReductionMode = ReductionMode::{reduction};" in text


def test_stream_k():
    text = src(tile_m=128, split_k_mode="stream_k")
    assert "using TileScheduler = cutlass::gemm::StreamKScheduler;" in text
    assert "args.scheduler.decomposition_mode = DecompositionMode::StreamK;" in text
    assert "kSplits" not in text


def test_split_k_one_slice_is_a_plain_kernel():
    assert "PersistentScheduler" in src(split_k_slices=1, split_k_mode="atomic")
    assert "reduce_slices" not in src(split_k_slices=1, split_k_mode="parallel")


@pytest.mark.parametrize("la,lb,slice_a,slice_b", [
    ("row", "row", "int64_t const slice_a = slice_k;", "int64_t const slice_b = int64_t(slice_k) * ldb;"),
    ("col", "col", "int64_t const slice_a = int64_t(slice_k) * lda;", "int64_t const slice_b = slice_k;"),
])
def test_parallel_split_k_is_a_batched_gemm_into_fp32_partials_then_a_reduction(la, lb, slice_a, slice_b):
    """mode=parallel: the persistent scheduler (no split-K scheduler, no serial reduction), the K slices as the
    batch (each slice's offset along K as the batch stride, by layout), fp32 row-major partials with a plain linear
    combination, and reduce_slices applying the spec's epilogue in slice order after the GEMM, on the same stream."""
    text = src(tile_m=128, layout_a=la, layout_b=lb, layout_c="col", split_k_slices=8, split_k_mode="parallel",
               epilogue_alpha=0.5, epilogue_beta=1.0, epilogue_bias="col", epilogue_activation="silu")
    flat = squash(text)
    assert "using TileScheduler = cutlass::gemm::PersistentScheduler;" in text and "DecompositionMode" not in text
    assert "constexpr int kSplits = 8;" in text
    assert slice_a in text and slice_b in text
    assert "using ElementD = float;" in text and "using ElementC = void;" in text
    assert "using LayoutC = cutlass::layout::RowMajor;" in text
    assert "fusion::LinearCombination< ElementD, ElementCompute, ElementC>" in flat
    assert "fusion.bias_ptr" not in text and "fusion.alpha = 1.0f;" in text
    assert "for (int slice = 0; slice < kSplits; ++slice) { sum += partials[slice * count + i]; }" in flat
    assert "x += kBeta * static_cast<float>(C[n * ldc + m]);" in text   # C and D column-major (layout c=col)
    assert "x += static_cast<float>(bias[n]);" in text
    assert "D[n * ldd + m] = static_cast<ElementOut>(activation(x));" in text
    assert "return x / (1.0f + expf(-x));" in text
    run = text[text.index("_run("):]
    assert run.index("= launch(params, stream);") < run.index("reduce_slices<<<blocks, kReduceThreads, 0, stream>>>")
    assert "K % (kSplits * kAlignmentA) != 0" in text and "if (L != 1)" in text


FUSIONS = [
    ("none", "none", "LinearCombination<", None),
    ("none", "relu", "LinCombEltAct<", "cutlass::epilogue::thread::ReLu"),
    ("none", "gelu", "LinCombEltAct<", "cutlass::epilogue::thread::GELU,"),
    ("none", "silu", "LinCombEltAct<", "cutlass::epilogue::thread::SiLu"),
    ("row", "none", "LinCombPerRowBias<", None),
    ("col", "none", "LinCombPerColBias<", None),
    ("row", "gelu", "LinCombPerRowBiasEltAct<", "cutlass::epilogue::thread::GELU,"),
    ("col", "silu", "LinCombPerColBiasEltAct<", "cutlass::epilogue::thread::SiLu"),
    ("col", "relu", "LinCombPerColBiasEltAct<", "cutlass::epilogue::thread::ReLu"),
]


@pytest.mark.parametrize("bias,activation,fusion,act_type", FUSIONS)
def test_epilogue_fusion_operation(bias, activation, fusion, act_type):
    text = src(epilogue_bias=bias, epilogue_activation=activation)
    assert f"using FusionOperation = cutlass::epilogue::fusion::{fusion}" in text
    if act_type:
        assert act_type in text
    else:
        assert "cutlass::epilogue::thread::" not in text.split("FusionOperation =")[1].split(";")[0]
    if bias == "none":
        assert "ElementBias" not in text and "bias_ptr" not in text
    else:
        assert "fusion.bias_ptr = static_cast<ElementBias const*>(bias);" in text
        assert "ElementD, ElementCompute, ElementBias, ElementC>;" in text


def test_gelu_is_the_exact_erf_form():
    assert "GELU_taylor" not in src(epilogue_activation="gelu")


def test_beta_zero_reads_no_c():
    text = src(epilogue_beta=0.0, epilogue_alpha=2.0)
    assert "using ElementC = void;" in text
    assert "args.epilogue.ptr_C = nullptr;" in text
    assert "kBeta" not in text
    assert "constexpr ElementCompute kAlpha = 2.0f;" in text


def test_beta_nonzero_reads_c_of_the_output_type():
    text = src(epilogue_beta=-0.5, types_c="bf16")
    assert "using ElementC = cutlass::bfloat16_t;" in text
    assert "constexpr ElementCompute kBeta = -0.5f;" in text
    assert "fusion.beta = kBeta;" in text
    assert "args.epilogue.ptr_C = static_cast<ElementC const*>(C);" in text


@pytest.mark.parametrize("a,c,ea,ed", [
    ("f16", "f16", "cutlass::half_t", "cutlass::half_t"),
    ("f16", "f32", "cutlass::half_t", "float"),
    ("bf16", "bf16", "cutlass::bfloat16_t", "cutlass::bfloat16_t"),
    ("bf16", "f16", "cutlass::bfloat16_t", "cutlass::half_t"),
    ("bf16", "f32", "cutlass::bfloat16_t", "float"),
])
def test_element_types(a, c, ea, ed):
    text = src(types_a=a, types_b=a, types_c=c)
    assert f"using ElementA = {ea};" in text
    assert f"using ElementB = {ea};" in text
    assert f"using ElementD = {ed};" in text
    assert "using ElementAccumulator = float;" in text


# Strides: A is (M, K, L), B is (N, K, L), C and D are (M, N, L); the stored-contiguous mode is Int<1>.
UNIT = "cute::Int<1>{}"


@pytest.mark.parametrize("la,lb,lc", [(la, lb, lc) for la in ("row", "col") for lb in ("row", "col")
                                      for lc in ("row", "col")])
def test_layouts_and_strides(la, lb, lc):
    text = src(layout_a=la, layout_b=lb, layout_c=lc)
    tag = {"row": "cutlass::layout::RowMajor", "col": "cutlass::layout::ColumnMajor"}
    assert f"using LayoutA = {tag[la]};" in text
    assert f"using LayoutB = {tag[lb]};" in text
    assert f"using LayoutC = {tag[lc]};" in text
    a = f"lda, {UNIT}, batch_stride_a" if la == "row" else f"{UNIT}, lda, batch_stride_a"
    b = f"{UNIT}, ldb, batch_stride_b" if lb == "row" else f"ldb, {UNIT}, batch_stride_b"
    d = f"ldd, {UNIT}, batch_stride_d" if lc == "row" else f"{UNIT}, ldd, batch_stride_d"
    assert f"args.mainloop.dA = StrideA{{cute::make_stride({a})}};" in text
    assert f"args.mainloop.dB = StrideB{{cute::make_stride({b})}};" in text
    assert f"args.epilogue.dD = StrideD{{cute::make_stride({d})}};" in text


def test_batch_is_the_l_mode():
    text = src(problem_batch=6)
    assert "using ProblemShape = cute::Shape<int, int, int, int>;" in text
    assert "ProblemShape{M, N, K, L}" in text
    assert "if (L != 6)" in text
    assert "if (L != " not in src(problem_batch="any")


def test_fixed_problem_dims_are_checked():
    text = src(problem_m=4096, problem_n="any", problem_k=512)
    assert "if (M != 4096)" in text and "if (K != 512)" in text
    assert "if (N != " not in text


def test_entry_points_named_after_the_kernel():
    text = src(name="my_gemm")
    for fn in ("l2c_my_gemm_run(", "l2c_my_gemm_workspace_size(", "l2c_my_gemm_last_error(",
               "l2c_my_gemm_stages(", "l2c_my_gemm_shared_memory_bytes("):
        assert fn in text
    assert 'extern "C" {' in text
    assert "Gemm::can_implement(args)" in text
    assert "query_device_multiprocessor_count" in text


def test_swap_hands_cutlass_the_transposed_problem():
    # D = A @ B with A, B, D row-major is D^T = B^T A^T with every operand column-major: CUTLASS's A is B.
    text = squash(src(tile_m=192, tile_n=128, cluster_m=2, launch_swap="yes", launch_schedule="cooperative",
                      epilogue_bias="row", swizzle_raster="n"))
    assert "using TileShape = cute::Shape<cute::_128, cute::_192, cute::_64>" in text
    assert "using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>" in text
    assert "using LayoutA = cutlass::layout::ColumnMajor; // B^T" in text
    assert "using LayoutB = cutlass::layout::ColumnMajor; // A^T" in text
    assert "using LayoutC = cutlass::layout::ColumnMajor; // D^T" in text
    assert "LinCombPerColBias" in text            # a bias per row of D is one per column of D^T
    assert "RasterOrderOptions::AlongM" in text    # raster n walks CUTLASS's M, which is the spec's N
    assert "args.problem_shape = ProblemShape{N, M, K, L};" in text
    assert "args.mainloop.ptr_A = static_cast<ElementA const*>(B);" in text
    assert "args.mainloop.dA = StrideA{cute::make_stride(cute::Int<1>{}, ldb, batch_stride_b)}" in text
    assert "args.mainloop.ptr_B = static_cast<ElementB const*>(A);" in text
    assert "args.mainloop.dB = StrideB{cute::make_stride(lda, cute::Int<1>{}, batch_stride_a)}" in text
    assert "args.epilogue.dD = StrideD{cute::make_stride(cute::Int<1>{}, ldd, batch_stride_d)}" in text


def test_call_path_never_allocates_or_synchronizes():
    text = src(split_k_slices=2, tile_m=128)
    for forbidden in ("cudaMalloc", "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaMemcpy("):
        assert forbidden not in text


def test_epilogue_smem_estimate_follows_cutlass_builder():
    # 128x256 cooperative, f16 row-major D: 128x32 sub-tiles (64-byte rows: 512-byte swizzle alignment), 8 of
    # them, 4 C-load stages of barriers. No C: 2 D buffers + the empty fusion storage's byte, padded.
    no_c = KernelSpec(tile_m=128, tile_n=256)
    assert cutlass_epilogue_smem(no_c, "cooperative") == 16896 + 512
    # C read into the same buffer (4 sub-tiles) and a staged per-column bias row
    with_c_bias = no_c.replace(epilogue_beta=1.0, epilogue_bias="col")
    assert cutlass_epilogue_smem(with_c_bias, "cooperative") == 4 * 128 * 32 * 2 + 256 * 2 + 512
    # pingpong 64x16 tile: a single 64x16 sub-tile with 32-byte rows (256-byte alignment)
    tiny = KernelSpec(tile_m=64, tile_n=16)
    assert cutlass_epilogue_smem(tiny, "pingpong") == 2560


# GemmKernel::SharedStorageSize and main-loop stages of kernels built with CUTLASS 4.2 (tests/test_cutlass_build.py)
MEASURED = [
    (dict(tile_m=128, tile_n=256, tile_k=64, cluster_n=2, epilogue_beta=0.5, epilogue_bias="col",
          epilogue_activation="gelu"), 4, 230400),
    (dict(types_a="bf16", types_b="bf16", types_c="f32", layout_a="col", layout_b="col", layout_c="col",
          tile_m=128, tile_n=128, tile_k=64, pipeline_stages=4, launch_schedule="pingpong"), 4, 149504),
    (dict(tile_m=256, tile_n=128, tile_k=64, layout_a="col", split_k_slices=3, epilogue_bias="row",
          epilogue_activation="silu"), 4, 214016),
    (dict(tile_m=128, tile_n=128, tile_k=128, cluster_m=2, layout_b="col", layout_c="col",
          split_k_mode="stream_k"), 3, 215040),
    (dict(tile_m=64, tile_n=16, tile_k=32, types_c="f32", epilogue_beta=1.0), 43, 229888),
    (dict(types_a="bf16", types_b="bf16", types_c="bf16", tile_m=64, tile_n=256, tile_k=64,
          launch_schedule="pingpong", layout_c="col", epilogue_bias="col"), 5, 215040),
    # session 7 (same CUTLASS 4.2 builds, read back from the libraries): the basic schedule keeps the main loop's and
    # the epilogue's tensors in one union; a narrow pingpong tile; the transposed problem (launch swap=yes)
    (dict(tile_m=64, tile_n=8, tile_k=64, cluster_n=4, launch_schedule="basic", epilogue_beta=0.5,
          epilogue_bias="col", epilogue_activation="relu"), 24, 221696),
    (dict(tile_m=64, tile_n=64, tile_k=128, launch_schedule="basic"), 6, 197120),
    (dict(tile_m=64, tile_n=16, tile_k=64, cluster_n=4, launch_schedule="pingpong"), 22, 228096),
    (dict(tile_m=192, tile_n=128, tile_k=64, cluster_n=2, launch_schedule="cooperative", launch_swap="yes",
          epilogue_alpha=0.75, epilogue_beta=0.5, epilogue_bias="row", epilogue_activation="gelu"), 4, 198656),
    (dict(tile_m=8, tile_n=64, tile_k=64, cluster_m=4, launch_schedule="pingpong", launch_swap="yes"), 24, 224256),
]


@pytest.mark.parametrize("knobs,stages,smem", MEASURED)
def test_validation_predicts_what_cutlass_instantiated(knobs, stages, smem):
    valid = validate(KernelSpec(**knobs), "cutlass")
    assert (valid.stages, valid.smem_bytes) == (stages, smem)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(valid_specs("cutlass"))
def test_every_valid_spec_renders(spec):
    valid = validate(spec, "cutlass")
    text = render(valid)
    assert spec.to_l2().splitlines()[0] in text
    assert f"int l2c_{spec.name}_run(" in text
    gemm = cutlass_gemm_spec(spec)   # transposed under launch swap=yes
    assert f"cute::_{gemm.tile_m}, cute::_{gemm.tile_n}, cute::_{gemm.tile_k}>" in text
    assert ("ProblemShape{N, M, K, L}" in text) == (spec.launch_swap == "yes")
    assert "{{" not in text and "{%" not in text
    assert text.count("{") == text.count("}")
