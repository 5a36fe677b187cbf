"""Real nvcc builds of CUTLASS kernels (CPU only: they compile for sm_90a, nothing runs).

A handful of specs chosen to cover the three schedules, clusters, fused epilogues (bias, activations, C input),
split-K (scheduler and parallel) and stream-K, bf16 and an f32 output, all-column-major / mixed layouts, a narrow
tile and the transposed problem (launch swap=yes), also as a decoding tile whose stages=auto the rules round down.
They compile through `build_many` with two workers, so in nvcc runs of several kernels each (about 10-20 s of one
core per kernel; 35-50 s for a kernel alone), into a fresh cache directory, so the test really compiles. Skipped only
when nvcc is absent.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from l2c.targets.cutlass.build import BATCH_SIZE, batch_source, build_many, compile_many, compile_source, plan_batches
from l2c.targets.cutlass.kernel import CutlassKernel
from l2c.targets.cutlass.toolchain import forbidden_ptxas_warnings
from l2c.errors import BuildError
from l2c.ir import KernelSpec
from l2c.lower import render
from l2c.targets.cutlass.rules import cutlass_gemm_spec
from l2c.validate import validate
from tests.toolchain import needs_nvcc


pytestmark = needs_nvcc

SPECS = [
    # cooperative, cluster 1x2, fused C + per-column bias + GELU, CUTLASS-sized stages
    KernelSpec(name="coop_fused", tile_m=128, tile_n=256, tile_k=64, cluster_n=2, launch_schedule="cooperative",
               epilogue_beta=0.5, epilogue_bias="col", epilogue_activation="gelu"),
    # pingpong, bf16 in / f32 out, all column-major, fixed stages, ReLU, raster along N, shape-generic batch
    KernelSpec(name="pp_colmajor", types_a="bf16", types_b="bf16", types_c="f32", layout_a="col",
               layout_b="col", layout_c="col", tile_m=128, tile_n=128, tile_k=64, pipeline_stages=4,
               launch_schedule="pingpong", swizzle_raster="n", swizzle_group=4, problem_batch="any",
               epilogue_activation="relu"),
    # split-K (deterministic workspace reduction), A column-major, per-row bias + SiLU
    KernelSpec(name="splitk_rowbias", tile_m=256, tile_n=128, tile_k=64, launch_schedule="cooperative",
               layout_a="col", split_k_slices=3, split_k_mode="workspace", epilogue_bias="row",
               epilogue_activation="silu"),
    # stream-K, cluster 2x1, B and C column-major, alpha scaling, deep K tile
    KernelSpec(name="streamk_nt", tile_m=128, tile_n=128, tile_k=128, cluster_m=2, launch_schedule="cooperative",
               layout_b="col", layout_c="col", split_k_mode="stream_k", epilogue_alpha=2.0),
    # parallel split-K (batched slices + reduction kernel), pingpong, cluster 1x2, bf16, C and D column-major with
    # beta, per-row bias + SiLU
    KernelSpec(name="parallel_pp", types_a="bf16", types_b="bf16", types_c="bf16", tile_m=64, tile_n=128,
               tile_k=64, cluster_n=2, launch_schedule="pingpong", layout_b="col", layout_c="col",
               split_k_slices=4, split_k_mode="parallel", epilogue_alpha=0.5, epilogue_beta=-1.0,
               epilogue_bias="row", epilogue_activation="silu"),
    # the basic (non-persistent) schedule on a narrow 64x8 tile, cluster 1x4, fused C + per-column bias + ReLU
    KernelSpec(name="basic_narrow", tile_m=64, tile_n=8, tile_k=64, cluster_n=4, launch_schedule="basic",
               epilogue_beta=0.5, epilogue_bias="col", epilogue_activation="relu"),
    # launch swap=yes: the transposed problem with a 192-row tile along M, cluster along N, C + per-row bias + GELU
    KernelSpec(name="swap_192", tile_m=192, tile_n=128, tile_k=64, cluster_n=2, launch_schedule="cooperative",
               launch_swap="yes", epilogue_beta=0.5, epilogue_bias="row", epilogue_activation="gelu"),
    # a swapped decoding tile in `a @ b` (an 8-wide K-major B tile 64 deep): stages=auto rounded down to an
    # even count (rule narrow-b-stages; CUTLASS's own 13 does not compile)
    KernelSpec(name="swap_mn_major_a", tile_m=8, tile_n=128, tile_k=64, launch_schedule="basic", launch_swap="yes"),
    # epilogue store=direct (no shared memory in the epilogue): cooperative with a C input (the stages it frees),
    # and a swapped 8-wide decoding tile (K-major: its 25 stages rounded down, rule narrow-b-stages) under parallel
    # split-K whose per-column bias the reduction kernel applies
    KernelSpec(name="coop_direct", tile_m=128, tile_n=128, tile_k=64, cluster_n=2, launch_schedule="cooperative",
               layout_c="col", epilogue_beta=1.0, epilogue_store="direct"),
    KernelSpec(name="swap_direct_parallel", tile_m=8, tile_n=64, tile_k=64, launch_schedule="basic",
               launch_swap="yes", layout_b="col", split_k_slices=2, split_k_mode="parallel", epilogue_bias="col",
               epilogue_store="direct"),
    # the pingpong schedule with the direct store at a stage count where the empty C-load pipeline's slot shows
    KernelSpec(name="pp_direct", types_a="bf16", types_b="bf16", types_c="bf16", tile_m=64, tile_n=64, tile_k=64,
               pipeline_stages=4, launch_schedule="pingpong", layout_b="col", epilogue_store="direct"),
    # epilogue store=staged (l2c's epilogue: the tile through shared memory, 16-byte stores): cooperative 256-row
    # tile with C, a per-column bias and GELU, cluster 1x2; pingpong bf16 with D column-major, a batch, a per-row
    # bias and ReLU; a swapped 8-wide decoding tile under parallel split-K (fp32 partials, lines along CUTLASS's M)
    # whose bias the reduction applies; a 256-wide tile (staged in column halves) under CUTLASS's stream-K scheduler;
    # a 208-wide tile (13 MMAs of 16 columns: staged whole)
    KernelSpec(name="coop_staged", tile_m=256, tile_n=128, tile_k=64, cluster_n=2, launch_schedule="cooperative",
               epilogue_beta=1.0, epilogue_alpha=0.5, epilogue_bias="col", epilogue_activation="gelu",
               epilogue_store="staged"),
    KernelSpec(name="pp_staged_colmajor", types_a="bf16", types_b="bf16", types_c="bf16", tile_m=128, tile_n=128,
               tile_k=64, launch_schedule="pingpong", layout_c="col", problem_batch="any", epilogue_bias="row",
               epilogue_activation="relu", epilogue_store="staged"),
    KernelSpec(name="swap_staged_parallel", tile_m=8, tile_n=64, tile_k=64, launch_schedule="basic",
               launch_swap="yes", layout_b="col", split_k_slices=2, split_k_mode="parallel", epilogue_bias="col",
               epilogue_store="staged"),
    KernelSpec(name="streamk_staged", tile_m=128, tile_n=256, tile_k=64, launch_schedule="cooperative",
               split_k_mode="stream_k", epilogue_activation="silu", epilogue_store="staged"),
    KernelSpec(name="pp_staged_208", tile_m=64, tile_n=208, tile_k=64, launch_schedule="pingpong",
               epilogue_store="staged"),
    # the gated GEMM (epilogue gate: B's gate and up columns in one tile through GatedMainloop's nested TMA layout,
    # act(gate) * up in the staged epilogue): cooperative 128 x (2 x 128), cluster 2x1, bf16, a bias and GeGLU; the
    # basic schedule's 64 x (2 x 48) with SwiGLU and alpha
    KernelSpec(name="coop_gated", types_a="bf16", types_b="bf16", types_c="bf16", tile_m=128, tile_n=128,
               tile_k=64, cluster_m=2, launch_schedule="cooperative", layout_b="col", epilogue_bias="col",
               epilogue_gate="gelu_tanh", epilogue_store="staged"),
    KernelSpec(name="basic_gated_48", tile_m=64, tile_n=48, tile_k=64, launch_schedule="basic", layout_b="col",
               epilogue_alpha=0.5, epilogue_gate="silu", epilogue_store="staged"),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    os.environ["L2C_CACHE_DIR"] = str(tmp_path_factory.mktemp("l2c-cache"))
    valids = [validate(spec, "cutlass") for spec in SPECS]
    start = time.perf_counter()
    results = build_many(valids, workers=2)
    elapsed = time.perf_counter() - start
    print(f"\nbuild_many: {len(valids)} CUTLASS kernels in {elapsed:.0f} s")
    yield valids, results
    del os.environ["L2C_CACHE_DIR"]


@pytest.mark.parametrize("index", range(len(SPECS)), ids=[s.name for s in SPECS])
def test_kernel_compiles_cleanly(built, index):
    valids, results = built
    kernel = results[index]
    assert isinstance(kernel, CutlassKernel), f"{SPECS[index].name}: {kernel}"
    assert kernel.path.is_file() and kernel.path.suffix == ".so"
    assert kernel.source == render(valids[index])
    # l2c's validation predicts what CUTLASS instantiates: the stage count exactly, shared memory from above.
    assert kernel.stages == valids[index].stages
    assert kernel.shared_memory_bytes <= valids[index].smem_bytes <= kernel.shared_memory_bytes + 512
    assert kernel.shared_memory_bytes <= valids[index].arch.smem_per_block


def test_no_kernel_spills_to_local_memory(built):
    """cuobjdump's resource report (the copy Triton ships) of every built library: no kernel function keeps a stack
    frame or local memory, l2c's staged epilogue beside the largest accumulator tiles (128 per thread) included."""
    import re
    import subprocess
    from pathlib import Path
    import triton
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.is_file():
        pytest.skip("no cuobjdump in this Triton")
    _, results = built
    for spec, kernel in zip(SPECS, results):
        report = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(kernel.path)], capture_output=True,
                                text=True, check=True).stdout
        usage = re.findall(r"STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", report)
        assert usage and all(stack == local == "0" for stack, local in usage), f"{spec.name}: {report}"


def test_the_staged_epilogue_s_blocks_are_where_the_mma_holds_them(tmp_path):
    """tests/data/staged_layout_check.cu, compiled by nvcc and run on the host: for the warpgroup MMAs CUTLASS's
    builder picks (three schedules, tiles 8-256 wide, 208-240 among them), every tile element is held by one
    consumer thread once, an MMA step along M is the block of rows the staged epilogue writes for it, and the halves
    of each thread's values are the halves of the columns where it stages a tile in halves (96, 128, 192, 256), value
    v + half in value v's row half a tile further (the gate's and the up projection's columns a gated tile pairs)."""
    import subprocess
    from pathlib import Path
    from l2c.targets.cutlass.toolchain import cutlass_include_dirs, find_nvcc
    source = Path(__file__).parent / "data" / "staged_layout_check.cu"
    binary = tmp_path / "staged_layout_check"
    done = subprocess.run([find_nvcc(), "-O1", "-std=c++17", "--expt-relaxed-constexpr",
                           "-gencode=arch=compute_90a,code=sm_90a",
                           *(f"-I{d}" for d in cutlass_include_dirs()), str(source), "-o", str(binary)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    run = subprocess.run([str(binary)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.count(" ok\n") == 26, run.stdout


def test_the_gated_gemm_reads_the_gate_s_and_the_up_projection_s_rows_into_one_tile(tmp_path):
    """tests/data/gated_b_layout_check.cu, compiled by nvcc with a rendered gated kernel (tile n 48: CUTLASS's tile
    96 wide) and run on the host: its main loop's nested view of B, tiled as CUTLASS tiles it, puts the gate's rows
    [n * 48, (n + 1) * 48) in the first half of tile n and the up projection's N + those rows in the second, for
    several N, K and leading dimensions (the TMA box itself is cute's, built from the same layout)."""
    import subprocess
    from pathlib import Path
    from l2c.targets.cutlass.toolchain import cutlass_include_dirs, find_nvcc
    spec = KernelSpec(name="gated_layout_48", tile_m=128, tile_n=48, tile_k=64, launch_schedule="cooperative",
                      layout_b="col", epilogue_gate="silu", epilogue_store="staged")
    kernel = tmp_path / "gated_layout_48.cu"
    kernel.write_text(render(validate(spec, "cutlass")))
    binary = tmp_path / "gated_b_layout_check"
    done = subprocess.run([find_nvcc(), "-O1", "-std=c++17", "--expt-relaxed-constexpr",
                           "-gencode=arch=compute_90a,code=sm_90a", f'-DL2C_KERNEL_SOURCE="{kernel}"',
                           *(f"-I{d}" for d in cutlass_include_dirs()),
                           str(Path(__file__).parent / "data" / "gated_b_layout_check.cu"), "-o", str(binary)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    run = subprocess.run([str(binary)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.count(": ok\n") == 3, run.stdout


def test_the_overlap_switch_follows_l2c_overlap_when_a_library_is_loaded(built, monkeypatch):
    """L2C_OVERLAP when a library is loaded decides whether it launches with programmatic dependent launch (the
    switch is one flag per kernel: a later load sets it again; by default the basic schedule's GEMMs do, but not
    with parallel split-K), and CUTLASS compiled its grid-dependency wait into every GEMM kernel of the batched
    libraries (stream-K and split-K included), and the basic schedule's trigger after its main loop."""
    import subprocess
    from pathlib import Path
    import triton
    valids, results = built
    for valid, kernel in zip(valids, results):
        measured = valid.schedule == "basic" and valid.spec.split_k_mode != "parallel"
        assert kernel.set_overlap(False) == measured, valid.name   # as loaded, L2C_OVERLAP unset
        for value, on in (("all", True), ("0", False), ("measured", measured)):
            monkeypatch.setenv("L2C_OVERLAP", value)
            CutlassKernel(valid, kernel.source, kernel.path)
            assert kernel.set_overlap(False) == on, value
        monkeypatch.delenv("L2C_OVERLAP")
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    gemms = {}   # SASS of each CUTLASS GEMM kernel function in the libraries
    for path in sorted({str(kernel.path.resolve()) for kernel in results}):
        sass = subprocess.run([str(cuobjdump), "-sass", path], capture_output=True, text=True, check=True).stdout
        for function in sass.split("Function : ")[1:]:
            name = function.split(None, 1)[0]
            if "13device_kernel" in name:
                gemms[name] = function
    assert len(gemms) == len(SPECS)
    for name, function in gemms.items():
        assert "ACQBULK" in function, name    # griddepcontrol.wait
        basic = "Pingpong" not in name and "Cooperative" not in name
        assert ("PREEXIT" in function) == basic, name   # griddepcontrol.launch_dependents


def test_rebuild_is_a_cache_hit(built):
    valids, results = built
    start = time.perf_counter()
    again = compile_source(render(valids[0]), valids[0].name)
    assert time.perf_counter() - start < 5
    assert again == results[0].path


def test_broken_source_is_a_build_error_with_the_compiler_message(tmp_path, monkeypatch):
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    valid = validate(KernelSpec(name="broken", tile_m=128, tile_n=128), "cutlass")
    source = render(valid).replace("using ElementA = cutlass::half_t;", "using ElementA = cutlass::no_such_type;")
    with pytest.raises(BuildError) as err:
        compile_source(source, "broken")
    assert "no_such_type" in str(err.value) and "error" in str(err.value)
    # compile_many returns the failure as a value (cached since), and build_many never raises
    returned = compile_many([(source, "broken")])[0]
    assert isinstance(returned, BuildError) and "no_such_type" in str(returned)
    results = build_many([dataclasses.replace(valid, target="triton")], workers=1)
    assert isinstance(results[0], BuildError) and "not cutlass" in str(results[0])


def test_kernels_built_in_one_nvcc_run_share_one_library(built):
    """Two workers for the kernels: nvcc runs of at most BATCH_SIZE kernels (`plan_batches`), each publishing one
    library under every member's cache name, holding every member's entry points."""
    valids, results = built
    runs = {}
    for valid, kernel in zip(valids, results):
        runs.setdefault(os.stat(kernel.path).st_ino, []).append(valid.name)
    planned = plan_batches([valid.name for valid in valids], workers=2)
    assert len(planned) == max(2, -(-len(SPECS) // BATCH_SIZE))
    assert sorted(map(len, runs.values())) == sorted(map(len, planned))
    for kernel in results:
        library = ctypes.CDLL(str(kernel.path))
        for name in runs[os.stat(kernel.path).st_ino]:
            assert getattr(library, f"l2c_{name}_run") and getattr(library, f"l2c_{name}_stages")


_TINY = '#include <cstdio>\nextern "C" int l2c_{name}_answer(void) {{ return {value}; }}\n'


def test_a_failing_kernel_in_a_batch_gets_the_verdict_it_gets_alone(tmp_path, monkeypatch):
    """A run that fails is split until the failing kernel is alone: it gets the compiler's message and a cached
    failure, the others their libraries. Tiny sources (no CUTLASS) keep each nvcc run to a few seconds."""
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("L2C_PACK", str(tmp_path / "no-pack.zip"))
    sources = [(_TINY.format(name="good_a", value=42), "good_a"),
               (_TINY.format(name="bad_b", value="no_such_name"), "bad_b"),
               (_TINY.format(name="good_c", value=43), "good_c")]
    reported = {}
    outcomes = compile_many(sources, workers=1, done=lambda i, outcome, kernels: reported.setdefault(i, kernels))
    good_a, bad_b, good_c = outcomes
    assert isinstance(bad_b, BuildError) and "no_such_name" in str(bad_b) and "bad_b" in str(bad_b)
    assert list(tmp_path.glob("cutlass/bad_b_*.failed.txt"))
    assert ctypes.CDLL(str(good_a)).l2c_good_a_answer() == 42
    assert ctypes.CDLL(str(good_c)).l2c_good_c_answer() == 43
    # the run takes them in name order (bad_b, good_a, good_c) and splits into bad_b and the two others
    assert reported == {0: 2, 1: 1, 2: 2} and os.path.samefile(good_a, good_c)
    # a batch that builds: one library for both, each member's entry point in it
    again = compile_many([(_TINY.format(name="good_d", value=44), "good_d"),
                          (_TINY.format(name="good_e", value=45), "good_e")], workers=1)
    assert os.path.samefile(*again)
    library = ctypes.CDLL(str(again[0]))
    assert (library.l2c_good_d_answer(), library.l2c_good_e_answer()) == (44, 45)
    assert compile_many([sources[0], sources[0]]) == [good_a, good_a]   # cache hits, asked twice


def test_the_batch_source_includes_each_kernel_once_in_its_own_namespace():
    sources = [("k1", "k1.cu", '#include <cstdio>\n#include "cute/tensor.hpp"\nint x;\n'),
               ("k2", "k2.cu", '#include <cstdio>\n#include <cstdint>\nint x;\n')]
    text = batch_source(sources)
    assert text.count("#include <cstdio>") == 1 and '#include "cute/tensor.hpp"' in text and "<cstdint>" in text
    assert text.index("<cstdint>") < text.index("namespace l2c_k1")
    assert 'namespace l2c_k1 {\n#include "k1.cu"\n}' in text and 'namespace l2c_k2 {\n#include "k2.cu"\n}' in text


@settings(max_examples=200, deadline=None)
@given(names=st.lists(st.sampled_from([f"k{i}" for i in range(30)]), max_size=80), workers=st.integers(1, 20))
def test_batches_use_every_worker_and_never_hold_a_name_twice(names, workers):
    batches = plan_batches(names, workers)
    assert sorted(i for batch in batches for i in batch) == list(range(len(names)))
    assert all(1 <= len(batch) <= BATCH_SIZE for batch in batches)
    assert all(len({names[i] for i in batch}) == len(batch) for batch in batches)
    assert len(batches) >= min(workers, len(names))


def test_c751x_ptxas_warnings_are_detected():
    output = ("ptxas info    : Compiling entry function '_ZN7cutlass13device_kernel'\n"
              "ptxas warning : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized "
              "due to the presence of Extern calls in the function '_ZN7cutlass13device_kernel'.\n"
              "ptxas info    : Used 168 registers\n")
    assert forbidden_ptxas_warnings(output) == [output.splitlines()[1]]
    assert forbidden_ptxas_warnings("ptxas info    : Used 90 registers, C7500 bytes\n") == []


def test_planned_calls_reach_the_real_entry_point_through_the_shim(built):
    """The call-plan shim (l2c.targets.cutlass.shim) against a real generated library: the same statuses and messages as
    the 20-argument entry called directly (no GPU here: a bad shape fails in check_shape, a good one at the
    first CUDA call)."""
    import ctypes

    from l2c.targets.cutlass import shim as cutlass_shim
    if cutlass_shim.planned_call() is None:
        pytest.skip("no host C compiler for the shim")
    kernel = built[1][0]
    assert kernel._run_planned is not None
    for sizes in ((0, 64, 64, 1), (64, 64, 64, 1)):
        arguments = (*sizes, 64, 4096, 64, 4096, 64, 4096, 64, 4096, 0, 0)
        direct = kernel._run(16, 32, None, None, 48, *arguments, 0)
        direct_error = kernel._error(direct)
        plan = cutlass_shim.make_plan(kernel._run, arguments)
        shimmed = kernel._run_planned(ctypes.addressof(plan), 16, 32, None, 48, None, 0)
        assert shimmed == direct != 0
        assert kernel._error(shimmed) == direct_error
    assert "must be positive" in kernel._error(kernel._run_planned(
        ctypes.addressof(cutlass_shim.make_plan(kernel._run, (0, 1, 1, 1, *[1] * 8, 0, 0))), 16, 32, None, 48, None, 0))


def _cutlass_log_swizzle(blocks_m: int, blocks_n: int, max_swizzle: int) -> int:
    """CUTLASS 4.2's PersistentTileSchedulerSm90Params::get_log_swizzle_size, restated."""
    low = min(blocks_m, blocks_n)
    for log, need_swizzle, need_blocks in ((3, 8, 6), (2, 4, 3), (1, 2, 2)):
        if max_swizzle >= need_swizzle and low >= need_blocks:
            return log
    return 0


def _tiles_run(spec: KernelSpec, m: int, n: int, max_swizzle: int):
    """(tiles CUTLASS's persistent scheduler runs, tiles the problem has after the cluster's rounding) for a call of
    m x n (tile_scheduler_params.h: each tile count rounded up to a multiple of swizzle x cluster); a gated call's
    problem is m x 2n in tiles twice tile n wide."""
    gemm = cutlass_gemm_spec(spec)
    if spec.launch_swap == "yes":
        m, n = n, m
    if spec.epilogue_gate != "none":
        n *= 2
    up = lambda x, to: -(-x // to) * to   # noqa: E731
    blocks_m, blocks_n = up(-(-m // gemm.tile_m), gemm.cluster_m), up(-(-n // gemm.tile_n), gemm.cluster_n)
    swizzle = 1 << _cutlass_log_swizzle(blocks_m, blocks_n, max_swizzle)
    return up(blocks_m, swizzle * gemm.cluster_m) * up(blocks_n, swizzle * gemm.cluster_n), blocks_m * blocks_n


@settings(max_examples=300, deadline=None)
@given(m=st.integers(1, 40000), n=st.integers(1, 40000))
def test_persistent_kernels_take_the_largest_swizzle_that_runs_no_padded_tile(built, m, n):
    """The swizzle each built library chooses per call (its exported `_swizzle`): a power of two up to the spec's
    group under which CUTLASS's scheduler runs exactly the tiles the clusters need, and the largest such."""
    for valid, kernel in zip(*built):
        group = min(8, valid.spec.swizzle_group)
        chosen = kernel.swizzle(m, n)
        if valid.schedule == "basic":   # one block per tile, no persistent scheduler: the spec's group as it is
            assert chosen == group
            continue
        assert 1 <= chosen <= group and chosen & (chosen - 1) == 0
        run, needed = _tiles_run(valid.spec, m, n, chosen)
        assert run == needed
        larger = chosen * 2
        while larger <= group:
            assert _tiles_run(valid.spec, m, n, larger)[0] > needed
            larger *= 2


def test_swizzle_examples_from_the_h200_screens(built):
    """12288 x 256 on the swapped 192 x 128 tile with a 2-CTA cluster: 2 x 64 tiles, which the default group 8 ran
    as 4 x 64 (the screens measured it at 0.47-0.69x of cuBLAS, against 0.92-1.0x without the cluster)."""
    kernels = {valid.spec.name: kernel for valid, kernel in zip(*built)}
    assert kernels["swap_192"].swizzle(12288, 256) == 1
    assert _tiles_run(kernels["swap_192"].valid.spec, 12288, 256, 8) == (256, 128)
    assert kernels["swap_192"].swizzle(12288, 2048) == 8
    assert kernels["coop_fused"].swizzle(4096, 4096) == 8
    assert kernels["coop_fused"].swizzle(1100, 4096) == 1   # 9 tiles along M: any swizzle pads them


def test_nvcc_version_is_asked_once_per_binary_and_remembered_in_the_cache(tmp_path, monkeypatch):
    """The toolchain id's `nvcc --version` is kept in the cache for that binary (resolved path, size, modification
    time): a later process reads it without running nvcc; a binary that changed is asked again."""
    import shutil
    from l2c.targets.cutlass import toolchain
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    nvcc = toolchain.find_nvcc()
    monkeypatch.setattr(toolchain, "_versions", {})
    first = toolchain.nvcc_version(nvcc)
    assert first.startswith("nvcc: NVIDIA")
    ran = []
    real_run = toolchain.subprocess.run
    monkeypatch.setattr(toolchain.subprocess, "run", lambda *a, **kw: ran.append(a) or real_run(*a, **kw))
    monkeypatch.setattr(toolchain, "_versions", {})            # a new process: only the cache remembers
    assert toolchain.nvcc_version(nvcc) == first and not ran
    copy = tmp_path / "bin" / "nvcc"
    copy.parent.mkdir()
    shutil.copy2(os.path.realpath(nvcc), copy)
    os.utime(copy, ns=(1, 1))                                   # another binary: asked again
    monkeypatch.setattr(toolchain, "_versions", {})
    try:
        toolchain.nvcc_version(str(copy))
    except BuildError:
        pass   # a copied nvcc may not find its toolkit; what matters is that it was run
    assert ran


@needs_nvcc
def test_a_compiler_run_killed_for_want_of_memory_is_not_a_cached_verdict(tmp_path, monkeypatch):
    """nvcc exits 255 when the out-of-memory killer takes its front end (and fails alike on a full disk): that
    failure is the machine's, not the kernel's, so it is not cached and a later build tries again; a compiler error
    in the source is cached."""
    import shutil
    from l2c.targets.cutlass.toolchain import find_nvcc
    real = find_nvcc()
    fake = tmp_path / "nvcc"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then exec {shutil.which(real) or real} "$@"; fi\n'
                    f'echo "nvcc error   : \'cicc\' died due to signal 9 (Kill signal)" >&2\nexit 255\n')
    fake.chmod(0o755)
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("L2C_PACK", str(tmp_path / "no-pack.zip"))
    monkeypatch.setenv("L2C_NVCC", str(fake))
    with pytest.raises(BuildError, match="died due to signal"):
        compile_source(_TINY.format(name="killed", value=1), "killed")
    assert not list((tmp_path / "cache").glob("cutlass/killed_*.failed.txt"))
    monkeypatch.setenv("L2C_NVCC", real)
    with pytest.raises(BuildError, match="no_such_name"):
        compile_source(_TINY.format(name="wrong", value="no_such_name"), "wrong")
    assert list((tmp_path / "cache").glob("cutlass/wrong_*.failed.txt"))


@needs_nvcc
def test_a_compiler_run_failed_by_the_environment_is_not_a_cached_verdict(tmp_path, monkeypatch):
    """With no host compiler on PATH nvcc exits 1 ('nvcc fatal: Failed to preprocess host compiler properties'):
    the setup's failure, not the kernel's, so nothing is cached and the kernel builds once the setup is fixed."""
    from l2c.targets.cutlass.toolchain import find_nvcc
    real = os.path.realpath(find_nvcc())
    if open(real, "rb").read(2) == b"#!":   # a wrapper script: the compiler it runs
        real = next(line.split()[1] for line in open(real) if line.startswith("exec "))
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("L2C_PACK", str(tmp_path / "no-pack.zip"))
    monkeypatch.setenv("L2C_NVCC", real)
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(BuildError, match="nvcc fatal"):
        compile_source(_TINY.format(name="nogcc", value=1), "nogcc")
    assert not list((tmp_path / "cache").glob("cutlass/nogcc_*.failed.txt"))
