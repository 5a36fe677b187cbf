"""The CUTLASS target's gemv family (`launch family=gemv`, templates/cutlass/gemv.cu.j2): its rules and the block
geometry its template reads.

A few rows of A (the tokens) against a large B (the weight) are memory-bound: the weight is read once, and what
counts is bytes in flight and a short launch. The kernel is plain CUDA C++ built by the target's nvcc and called
through the same C entry points as its GEMMs, so it is prebuilt into the pack and served by the C++ call table
like them. Each block owns tile m rows of A, tile n output columns and one K slice; the slices of one column tile
are the blocks of a thread-block cluster, which add their partial sums through distributed shared memory in
slice order (one launch, no workspace, deterministic).

Two main loops, by where B is contiguous:
- B column-major (nn.Linear's weight, W = B^T row-major N x K): each warp owns tile n / warps rows of W and its 32
  lanes stride along K with 16-byte loads, tile k / 256 of them per row and step; the A values of a step are
  loaded once for all the warp's rows; the lanes' sums meet in warp shuffles.
- B row-major (`a @ b`): each thread owns 8 adjacent output columns and, per step, a chunk of 8 K rows (eight
  16-byte loads of B, one of A per row of A); tile n / 8 threads span the columns and tile k / 8 the K depth of a
  step, so the block has (tile n / 8) x (tile k / 8) threads; the chunks' sums meet in shuffles and shared memory.
  With `pipeline stages=S` (2-8) a step's loads go through a ring of S steps per thread in shared memory
  (cp.async) instead of straight into registers, so S - 1 steps are in flight while one is added: loaded into
  registers, ptxas issues each load just before its first use and a thread waits on several memory round trips
  per step (the loads of the ring cannot be moved past the wait for them).

With `launch cores=tensor` the products are mma.sync m16n8k16 (fp32 sums) with the weight on the MMA's 16-row side
and 8 tokens on its narrow side (tile m 8, or 16 as two MMAs per weight fragment). The fragments come straight from
16-byte loads: the sum over K does not care in which order K is visited, so each thread's loaded K elements are
given the fragment positions of its lane, in the same order for the weight and the tokens.
- B column-major: a warp owns 16 rows of W; per step each lane loads 8 contiguous K elements of two rows and of
  each token row, two MMAs' worth; tile k / 32 such loads per row and step (tile k 32-256).
- B row-major: a warp owns 64 columns (the fragment's 8 row groups x 8 columns: the tokens' fragment is indexed by
  row group too, so every row group must read the same K rows); per step each lane loads 8 columns of 4 K rows and
  pairs the rows' halves into MMA registers with byte permutes (4 MMAs, 16 K rows); tile k / 16 such steps (tile k
  16-128).
The block's warps split tile n into those warp tiles and K among the rest, added in warp order in shared memory.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...arch import Arch
from ...ir import KernelSpec, knob
from ...knobs import ANY, AUTO
from ...rules import ValidSpec, declare, fail

VECTOR = 8                  # elements of one 16-byte load of f16/bf16
COLUMN_STEP = 32 * VECTOR   # K elements a warp's lanes cover with one load each (B column-major)
# Registers a thread may plan for its sums and loaded values: below the 255 of sm_90, leaving room for addresses
# and loop state (tests/test_cutlass_gemv.py builds the largest admitted kernels and finds no spill). A block of
# more than 256 threads gets fewer (the 64K registers of an SM over its threads, `__launch_bounds__`): the same
# share of that limit.
GEMV_REGISTERS = 160
MAX_REGISTERS = 255          # per thread on sm_90
SM_REGISTERS = 64 * 1024     # per SM, what one block's threads share at most
STATIC_SMEM = 48 * 1024     # static shared memory of one block
RING_STAGES = range(2, 9)   # pipeline stages of the row-major CUDA-core ring
MAX_THREADS = 1024


def register_budget(threads: int) -> int:
    """Registers a thread of a `threads`-thread block may plan (GEMV_REGISTERS's share of its hardware limit)."""
    return GEMV_REGISTERS * min(MAX_REGISTERS, SM_REGISTERS // threads) // MAX_REGISTERS

MAX_ROW_TILES = 65535   # the grid's y extent: one row tile per grid row

RULES = declare({
    "gemv-cuda-operands": "a CUTLASS-target gemv kernel reads f16 or bf16 A (row-major) and B into an f32 "
                          "accumulator and writes a row-major D of a plain GEMM (problem batch=1)",
    "gemv-cuda-knobs": "a CUTLASS-target gemv kernel has no CUTLASS schedule, cluster or swap: launch "
                       "schedule=auto, swap=no and cluster 1x1 (its K slices form the cluster)",
    "gemv-cuda-stages": f"a CUTLASS-target gemv kernel's pipeline stages is auto (the weight loaded straight into "
                        f"registers) or, on CUDA cores with B row-major, {RING_STAGES[0]}-{RING_STAGES[-1]}: each "
                        f"thread's loads of B and A stream through a ring of that many steps in shared memory "
                        f"(cp.async), which with the partial sums must fit the block's shared memory",
    "gemv-cuda-tile-m": "a gemv kernel's tile m is 1, 2, 4, 8 or 16 rows (more rows belong on tensor cores); with "
                        "launch cores=tensor 8 or 16 (the MMA's narrow side, once or twice)",
    "gemv-cuda-tile-n": "a CUTLASS-target gemv kernel's tile n is a power of two from 8 to 256 columns, with "
                        "launch cores=tensor at least one warp tile (16 columns with B column-major, 64 row-major)",
    "gemv-cuda-tile-k": "a CUTLASS-target gemv kernel steps along K by 256 or 512 elements per row of a "
                        "column-major B (one or two 16-byte loads per lane), and by 8-512 (a power of two) "
                        "with a row-major B; with launch cores=tensor by 32-256 (column-major) or 16-128 "
                        "(row-major) per warp, a power of two",
    "gemv-cuda-threads": f"a CUTLASS-target gemv block has 64-{MAX_THREADS} threads: with B column-major its "
                         f"warps (auto: 4) split tile n (twice that when gated) into whole rows per warp; with B "
                         f"row-major it has (tile n / 8) x (tile k / 8) threads, which launch warps (if set) must "
                         f"equal; with launch cores=tensor its warps (auto: 4) are a whole number of warp tiles of "
                         f"tile n",
    "gemv-cuda-gated": "a gated CUTLASS-target gemv kernel (epilogue gate) runs on CUDA cores with B column-major: "
                       "each block reads the gate's rows of W = B^T for its tile n output columns and the up "
                       "projection's N rows further",
    "gemv-cuda-slices": "a CUTLASS-target gemv kernel's K slices are the blocks of one cluster: split_k slices is "
                        "1, 2, 4 or 8 (at most the portable cluster size) in mode=workspace (added in slice order)",
    "gemv-cuda-registers": f"a CUTLASS-target gemv thread's sums and loaded values must fit in "
                           f"{GEMV_REGISTERS} registers (tile m x the columns or rows of W it owns, plus its loads "
                           f"in flight), fewer in blocks of over 256 threads ({GEMV_REGISTERS} x the "
                           f"{SM_REGISTERS // 1024}K registers of an SM over the threads / {MAX_REGISTERS})",
    "gemv-cuda-shape": f"a CUTLASS-target gemv kernel reads 16-byte vectors along K and N and launches a row tile "
                       f"per grid row: a K or N the spec fixes is a multiple of 8, and a fixed M needs at most "
                       f"{MAX_ROW_TILES} row tiles of tile m",
    "gemv-cuda-smem": f"a CUTLASS-target gemv block's partial sums (tile m x tile n fp32, twice that when gated, "
                      f"per warp with B row-major) must fit {STATIC_SMEM // 1024} KB of static shared memory",
})


@dataclass(frozen=True)
class Geometry:
    """What templates/cutlass/gemv.cu.j2 reads: the block's shape, derived from the spec by `check`."""
    b_contiguous_k: bool   # B column-major: rows of W = B^T are contiguous along K
    threads: int
    warps: int
    rows_per_warp: int     # B column-major: rows of W each warp owns
    loads_per_row: int     # B column-major: 16-byte loads per lane, row and step
    column_threads: int    # B row-major: threads across tile n (8 columns each)
    depth_threads: int     # B row-major: threads along K (a chunk of 8 rows each)
    slices: int
    registers: int         # l2c's estimate per thread
    smem_bytes: int
    tensor: bool = False   # launch cores=tensor: mma.sync main loops
    warp_tiles: int = 0    # cores=tensor: warp tiles across tile n (16 rows of W, or 64 columns of a row-major B)
    k_warps: int = 0       # cores=tensor: warps per warp tile, splitting the K steps among them
    steps: int = 0         # cores=tensor: loads per row of W (32 K each) or row-major steps (16 K) per warp step
    token_groups: int = 0  # cores=tensor: MMAs per weight fragment (8 tokens each)
    warp_n: int = 0        # cores=tensor: columns of D per warp tile
    gated: bool = False    # epilogue gate (B column-major, CUDA cores): each block reads 2 x tile n rows of W
    stages: int = 0        # B row-major, CUDA cores: steps in each thread's shared-memory ring (0: no ring)
    ring_bytes: int = 0    # the ring's dynamic shared memory: stages x threads x (8 rows of B + tile m of A) x 16 B


def geometry(spec: KernelSpec) -> Geometry:
    """The block geometry of a gemv spec whose tiles passed the tile rules (see `check`)."""
    m, n, k = spec.tile_m, spec.tile_n, spec.tile_k
    if spec.launch_cores == "tensor":
        return _tensor_geometry(spec)
    if spec.layout_b == "col":
        warps = 4 if spec.launch_warps == AUTO else int(spec.launch_warps)
        gate = spec.epilogue_gate != "none"
        w_rows = 2 * n if gate else n   # a gated block reads the gate's rows and the up projection's
        rows = max(1, w_rows // warps)
        loads = k // COLUMN_STEP
        # sums m x rows, raw loads (rows + m) x loads x 4 words, one step's A as floats, one row's W as floats
        registers = m * rows + (rows + m) * loads * 4 + m * VECTOR + VECTOR
        return Geometry(True, warps * 32, warps, rows, loads, 0, 0, spec.split_k_slices, registers,
                        m * w_rows * 4, gated=gate)
    columns, depth = n // VECTOR, k // VECTOR
    threads = columns * depth
    # sums m x 8, eight raw B loads, m raw A loads, one B row as floats
    registers = m * VECTOR + VECTOR * 4 + m * 4 + VECTOR
    warps = max(1, threads // 32)
    stages = 0 if spec.pipeline_stages == AUTO else int(spec.pipeline_stages)
    return Geometry(False, threads, warps, 0, 0, columns, depth, spec.split_k_slices, registers,
                    (warps + 1) * m * n * 4, stages=stages, ring_bytes=stages * threads * (VECTOR + m) * 16)


TENSOR_WARP_N = {"col": 16, "row": 64}      # columns of D one warp's MMAs cover
TENSOR_STEP_K = {"col": 32, "row": 16}      # K elements of one load per row (col) / one step of 4 K rows (row)


def _tensor_geometry(spec: KernelSpec) -> Geometry:
    """cores=tensor: warps over warp tiles of tile n, then over K; registers for one warp step's loads."""
    layout = spec.layout_b
    warps = 4 if spec.launch_warps == AUTO else int(spec.launch_warps)
    warp_n = TENSOR_WARP_N[layout]
    warp_tiles = max(1, spec.tile_n // warp_n)
    steps = max(1, spec.tile_k // TENSOR_STEP_K[layout])
    groups = max(1, spec.tile_m // 8)
    if layout == "col":
        # a step's loads (two W rows' and the tokens') and their addresses, an MMA's 4 sums per token group
        registers = steps * (8 + 4 * groups) + steps * (2 + groups) + 4 * groups + 16
    else:
        # a step's loads (four B rows', the tokens' 8-byte ones), 16 paired registers, 4 MMAs' sums per group
        registers = steps * (16 + 2 * groups) + 16 + 16 * groups + 16
    smem = warps * spec.tile_m * warp_n * 4 + spec.tile_m * spec.tile_n * 4   # each warp's sums, then the tile's
    return Geometry(layout == "col", warps * 32, warps, 0, 0, 0, 0, spec.split_k_slices, registers, smem,
                    tensor=True, warp_tiles=warp_tiles, k_warps=max(1, warps // warp_tiles), steps=steps,
                    token_groups=groups, warp_n=warp_n)


def _check_tensor_tiles(spec: KernelSpec) -> None:
    """The cores=tensor tile rules (after the common gemv ones)."""
    layout = spec.layout_b
    if spec.tile_m not in (8, 16):
        raise fail(spec, "tile_m", "gemv-cuda-tile-m", f"tile m={spec.tile_m} with cores=tensor")
    if spec.tile_n < TENSOR_WARP_N[layout]:
        raise fail(spec, "tile_n", "gemv-cuda-tile-n", f"tile n={spec.tile_n} with cores=tensor and B "
                                                       f"{'column' if layout == 'col' else 'row'}-major")
    lo, hi = (32, 256) if layout == "col" else (16, 128)
    if spec.tile_k & (spec.tile_k - 1) or not lo <= spec.tile_k <= hi:
        raise fail(spec, "tile_k", "gemv-cuda-tile-k", f"tile k={spec.tile_k} with cores=tensor")


def check(spec: KernelSpec, arch: Arch) -> ValidSpec:
    """The gemv family's rules on the CUTLASS target (common rules already passed); its ValidSpec."""
    if spec.types_a not in ("f16", "bf16") or spec.types_acc != "f32":
        raise fail(spec, "types_a", "gemv-cuda-operands", f"inputs {spec.types_a}, accumulator {spec.types_acc}")
    for field in ("layout_a", "layout_c"):
        if getattr(spec, field) != "row":
            raise fail(spec, field, "gemv-cuda-operands", f"{knob(field).key}={getattr(spec, field)}")
    if spec.problem_batch != 1:
        raise fail(spec, "problem_batch", "gemv-cuda-operands", f"problem.batch={spec.problem_batch}")
    if spec.epilogue_gate != "none" and (spec.launch_cores != "cuda" or spec.layout_b != "col"):
        raise fail(spec, "launch_cores" if spec.launch_cores != "cuda" else "layout_b", "gemv-cuda-gated",
                   f"gate={spec.epilogue_gate} with cores={spec.launch_cores} and B {spec.layout_b}-major")
    for field, default in (("launch_schedule", AUTO), ("launch_swap", "no"), ("cluster_m", 1), ("cluster_n", 1)):
        if getattr(spec, field) != default:
            raise fail(spec, field, "gemv-cuda-knobs", f"{knob(field).key}={getattr(spec, field)} with family=gemv")
    if spec.pipeline_stages != AUTO and (spec.launch_cores != "cuda" or spec.layout_b != "row"
                                         or int(spec.pipeline_stages) not in RING_STAGES):
        raise fail(spec, "pipeline_stages", "gemv-cuda-stages", f"pipeline stages={spec.pipeline_stages} with "
                                                                f"cores={spec.launch_cores} and B "
                                                                f"{spec.layout_b}-major")
    if spec.tile_m not in (1, 2, 4, 8, 16):
        raise fail(spec, "tile_m", "gemv-cuda-tile-m", f"tile m={spec.tile_m}")
    if spec.tile_n & (spec.tile_n - 1) or not 8 <= spec.tile_n <= 256:
        raise fail(spec, "tile_n", "gemv-cuda-tile-n", f"tile n={spec.tile_n}")
    if spec.launch_cores == "tensor":
        _check_tensor_tiles(spec)
    elif spec.layout_b == "col":
        if spec.tile_k not in (256, 512):
            raise fail(spec, "tile_k", "gemv-cuda-tile-k", f"tile k={spec.tile_k} with B column-major")
    elif spec.tile_k & (spec.tile_k - 1) or not 8 <= spec.tile_k <= 512:
        raise fail(spec, "tile_k", "gemv-cuda-tile-k", f"tile k={spec.tile_k} with B row-major")
    for field in ("problem_k", "problem_n"):   # what the kernel's check_shape refuses at every call
        if getattr(spec, field) != ANY and getattr(spec, field) % VECTOR:
            raise fail(spec, field, "gemv-cuda-shape", f"{knob(field).key}={getattr(spec, field)}")
    if spec.problem_m != ANY and -(-spec.problem_m // spec.tile_m) > MAX_ROW_TILES:
        raise fail(spec, "problem_m", "gemv-cuda-shape", f"problem m={spec.problem_m} at tile m={spec.tile_m}")
    slices = spec.split_k_slices
    if slices not in (1, 2, 4, 8) or slices > arch.max_cluster or spec.split_k_mode != "workspace":
        raise fail(spec, "split_k_slices" if spec.split_k_mode == "workspace" else "split_k_mode", "gemv-cuda-slices",
                   f"split_k slices={slices} mode={spec.split_k_mode}")
    shape = geometry(spec)
    if shape.tensor:
        if shape.warps % shape.warp_tiles:
            raise fail(spec, "launch_warps" if spec.launch_warps != AUTO else "tile_n", "gemv-cuda-threads",
                       f"{shape.warps} warps over {shape.warp_tiles} warp tiles of tile n={spec.tile_n}")
    elif spec.layout_b == "col":
        if shape.rows_per_warp * shape.warps != spec.tile_n * (2 if shape.gated else 1):
            raise fail(spec, "launch_warps" if spec.launch_warps != AUTO else "tile_n", "gemv-cuda-threads",
                       f"tile n={spec.tile_n}{' (twice: gated)' if shape.gated else ''} over {shape.warps} warps")
    elif spec.launch_warps != AUTO and int(spec.launch_warps) * 32 != shape.threads:
        raise fail(spec, "launch_warps", "gemv-cuda-threads",
                   f"warps={spec.launch_warps} but tile n={spec.tile_n} and tile k={spec.tile_k} make "
                   f"{shape.threads} threads")
    if shape.threads % 32 or not 64 <= shape.threads <= MAX_THREADS:
        raise fail(spec, "tile_k" if spec.layout_b == "row" else "launch_warps", "gemv-cuda-threads",
                   f"{shape.threads} threads per block")
    if shape.registers > register_budget(shape.threads):
        raise fail(spec, "tile_m", "gemv-cuda-registers",
                   f"tile m={spec.tile_m}, tile n={spec.tile_n}, tile k={spec.tile_k} plan {shape.registers} "
                   f"registers per thread of {shape.threads} (at most {register_budget(shape.threads)})")
    if shape.smem_bytes > STATIC_SMEM:
        raise fail(spec, "tile_n", "gemv-cuda-smem", f"{shape.smem_bytes} bytes of partial sums")
    if shape.smem_bytes + shape.ring_bytes > arch.smem_per_block:
        raise fail(spec, "pipeline_stages", "gemv-cuda-stages",
                   f"a ring of {shape.ring_bytes} bytes and {shape.smem_bytes} of partial sums (at most "
                   f"{arch.smem_per_block})")
    return ValidSpec(spec, "cutlass", arch, stages=max(1, shape.stages), warps=shape.warps, schedule="gemv",
                     smem_bytes=shape.smem_bytes + shape.ring_bytes)
