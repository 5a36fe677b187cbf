"""The CUTLASS target's rules: CUTLASS 4.2's sm90 warp-specialized GEMM (tiles, schedules, clusters, split-K,
TMA alignment), its shared-memory model, and the GEMM it instantiates for a spec."""
from __future__ import annotations

import math
from typing import Tuple

from ...arch import Arch
from ...ir import KernelSpec, knob
from ...knobs import ANY, AUTO, DTYPE_BYTES
from ...rules import ValidSpec, alignment_checks, declare, fail, gated, mainloop_stage_bytes
from . import gemv

RULES = declare({
    "parallel-split-k": "split_k mode=parallel runs a plain (unbatched) GEMM whose K splits into equal slices that "
                        "each start on a 16-byte boundary (K a multiple of slices x 16 bytes of A's elements), with "
                        "N a multiple of 4 (the fp32 partials are row-major and stored through TMA)",
    "cutlass-dtypes": "the CUTLASS target takes f16 or bf16 inputs with an f32 accumulator",
    "wgmma-tile-m": "CUTLASS sm90 tile M must be 64, 128 or 256 (a warpgroup MMA is 64 rows)",
    "wgmma-tile-n": "CUTLASS sm90 tile N must be a multiple of 8 between 8 and 256 (a warpgroup MMA's N)",
    "cutlass-tile-k": "CUTLASS sm90 tile K must be 32, 64 or 128 elements (whole 64/128-byte swizzle atoms)",
    "cooperative-tile-m": "the cooperative schedule splits tile M over two warpgroups: tile M must be a "
                          "multiple of 128",
    "pingpong-tile-m": "the pingpong schedule gives each warpgroup a whole tile: tile M must be 64 or 128",
    "basic-tile-m": "the basic schedule gives its one consumer warpgroup the whole tile: tile M must be 64 or 128",
    "cluster-size": "cluster M x N may not exceed the portable cluster size of the architecture",
    "split-k-schedule": "split-K (modes workspace and atomic) and stream-K in CUTLASS use the stream-K tile "
                        "scheduler, which needs the cooperative schedule",
    "cutlass-min-stages": "the CUTLASS TMA pipeline needs at least 2 stages",
    "gemv-knobs": "launch warps, launch evict and launch cores shape a gemv kernel; CUTLASS's GEMMs (family=gemm) "
                  "read none of them",
    "gated-gemm": "a gated CUTLASS GEMM (epilogue gate) reads tile n columns of the gate's and the same of the up "
                  "projection's into one tile of 2 x tile n columns, which one warpgroup MMA spans (tile n 48, 64, 96 "
                  "or 128), and pairs them in l2c's epilogue (store=staged): B column-major (the weights' rows), D "
                  "row-major, no launch swap, split-K or stream-K; N must be a multiple of tile n",
    "tma-alignment": "TMA needs every operand's contiguous extent to be a multiple of 16 bytes",
    "narrow-b-stages": "CUTLASS 4.2 cannot stage an 8-wide K-major B tile (B column-major, or A row-major under "
                       "launch swap=yes) 32 or 64 deep along K in an odd number of stages (cute's Shape Divisibility "
                       "Condition at compile time: 5, 7, 13 and 25 stages fail, whichever A's major; a 16-wide or "
                       "MN-major B tile, or tile K 128, builds at odd counts); `stages=auto` is rounded down to an "
                       "even count there",
    "direct-store": "`epilogue store=direct` is CUTLASS's epilogue without shared memory, which computes alpha * A@B "
                    "+ beta * C only: no bias or activation in the GEMM (under split_k mode=parallel the reduction "
                    "kernel applies them), and only a GEMM reads it (a gemv kernel stores its own way)",
    "staged-store": "`epilogue store=staged` is l2c's epilogue for CUTLASS's GEMM kernels: only a GEMM reads it (a "
                    "gemv kernel stores its own way)",
})


# Shared memory layout of CUTLASS 4.2's sm90 warp-specialized GEMM (GemmKernel::SharedStorage), modelled so
# that validation predicts the stage count CUTLASS instantiates and the kernel's shared memory (checked
# against built kernels in tests/test_cutlass_build.py):
#   [barriers: main loop, C load, load order, scheduler | padded to the tensor alignment]
#   [epilogue tensors: C/D sub-tile buffers + fusion storage | padded to the D swizzle alignment]
#   [main-loop stages of A and B tiles]
CUTLASS_STAGE_BARRIER_BYTES = 16      # full + empty barrier of one TMA pipeline stage
CUTLASS_KERNEL_BARRIER_BYTES = 64     # load-order, math-order (pingpong) and tile-scheduler state


def _round_up(x: int, to: int) -> int:
    return -(-x // to) * to


def _swizzle_alignment(contiguous_bytes: int) -> int:
    """Shared-memory alignment CUTLASS gives a TMA buffer: that of the widest swizzle atom dividing its rows."""
    for width, alignment in ((128, 1024), (64, 512), (32, 256)):
        if contiguous_bytes % width == 0:
            return alignment
    return 128


# Tile widths one warpgroup MMA spans whole (CUTLASS's builder takes an MMA as wide as the tile; 112, 144-176 and
# 208-240 take several narrower ones along N): there the staged epilogue writes the tile in column halves, the first
# half of each thread's values being the tile's first half of columns, which keeps its shared memory at or under the
# TMA store's on the tiles the tables use (a 128-wide tile of fp32 partial sums whole would cost a pipeline stage).
STAGED_HALVES_TILE_N = (96, 128, 192, 256)


def staged_column_halves(tile_n: int) -> int:
    """How many column blocks the staged epilogue writes a tile `tile_n` wide in (templates/cutlass/gemm.cu.j2)."""
    return 2 if tile_n in STAGED_HALVES_TILE_N else 1


def _cutlass_epilogue(spec: KernelSpec, schedule: str) -> Tuple[int, int, int]:
    """(tensor storage bytes, C-load pipeline stages, alignment) of the sm90 TMA epilogue (CUTLASS 4.2 builder).

    D is stored in (64 or 128) x 32 sub-tiles, double-buffered; when beta != 0, C (same type as D) is loaded
    into the same buffer, which then holds max(min(sub-tiles, 4), 3) sub-tiles; a per-column bias is staged
    through shared memory (one tile row). An empty fusion storage still takes a byte, hence an alignment unit.
    `store=direct` (CUTLASS's epilogue without shared memory) keeps only that unit and loads C through no pipeline;
    `store=staged` holds one step of the warpgroup MMA along M at a time (64 rows, 128 under the cooperative
    schedule), half its columns where one MMA spans the tile (`staged_column_halves`), in D's type, each line along
    D's contiguous dimension padded by 16 bytes (templates/cutlass/gemm.cu.j2, StagedEpilogue), and loads C through
    no pipeline either.
    """
    if spec.epilogue_store == "direct":
        return 128, 0, 128
    if spec.epilogue_store == "staged":
        rows = min(spec.tile_m, 128 if schedule == "cooperative" else 64)
        columns = spec.tile_n // staged_column_halves(spec.tile_n)
        contiguous, lines = (columns, rows) if spec.layout_c == "row" else (rows, columns)
        return _round_up(lines * (contiguous * DTYPE_BYTES[spec.types_c] + 16), 128), 0, 128
    epi_m = min(spec.tile_m, 128 if schedule == "cooperative" else 64)
    epi_n = math.gcd(min(32, spec.tile_n), spec.tile_n)
    subtiles = (spec.tile_m // epi_m) * (spec.tile_n // epi_n)
    stages_d = min(subtiles, 2)
    c_bytes = DTYPE_BYTES[spec.types_c]
    if spec.epilogue_beta != 0.0:
        stages_c = max(min(subtiles, 4), stages_d + 1)
        buffers = stages_c
    else:
        stages_c = min(subtiles, 4)
        buffers = stages_d
    alignment = _swizzle_alignment((epi_n if spec.layout_c == "row" else epi_m) * c_bytes)
    fusion = spec.tile_n * c_bytes if spec.epilogue_bias == "col" else 1
    tensors = _round_up(buffers * epi_m * epi_n * c_bytes + fusion, alignment)
    return tensors, stages_c, alignment


_FLIP = {"row": "col", "col": "row"}
# Knob pairs that trade places when CUTLASS computes D^T = B^T A^T (launch swap=yes).
SWAPPED_FIELDS = {"tile_m": "tile_n", "tile_n": "tile_m", "cluster_m": "cluster_n", "cluster_n": "cluster_m",
                  "problem_m": "problem_n", "problem_n": "problem_m", "types_a": "types_b", "types_b": "types_a",
                  "layout_a": "layout_b", "layout_b": "layout_a"}


def swapped_operands(spec: KernelSpec) -> KernelSpec:
    """The transposed problem D^T (N x M) = B^T A^T that `launch swap=yes` hands CUTLASS: the SWAPPED_FIELDS pairs
    trade places, the raster order and the bias direction turn with them, and each operand's storage order flips,
    because a row-major matrix is its transpose stored column-major."""
    traded = {field: getattr(spec, other) for field, other in SWAPPED_FIELDS.items()}
    traded.update(layout_a=_FLIP[spec.layout_b], layout_b=_FLIP[spec.layout_a], layout_c=_FLIP[spec.layout_c])
    return spec.replace(**traded, swizzle_raster={"m": "n", "n": "m"}[spec.swizzle_raster],
                        epilogue_bias=_FLIP.get(spec.epilogue_bias, spec.epilogue_bias), launch_swap="no")


def cutlass_gemm_spec(spec: KernelSpec) -> KernelSpec:
    """The GEMM CUTLASS instantiates for `spec`: with parallel split-K, the one that writes each slice's fp32
    partial sums (row-major, no epilogue inputs; the reduction kernel applies the spec's epilogue); with
    `launch swap=yes`, that GEMM transposed (`swapped_operands`)."""
    gemm = spec
    if gated(spec):   # one tile of B holds tile n of the gate's columns and tile n of the up projection's
        gemm = gemm.replace(tile_n=2 * spec.tile_n, epilogue_gate="none")
    if spec.parallel_split_k:
        gemm = gemm.replace(types_c="f32", layout_c="row", epilogue_alpha=1.0, epilogue_beta=0.0,
                            epilogue_bias="none", epilogue_activation="none")
    return swapped_operands(gemm) if spec.launch_swap == "yes" else gemm


def cutlass_epilogue_smem(spec: KernelSpec, schedule: str) -> int:
    """sizeof(CollectiveEpilogue::SharedStorage): what `StageCountAutoCarveout` subtracts before sizing stages."""
    tensors, stages_c, alignment = _cutlass_epilogue(spec, schedule)
    return _round_up(tensors + CUTLASS_STAGE_BARRIER_BYTES * stages_c, alignment)


def cutlass_kernel_smem(spec: KernelSpec, schedule: str, stages: int) -> int:
    """GemmKernel::SharedStorageSize of the sm90 kernel with `stages` main-loop stages. The basic (non-persistent)
    kernel keeps the main loop's and the epilogue's tensors in one union, since one never runs beside the other;
    the persistent kernels overlap a tile's epilogue with the next tile's loads, so they need both."""
    tensors, stages_c, alignment = _cutlass_epilogue(spec, schedule)
    # an epilogue with no C-load stages (store=direct) still takes a 16-byte slot for its empty pipeline storage
    barriers = CUTLASS_STAGE_BARRIER_BYTES * (stages + max(stages_c, 1)) + CUTLASS_KERNEL_BARRIER_BYTES
    aligned = max(alignment, 128)
    mainloop = stages * mainloop_stage_bytes(spec)
    together = max(tensors, mainloop) if schedule == "basic" else tensors + mainloop
    return _round_up(_round_up(barriers, aligned) + together, aligned)


GATED_TILE_N = tuple(n // 2 for n in STAGED_HALVES_TILE_N)


def _check_gated_gemm(spec: KernelSpec) -> None:
    """Rule gated-gemm: what the gated CUTLASS GEMM (templates/cutlass/gemm.cu.j2, GatedMainloop) is built for."""
    def reject(field, detail):
        return fail(spec, field, "gated-gemm", f"{detail} with gate={spec.epilogue_gate}")
    if spec.tile_n not in GATED_TILE_N:
        raise reject("tile_n", f"tile n={spec.tile_n}")
    for field, wanted in (("epilogue_store", "staged"), ("layout_b", "col"), ("layout_c", "row"),
                          ("launch_swap", "no")):
        if getattr(spec, field) != wanted:
            raise reject(field, f"{knob(field).key}={getattr(spec, field)}")
    if spec.split_k_slices > 1 or spec.split_k_mode == "stream_k":
        raise reject("split_k_slices" if spec.split_k_slices > 1 else "split_k_mode",
                     f"split_k slices={spec.split_k_slices} mode={spec.split_k_mode}")
    if spec.problem_n != ANY and spec.problem_n % spec.tile_n:
        raise reject("problem_n", f"N={spec.problem_n} and tile n={spec.tile_n}")


def check(spec: KernelSpec, arch: Arch) -> ValidSpec:
    """The CUTLASS target's rules for `spec` (common rules already passed); its ValidSpec with the schedule,
    the stage count CUTLASS instantiates and the kernel's shared memory."""
    if gated(spec) and spec.launch_family != "gemv":
        _check_gated_gemm(spec)
    if spec.epilogue_store != "tma" and spec.launch_family == "gemv":
        raise fail(spec, "epilogue_store", f"{spec.epilogue_store}-store",
                   f"store={spec.epilogue_store} with family=gemv")
    if spec.epilogue_store == "direct":
        fused = cutlass_gemm_spec(spec)   # the epilogue the GEMM itself runs (its bias turned under swap=yes)
        for field in ("epilogue_bias", "epilogue_activation"):
            if getattr(fused, field) != "none":
                raise fail(spec, field, "direct-store", f"{knob(field).key}={getattr(spec, field)} with store=direct")
    if spec.launch_family == "gemv":
        return gemv.check(spec, arch)
    if spec.target == "cutlass":   # a spec for both targets keeps its Triton knobs, which CUTLASS ignores
        for field, default in (("launch_warps", AUTO), ("launch_evict", "normal"), ("launch_cores", "cuda")):
            if getattr(spec, field) != default:
                raise fail(spec, field, "gemv-knobs", f"{field.replace('_', ' ')}={getattr(spec, field)} with "
                                                      f"family=gemm")
    if spec.types_a not in ("f16", "bf16") or spec.types_acc != "f32":
        raise fail(spec, "types_a", "cutlass-dtypes", f"inputs {spec.types_a}, accumulator {spec.types_acc}")
    # The tile rules are CUTLASS's, so they apply to the GEMM it instantiates: under launch swap=yes, the spec's
    # tile N is CUTLASS's tile M. Rejections name the knob as the spec spells it.
    swap = spec.launch_swap == "yes"
    gemm = cutlass_gemm_spec(spec)
    field = (lambda name: SWAPPED_FIELDS[name]) if swap else (lambda name: name)
    note = " (CUTLASS's tile M and N trade places under launch swap=yes)" if swap else ""
    tile_m, tile_n = (field(name).replace("_", " ") for name in ("tile_m", "tile_n"))   # as the spec spells them
    if gemm.tile_m not in (64, 128, 256):
        raise fail(spec, field("tile_m"), "wgmma-tile-m", f"{tile_m}={gemm.tile_m}{note}")
    if gemm.tile_n % 8 or not 8 <= gemm.tile_n <= 256:
        raise fail(spec, field("tile_n"), "wgmma-tile-n", f"{tile_n}={gemm.tile_n}{note}")
    if spec.tile_k not in (32, 64, 128):
        raise fail(spec, "tile_k", "cutlass-tile-k", f"tile k={spec.tile_k}")
    schedule = spec.launch_schedule
    if schedule == AUTO:
        schedule = "cooperative" if gemm.tile_m % 128 == 0 else "pingpong"
    if schedule == "cooperative" and gemm.tile_m % 128:
        raise fail(spec, field("tile_m"), "cooperative-tile-m",
                    f"{tile_m}={gemm.tile_m} with the cooperative schedule{note}")
    if schedule in ("pingpong", "basic") and gemm.tile_m not in (64, 128):
        raise fail(spec, field("tile_m"), f"{schedule}-tile-m", f"{tile_m}={gemm.tile_m} with the {schedule} schedule{note}")
    consumer_threads = 256 if schedule == "cooperative" else 128
    per_thread = gemm.tile_m * gemm.tile_n // consumer_threads
    if per_thread > 128:
        raise fail(spec, field("tile_n"), "accumulator-registers",
                    f"{spec.tile_m}x{spec.tile_n} over {consumer_threads} {schedule} consumer threads is "
                    f"{per_thread} accumulators per thread")
    if spec.cluster_m * spec.cluster_n > arch.max_cluster:
        raise fail(spec, "cluster_n", "cluster-size",
                    f"cluster {spec.cluster_m}x{spec.cluster_n} > {arch.max_cluster}")
    parallel = spec.parallel_split_k
    if ((spec.split_k_slices > 1 and not parallel) or spec.split_k_mode == "stream_k") and schedule != "cooperative":
        raise fail(spec, "split_k_slices" if spec.split_k_slices > 1 else "split_k_mode", "split-k-schedule",
                    f"split_k mode={spec.split_k_mode} with the {schedule} schedule")
    if parallel:
        if spec.problem_batch != 1:
            raise fail(spec, "problem_batch", "parallel-split-k",
                        f"split_k mode=parallel with problem.batch={spec.problem_batch}")
        step = spec.split_k_slices * 16 // DTYPE_BYTES[spec.types_a]
        if spec.problem_k != ANY and spec.problem_k % step:
            raise fail(spec, "problem_k", "parallel-split-k",
                        f"K={spec.problem_k} is not a multiple of {spec.split_k_slices} slices x "
                        f"{16 // DTYPE_BYTES[spec.types_a]} elements")
        if spec.problem_n != ANY and spec.problem_n % 4:
            raise fail(spec, "problem_n", "parallel-split-k", f"N={spec.problem_n} is not a multiple of 4")
    for knob_field, operand, extent, nbytes in alignment_checks(spec):
        if extent != ANY and (extent * nbytes) % 16:
            raise fail(spec, knob_field, "tma-alignment",
                        f"{operand}'s contiguous extent {extent} x {nbytes} bytes is not a multiple of 16")
    per_stage = mainloop_stage_bytes(spec) + CUTLASS_STAGE_BARRIER_BYTES
    carve = cutlass_epilogue_smem(gemm, schedule)
    # CUTLASS's B operand (K x N) is K-major when column-major: the spec's B, or under swap=yes its A row-major.
    stage_group = 2 if gemm.layout_b == "col" and gemm.tile_n == 8 and spec.tile_k in (32, 64) else 1
    pinned = False
    if spec.pipeline_stages == AUTO:
        # CUTLASS's StageCountAutoCarveout: whole stages in what the epilogue leaves (128-byte granules).
        capacity = arch.smem_per_block // 128 * 128
        stages = (capacity - _round_up(carve, 128)) // per_stage
        if stages % stage_group:   # the template then names the count (rule narrow-b-stages)
            stages, pinned = stages // stage_group * stage_group, True
        if stages < 2:
            raise fail(spec, "tile_k", "shared-memory",
                        f"not even 2 stages of {per_stage} bytes fit beside a {carve}-byte epilogue")
    else:
        stages = int(spec.pipeline_stages)
        if stages < 2:
            raise fail(spec, "pipeline_stages", "cutlass-min-stages", f"stages={stages}")
        if stages % stage_group:
            raise fail(spec, "pipeline_stages", "narrow-b-stages",
                        f"stages={stages} with tile k={spec.tile_k} and an 8-wide K-major B tile")
    smem = cutlass_kernel_smem(gemm, schedule, stages)
    if smem > arch.smem_per_block:
        raise fail(spec, "pipeline_stages", "shared-memory",
                    f"{stages} stages x {per_stage} bytes beside a {carve}-byte epilogue, with barriers and "
                    f"alignment, is {smem} bytes > {arch.smem_per_block}")
    # Cooperative and pingpong run three warpgroups (one TMA producer, two MMA consumers); basic runs two.
    warps = 8 if schedule == "basic" else 12
    return ValidSpec(spec, "cutlass", arch, stages=stages, warps=warps, schedule=schedule, smem_bytes=smem,
                     stages_pinned=pinned)
