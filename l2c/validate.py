"""Validation: reject, before any compiler runs, a spec that cannot work on a target and architecture.

Each rule has a name; a rejection is an `L2ValidationError` naming file:line:col of the offending
knob, the knob and the rule. A spec that passes becomes a `ValidSpec`: the spec plus the values the
target resolved for `auto` knobs (stages, warps, schedule) and the shared memory it will use. Templates
only ever see a `ValidSpec`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .errors import L2ValidationError
from .ir import KernelSpec, knob
from .knobs import ANY, AUTO, DTYPE_BYTES, KNOBS, TARGETS


@dataclass(frozen=True)
class Arch:
    name: str
    smem_per_block: int     # bytes of shared memory one block may use (opt-in maximum)
    sm_count: int
    max_cluster: int        # portable thread-block cluster size


TMA_LOADS = ("tma", "tma_device")
# The longest file name built from a kernel name (a cache entry's temporary file: name, "_", a 24-digit hash,
# ".py", a random part and ".tmp") adds about 45 characters; 100 leaves room under 143-byte file-name limits.
MAX_NAME_LENGTH = 100
FP32_MAX = 3.4028234663852886e38
FP32_MIN_NORMAL = 1.1754943508222875e-38   # Triton `launch loads=` values that read A and B through tensor descriptors

ARCHS = {
    # H100/H200: 227 KB of shared memory per block, 132 SMs (H200 SXM), clusters of up to 8 portable.
    "sm_90": Arch("sm_90", smem_per_block=227 * 1024, sm_count=132, max_cluster=8),
}

# A gemv step's products per thread (tile m x n x k / threads): above this the products and the loaded slab spill out
# of registers (measured with Triton's compiler for sm_90, tests/test_triton_gemv.py).
GEMV_PRODUCTS_PER_THREAD = 128

# Each rule: name -> one-line statement shown with the rejection and listed by `l2c check --rules`.
RULES = {
    "target": "a spec that names a target is lowered only for that target",
    "target-knob": "a spec that names a target may not set knobs that target does not read",
    "arch": "the architecture must be one l2c knows (sm_90)",
    "same-input-types": "A and B must have the same element type",
    "acc-type": "an f16 accumulator needs f16 inputs; f32 inputs need an f32 accumulator",
    "split-k-slices": "split-K slices may not exceed the number of K tiles of a fixed K",
    "stream-k-target": "stream-K is a CUTLASS scheduler; Triton supports split_k modes workspace and atomic",
    "parallel-split-k-target": "split_k mode=parallel is a CUTLASS decomposition (a batched GEMM over the slices "
                               "and a reduction kernel); Triton's workspace mode already sums its slices in parallel",
    "parallel-split-k": "split_k mode=parallel runs a plain (unbatched) GEMM whose K splits into equal slices that "
                        "each start on a 16-byte boundary (K a multiple of slices x 16 bytes of A's elements), with "
                        "N a multiple of 4 (the fp32 partials are row-major and stored through TMA)",
    "triton-tma-loads": "Triton `launch loads=tma` or `tma_device` reads fp16 or fp32 A and B of a plain (unbatched) GEMM whose "
                        "contiguous extents are multiples of 16 bytes (not bf16: the CPU interpreter reads bf16 "
                        "through a descriptor wrongly, so such kernels could not be tested)",
    "shared-memory": "stages x (tile_m x tile_k + tile_k x tile_n) x element bytes (+ epilogue) must fit the "
                     "architecture's shared memory per block (a gated kernel loads two B tiles per stage)",
    "accumulator-registers": "the fp32 accumulator tile spread over the threads must fit in registers "
                             "(<= 256 values per thread for Triton, <= 128 per consumer thread for CUTLASS; a gated "
                             "kernel keeps two tiles)",
    "cutlass-dtypes": "the CUTLASS target takes f16 or bf16 inputs with an f32 accumulator",
    "wgmma-tile-m": "CUTLASS sm90 tile M must be 64, 128 or 256 (a warpgroup MMA is 64 rows)",
    "wgmma-tile-n": "CUTLASS sm90 tile N must be a multiple of 8 between 8 and 256 (a warpgroup MMA's N)",
    "triton-tile-pow2": "Triton tiles are powers of two (tl.arange) of at least 16 (tl.dot)",
    "cutlass-tile-k": "CUTLASS sm90 tile K must be 32, 64 or 128 elements (whole 64/128-byte swizzle atoms)",
    "cooperative-tile-m": "the cooperative schedule splits tile M over two warpgroups: tile M must be a "
                          "multiple of 128",
    "pingpong-tile-m": "the pingpong schedule gives each warpgroup a whole tile: tile M must be 64 or 128",
    "basic-tile-m": "the basic schedule gives its one consumer warpgroup the whole tile: tile M must be 64 or 128",
    "cluster-size": "cluster M x N may not exceed the portable cluster size of the architecture",
    "split-k-schedule": "split-K (modes workspace and atomic) and stream-K in CUTLASS use the stream-K tile "
                        "scheduler, which needs the cooperative schedule",
    "cutlass-min-stages": "the CUTLASS TMA pipeline needs at least 2 stages",
    "tma-alignment": "TMA needs every operand's contiguous extent to be a multiple of 16 bytes",
    "gemv-reduce": "`launch reduce` chooses how a gemv kernel sums over K; the gemm family reduces in tl.dot",
    "evict-loads": "`launch evict=first` hints Triton's pointer loads; TMA descriptor loads take no eviction hint",
    "gemv-target": "`launch family=gemv` is a Triton kernel family (CUDA-core multiply-adds, no tl.dot)",
    "gemv-tile-m": "a gemv kernel's tile m is 1, 2, 4, 8 or 16 rows (more rows belong on tensor cores)",
    "gemv-tile-pow2": "a gemv kernel's tile n and tile k are powers of two (tl.arange)",
    "gemv-registers": f"a gemv step multiplies tile m x tile n x tile k products spread over the program's threads: "
                      f"at most {GEMV_PRODUCTS_PER_THREAD} per thread ({GEMV_PRODUCTS_PER_THREAD // 2} with `launch "
                      f"reduce=end`, which keeps a running sum per product; a gated kernel's two slabs count twice), "
                      f"or the products and the loaded slab no longer fit in registers",
    "gemv-loads": "a gemv kernel reads A and B through pointers (`launch loads=pointer`)",
    "gemv-batch": "a gemv kernel serves a plain (unbatched) GEMM: problem batch=1",
    "gemv-persistent": "a gemv kernel launches one program per tile and K slice (`launch persistent=no`)",
    "gemv-acc": "a gemv kernel accumulates in f32 (its CUDA-core multiply-adds cost the same in f32)",
    "gated-target": "`epilogue gate` is lowered by the Triton kernels: CUTLASS's fused epilogue sees one accumulator "
                    "tile, in which the gate and up columns of an output column (N columns apart in B) never meet",
    "gated-epilogue": "a gated epilogue computes act(alpha * A@B_gate + bias_gate) * (alpha * A@B_up + bias_up): its "
                      "bias is per column (2N values: the gate's, then the up projection's) or none, it reads no C "
                      "input (beta=0) and takes no `activation` (the gate names it)",
    "gated-split-k": "a gated kernel runs its K loop in one program (split_k slices=1): its slices would reduce two "
                     "partial tiles, and its 2N weight columns already give the SMs many programs",
    "fp32-scalar": "epilogue alpha and beta are fp32 in the kernels: each must be finite in fp32 (|x| < 3.4e38) "
                   "and, unless 0, a normal fp32 number (|x| >= 1.18e-38), so that it neither overflows nor "
                   "rounds or flushes to 0",
    "name-length": f"a kernel name has at most {MAX_NAME_LENGTH} characters: it names cache and output files, "
                   "which with the hash, suffix and temporary parts added must stay under the 255-byte file-name "
                   "limit (143 on encrypted home folders)",
}


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

    @property
    def name(self) -> str:
        return self.spec.name


def _fail(spec: KernelSpec, knob_field: Optional[str], rule: str, message: str) -> L2ValidationError:
    line, col = spec.origin.position_of(knob_field) if knob_field else (spec.origin.line, spec.origin.col)
    knob_key = next((k.key for k in KNOBS if k.field == knob_field), None)
    return L2ValidationError(f"{message} — {RULES[rule]}", file=spec.origin.file, line=line, col=col,
                             knob=knob_key, rule=rule)


def gated(spec: KernelSpec) -> bool:
    """Whether the spec's epilogue is gated (`epilogue gate`): B holds the gate's and the up projection's columns."""
    return spec.epilogue_gate != "none"


def _mainloop_stage_bytes(spec: KernelSpec) -> int:
    ab = DTYPE_BYTES[spec.types_a]
    b_tiles = 2 if gated(spec) else 1   # a gated kernel loads the gate's and the up projection's tile of B
    return (spec.tile_m * spec.tile_k + b_tiles * spec.tile_k * spec.tile_n) * ab


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


def _cutlass_epilogue(spec: KernelSpec, schedule: str) -> Tuple[int, int, int]:
    """(tensor storage bytes, C-load pipeline stages, alignment) of the sm90 TMA epilogue (CUTLASS 4.2 builder).

    D is stored in (64 or 128) x 32 sub-tiles, double-buffered; when beta != 0, C (same type as D) is loaded
    into the same buffer, which then holds max(min(sub-tiles, 4), 3) sub-tiles; a per-column bias is staged
    through shared memory (one tile row). An empty fusion storage still takes a byte, hence an alignment unit.
    """
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


def parallel_split_k(spec: KernelSpec) -> bool:
    """Whether a CUTLASS spec runs its K slices as a batched GEMM plus a reduction kernel (mode=parallel)."""
    return spec.split_k_mode == "parallel" and spec.split_k_slices > 1


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
    if parallel_split_k(spec):
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
    barriers = CUTLASS_STAGE_BARRIER_BYTES * (stages + stages_c) + CUTLASS_KERNEL_BARRIER_BYTES
    aligned = max(alignment, 128)
    mainloop = stages * _mainloop_stage_bytes(spec)
    together = max(tensors, mainloop) if schedule == "basic" else tensors + mainloop
    return _round_up(_round_up(barriers, aligned) + together, aligned)


def _common_rules(spec: KernelSpec, target: str, arch: Arch) -> None:
    if len(spec.name) > MAX_NAME_LENGTH:
        raise _fail(spec, None, "name-length", f"kernel name of {len(spec.name)} characters")
    for field in ("epilogue_alpha", "epilogue_beta"):
        value = float(getattr(spec, field))
        if not (value == 0.0 or FP32_MIN_NORMAL <= abs(value) <= FP32_MAX):
            raise _fail(spec, field, "fp32-scalar", f"{field.split('_', 1)[1]}={value!r}")
    if spec.target not in ("any", target):
        raise _fail(spec, "target", "target", f"the spec is for {spec.target}, not {target}")
    if spec.target == target:
        for knob in KNOBS:
            if target not in knob.targets and getattr(spec, knob.field) != knob.default:
                raise _fail(spec, knob.field, "target-knob",
                            f"{knob.key} is read only by {', '.join(knob.targets)}; this spec is for {target}")
    if spec.types_a != spec.types_b:
        raise _fail(spec, "types_b", "same-input-types", f"A is {spec.types_a} but B is {spec.types_b}")
    if spec.types_acc == "f16" and spec.types_a != "f16":
        raise _fail(spec, "types_acc", "acc-type", f"accumulator f16 with {spec.types_a} inputs")
    if spec.split_k_mode != "stream_k" and spec.split_k_slices > 1 and spec.problem_k != ANY:
        k_tiles = -(-spec.problem_k // spec.tile_k)
        if spec.split_k_slices > k_tiles:
            raise _fail(spec, "split_k_slices", "split-k-slices",
                        f"{spec.split_k_slices} slices but K={spec.problem_k} has only {k_tiles} tiles of "
                        f"{spec.tile_k}")


def _validate_triton(spec: KernelSpec, arch: Arch) -> ValidSpec:
    if spec.split_k_mode == "stream_k":
        raise _fail(spec, "split_k_mode", "stream-k-target", "split_k mode=stream_k on Triton")
    if spec.split_k_mode == "parallel":
        raise _fail(spec, "split_k_mode", "parallel-split-k-target", "split_k mode=parallel on Triton")
    if spec.launch_evict != "normal" and spec.launch_loads in TMA_LOADS:
        raise _fail(spec, "launch_evict", "evict-loads", f"evict={spec.launch_evict} with loads={spec.launch_loads}")
    if gated(spec):
        _check_gated(spec)
    if spec.launch_family == "gemv":
        return _validate_triton_gemv(spec, arch)
    if spec.launch_reduce != "step":
        raise _fail(spec, "launch_reduce", "gemv-reduce", f"reduce={spec.launch_reduce} with family=gemm")
    if spec.launch_loads in TMA_LOADS:
        _check_triton_tma(spec)
    for field in ("tile_m", "tile_n", "tile_k"):
        size = getattr(spec, field)
        if size < 16 or size & (size - 1):
            raise _fail(spec, field, "triton-tile-pow2", f"{knob(field).key}={size}")
    acc_tile = spec.tile_m * spec.tile_n
    if spec.launch_warps == AUTO:
        warps = 8 if acc_tile >= 128 * 128 else 4
    else:
        warps = int(spec.launch_warps)
    per_thread = acc_tile * (2 if gated(spec) else 1) // (warps * 32)
    if per_thread > 256:
        raise _fail(spec, "launch_warps" if spec.launch_warps != AUTO else "tile_n", "accumulator-registers",
                    f"{'two ' if gated(spec) else ''}{spec.tile_m}x{spec.tile_n} accumulator{'s' if gated(spec) else ''} "
                    f"over {warps} warps {'are' if gated(spec) else 'is'} {per_thread} values per thread")
    stages, smem = _triton_stages(spec, arch)
    return ValidSpec(spec, "triton", arch, stages=stages, warps=warps, schedule="none", smem_bytes=smem)


def _check_gated(spec: KernelSpec) -> None:
    """What the gated epilogue of the Triton templates computes (the knob's doc): rules gated-epilogue, gated-split-k."""
    for field, allowed in (("epilogue_beta", (0.0,)), ("epilogue_activation", ("none",)),
                           ("epilogue_bias", ("none", "col"))):
        if getattr(spec, field) not in allowed:
            raise _fail(spec, field, "gated-epilogue",
                        f"{knob(field).key}={getattr(spec, field)} with gate={spec.epilogue_gate}")
    if spec.split_k_slices > 1:
        raise _fail(spec, "split_k_slices", "gated-split-k",
                    f"split_k slices={spec.split_k_slices} with gate={spec.epilogue_gate}")


def _triton_stages(spec: KernelSpec, arch: Arch) -> Tuple[int, int]:
    """(stages, shared memory bytes) of a Triton kernel: `auto` is the deepest of 4..1 stages that fits."""
    per_stage = _mainloop_stage_bytes(spec)
    if spec.pipeline_stages == AUTO:
        fitting = [s for s in (4, 3, 2, 1) if s * per_stage <= arch.smem_per_block]
        stages = fitting[0] if fitting else 1
    else:
        stages = int(spec.pipeline_stages)
    smem = stages * per_stage
    if smem > arch.smem_per_block:
        raise _fail(spec, "pipeline_stages" if spec.pipeline_stages != AUTO else "tile_k", "shared-memory",
                    f"{stages} stages x {per_stage} bytes = {smem} bytes > {arch.smem_per_block}")
    return stages, smem


def _validate_triton_gemv(spec: KernelSpec, arch: Arch) -> ValidSpec:
    """The gemv family (templates/triton/gemv.py.j2): what its kernel assumes."""
    if spec.launch_loads != "pointer":
        raise _fail(spec, "launch_loads", "gemv-loads", f"loads={spec.launch_loads} with family=gemv")
    if spec.problem_batch != 1:
        raise _fail(spec, "problem_batch", "gemv-batch", f"problem.batch={spec.problem_batch} with family=gemv")
    if spec.launch_persistent != "no":
        raise _fail(spec, "launch_persistent", "gemv-persistent", "persistent=yes with family=gemv")
    if spec.types_acc != "f32":
        raise _fail(spec, "types_acc", "gemv-acc", f"accumulator {spec.types_acc} with family=gemv")
    if spec.tile_m not in (1, 2, 4, 8, 16):
        raise _fail(spec, "tile_m", "gemv-tile-m", f"tile m={spec.tile_m}")
    for field in ("tile_n", "tile_k"):
        size = getattr(spec, field)
        if size & (size - 1):
            raise _fail(spec, field, "gemv-tile-pow2", f"{knob(field).key}={size}")
    warps = 4 if spec.launch_warps == AUTO else int(spec.launch_warps)
    products = spec.tile_m * spec.tile_n * spec.tile_k * (2 if gated(spec) else 1) // (warps * 32)
    # reduce=end keeps every product's running sum in a register besides the loaded slab: half the budget
    if products > (GEMV_PRODUCTS_PER_THREAD // 2 if spec.launch_reduce == "end" else GEMV_PRODUCTS_PER_THREAD):
        raise _fail(spec, "launch_warps" if spec.launch_warps != AUTO else "tile_k", "gemv-registers",
                    f"{spec.tile_m}x{spec.tile_n}x{spec.tile_k} products{' of two slabs' if gated(spec) else ''} "
                    f"over {warps} warps is {products} per thread"
                    + (" (reduce=end: at most half as many)" if spec.launch_reduce == "end" else ""))
    stages, smem = _triton_stages(spec, arch)
    return ValidSpec(spec, "triton", arch, stages=stages, warps=warps, schedule="none", smem_bytes=smem)


def _check_triton_tma(spec: KernelSpec) -> None:
    """What the Triton template's TMA loads assume (templates/triton/gemm.py.j2); a shape-generic kernel checks
    the row alignment of each call's operands instead (ValueError, so the dispatcher falls back)."""
    if spec.problem_batch != 1:
        raise _fail(spec, "problem_batch", "triton-tma-loads", f"loads={spec.launch_loads} with problem.batch={spec.problem_batch}")
    if spec.types_a not in ("f16", "f32"):
        raise _fail(spec, "types_a", "triton-tma-loads", f"loads={spec.launch_loads} with {spec.types_a} inputs")
    for field, _, extent, nbytes in _alignment_checks(spec)[:2]:   # A and B (the output is stored by pointer)
        if extent != ANY and (extent * nbytes) % 16:
            raise _fail(spec, field, "triton-tma-loads",
                        f"loads={spec.launch_loads} with {knob(field).key}={extent}: rows of {extent * nbytes} bytes")


def _alignment_checks(spec: KernelSpec) -> List[Tuple[str, str, object, int]]:
    """(knob field, operand, contiguous extent, element bytes) for each operand TMA reads or writes."""
    ab, cb = DTYPE_BYTES[spec.types_a], DTYPE_BYTES[spec.types_c]
    m, n, k = spec.problem_m, spec.problem_n, spec.problem_k
    return [
        ("problem_k" if spec.layout_a == "row" else "problem_m", "A", k if spec.layout_a == "row" else m, ab),
        ("problem_n" if spec.layout_b == "row" else "problem_k", "B", n if spec.layout_b == "row" else k, ab),
        ("problem_n" if spec.layout_c == "row" else "problem_m", "D", n if spec.layout_c == "row" else m, cb),
    ]


def _validate_cutlass(spec: KernelSpec, arch: Arch) -> ValidSpec:
    if spec.launch_family != "gemm":
        raise _fail(spec, "launch_family", "gemv-target", f"family={spec.launch_family} on CUTLASS")
    if gated(spec):
        raise _fail(spec, "epilogue_gate", "gated-target", f"gate={spec.epilogue_gate} on CUTLASS")
    if spec.types_a not in ("f16", "bf16") or spec.types_acc != "f32":
        raise _fail(spec, "types_a", "cutlass-dtypes", f"inputs {spec.types_a}, accumulator {spec.types_acc}")
    # The tile rules are CUTLASS's, so they apply to the GEMM it instantiates: under launch swap=yes, the spec's
    # tile N is CUTLASS's tile M. Rejections name the knob as the spec spells it.
    swap = spec.launch_swap == "yes"
    gemm = swapped_operands(spec) if swap else spec
    field = (lambda name: SWAPPED_FIELDS[name]) if swap else (lambda name: name)
    note = " (CUTLASS's tile M and N trade places under launch swap=yes)" if swap else ""
    tile_m, tile_n = (field(name).replace("_", " ") for name in ("tile_m", "tile_n"))   # as the spec spells them
    if gemm.tile_m not in (64, 128, 256):
        raise _fail(spec, field("tile_m"), "wgmma-tile-m", f"{tile_m}={gemm.tile_m}{note}")
    if gemm.tile_n % 8 or not 8 <= gemm.tile_n <= 256:
        raise _fail(spec, field("tile_n"), "wgmma-tile-n", f"{tile_n}={gemm.tile_n}{note}")
    if spec.tile_k not in (32, 64, 128):
        raise _fail(spec, "tile_k", "cutlass-tile-k", f"tile k={spec.tile_k}")
    schedule = spec.launch_schedule
    if schedule == AUTO:
        schedule = "cooperative" if gemm.tile_m % 128 == 0 else "pingpong"
    if schedule == "cooperative" and gemm.tile_m % 128:
        raise _fail(spec, field("tile_m"), "cooperative-tile-m",
                    f"{tile_m}={gemm.tile_m} with the cooperative schedule{note}")
    if schedule in ("pingpong", "basic") and gemm.tile_m not in (64, 128):
        raise _fail(spec, field("tile_m"), f"{schedule}-tile-m", f"{tile_m}={gemm.tile_m} with the {schedule} schedule{note}")
    consumer_threads = 256 if schedule == "cooperative" else 128
    per_thread = spec.tile_m * spec.tile_n // consumer_threads
    if per_thread > 128:
        raise _fail(spec, field("tile_n"), "accumulator-registers",
                    f"{spec.tile_m}x{spec.tile_n} over {consumer_threads} {schedule} consumer threads is "
                    f"{per_thread} accumulators per thread")
    if spec.cluster_m * spec.cluster_n > arch.max_cluster:
        raise _fail(spec, "cluster_n", "cluster-size",
                    f"cluster {spec.cluster_m}x{spec.cluster_n} > {arch.max_cluster}")
    parallel = parallel_split_k(spec)
    if ((spec.split_k_slices > 1 and not parallel) or spec.split_k_mode == "stream_k") and schedule != "cooperative":
        raise _fail(spec, "split_k_slices" if spec.split_k_slices > 1 else "split_k_mode", "split-k-schedule",
                    f"split_k mode={spec.split_k_mode} with the {schedule} schedule")
    if parallel:
        if spec.problem_batch != 1:
            raise _fail(spec, "problem_batch", "parallel-split-k",
                        f"split_k mode=parallel with problem.batch={spec.problem_batch}")
        step = spec.split_k_slices * 16 // DTYPE_BYTES[spec.types_a]
        if spec.problem_k != ANY and spec.problem_k % step:
            raise _fail(spec, "problem_k", "parallel-split-k",
                        f"K={spec.problem_k} is not a multiple of {spec.split_k_slices} slices x "
                        f"{16 // DTYPE_BYTES[spec.types_a]} elements")
        if spec.problem_n != ANY and spec.problem_n % 4:
            raise _fail(spec, "problem_n", "parallel-split-k", f"N={spec.problem_n} is not a multiple of 4")
    for knob_field, operand, extent, nbytes in _alignment_checks(spec):
        if extent != ANY and (extent * nbytes) % 16:
            raise _fail(spec, knob_field, "tma-alignment",
                        f"{operand}'s contiguous extent {extent} x {nbytes} bytes is not a multiple of 16")
    per_stage = _mainloop_stage_bytes(spec) + CUTLASS_STAGE_BARRIER_BYTES
    carve = cutlass_epilogue_smem(cutlass_gemm_spec(spec), schedule)
    if spec.pipeline_stages == AUTO:
        # CUTLASS's StageCountAutoCarveout: whole stages in what the epilogue leaves (128-byte granules).
        capacity = arch.smem_per_block // 128 * 128
        stages = (capacity - _round_up(carve, 128)) // per_stage
        if stages < 2:
            raise _fail(spec, "tile_k", "shared-memory",
                        f"not even 2 stages of {per_stage} bytes fit beside a {carve}-byte epilogue")
    else:
        stages = int(spec.pipeline_stages)
        if stages < 2:
            raise _fail(spec, "pipeline_stages", "cutlass-min-stages", f"stages={stages}")
    smem = cutlass_kernel_smem(cutlass_gemm_spec(spec), schedule, stages)
    if smem > arch.smem_per_block:
        raise _fail(spec, "pipeline_stages", "shared-memory",
                    f"{stages} stages x {per_stage} bytes beside a {carve}-byte epilogue, with barriers and "
                    f"alignment, is {smem} bytes > {arch.smem_per_block}")
    # Cooperative and pingpong run three warpgroups (one TMA producer, two MMA consumers); basic runs two.
    warps = 8 if schedule == "basic" else 12
    return ValidSpec(spec, "cutlass", arch, stages=stages, warps=warps, schedule=schedule, smem_bytes=smem)


def validate(spec: KernelSpec, target: str, arch: str = "sm_90") -> ValidSpec:
    """Check `spec` for `target` on `arch`; return the resolved ValidSpec or raise L2ValidationError."""
    if target not in TARGETS:
        raise L2ValidationError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}",
                                file=spec.origin.file, line=spec.origin.line, col=spec.origin.col)
    if arch not in ARCHS:
        raise _fail(spec, None, "arch", f"unknown architecture {arch!r}")
    arch_info = ARCHS[arch]
    _common_rules(spec, target, arch_info)
    if target == "triton":
        return _validate_triton(spec, arch_info)
    return _validate_cutlass(spec, arch_info)


def targets_for(spec: KernelSpec, requested: str = "all") -> Tuple[str, ...]:
    """The targets to lower a spec for: those its `target` knob allows (every target for `any`), narrowed to
    `requested` unless that is "all". Empty when the spec names a target other than the requested one."""
    allowed = TARGETS if spec.target == "any" else (spec.target,)
    return allowed if requested == "all" else tuple(t for t in allowed if t == requested)
