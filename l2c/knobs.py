"""The knob table: the single definition of every tunable of an l2c kernel spec.

One row per knob. From this table come: the grammar (`grammar/l2.lark` is generated from it and a
test checks the committed file is current), the IR fields (`KernelSpec` has one field per knob,
named `Knob.field`), range checks while building the IR, the canonical printer, the targets that
read a knob, and the search space. Adding a knob means one row here plus its use in a template.

Value kinds:
- ``enum``: one of ``choices`` (spelled literally in the grammar, so an LLM can only write these);
- ``int``: a whole number in ``choices`` (when given) or in ``[lo, hi]``;
- ``dim``: a problem dimension, a positive whole number or ``any`` (shape-generic kernel);
- ``auto_int``: a whole number in ``choices`` or ``auto`` (let the target decide);
- ``float``: a real number (epilogue scalars).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

TARGETS = ("triton", "cutlass")
MAX_DIM = 2 ** 31 - 1   # problem sizes: the kernels take M, N, K and batch as 32-bit ints
ANY = "any"     # spelling of an open problem dimension
AUTO = "auto"   # spelling of "let the target choose"


@dataclass(frozen=True)
class Knob:
    section: str                 # statement keyword in the DSL, e.g. "tile"
    name: str                    # key inside the statement, e.g. "m"; "" for one-value statements
    kind: str                    # enum | int | dim | auto_int | float
    default: object
    doc: str
    choices: Tuple = ()
    lo: Optional[int] = None
    hi: Optional[int] = None
    targets: Tuple[str, ...] = TARGETS   # the targets that read this knob
    searchable: bool = True              # part of the search space (problem/epilogue are not)
    # Knobs added after spec texts were stored (results, tuned tables, build-cache keys, config names) are not
    # spelled by the canonical printer at their default, so every existing text stays the canonical text of
    # the kernel it always described.
    spelled_at_default: bool = True
    # The targets whose search samples this knob, where fewer than `targets` (a knob one kernel family of a target
    # reads, whose other families ignore it, would only add invalid points to that target's space).
    search_targets: Tuple[str, ...] = ()
    # The choices the search samples, where fewer than `choices` (values one target refuses, which would only add
    # invalid points to the shared categorical parameter of the others).
    search_choices: Tuple = ()

    @property
    def searched_for(self) -> Tuple[str, ...]:
        """The targets whose search space holds this knob (none unless `searchable`)."""
        return (self.search_targets or self.targets) if self.searchable else ()

    @property
    def field(self) -> str:
        """Name of the KernelSpec attribute holding this knob."""
        return f"{self.section}_{self.name}" if self.name else self.section

    @property
    def key(self) -> str:
        """Human spelling used in messages, e.g. ``tile.m``."""
        return f"{self.section}.{self.name}" if self.name else self.section


# Tiles also take the multiples of 8 that CUTLASS's warpgroup MMA (N = 8..256 in steps of 8) makes worth having:
# narrow tiles (8-48) spread a small output over many SMs; the multiples of 16 from 80 to 240 size a grid to whole
# waves of the SMs (cuBLAS runs 112 x 128 tiles on 14336 weight rows: 128 tiles on 132 SMs). Tile M gets them
# under `launch swap=yes`. Not 24 (cuBLAS has 64x24 tiles): CUTLASS 4.2's TMA epilogue cannot vectorize its
# 12-value fragments and fails to compile. Triton needs powers of two (rule triton-tile-pow2).
_TILE_MN = (8, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256)
# The tuner samples tile M and N from one categorical shared by both targets, where the wave-sized widths (80-240
# but 96, 128 and 192) would be invalid for every Triton draw: it searches the others, and the wave-sized tiles come
# from scripts/serve_sweep.py's generator and from written specs.
_TILE_MN_SEARCHED = (8, 16, 32, 48, 64, 96, 128, 192, 256)
# Tile M also takes 1, 2 and 4 rows: the gemv family's (rule gemv-tile-m), a few tokens against a weight. The other
# kernels refuse them (triton-tile-pow2, and CUTLASS's warpgroup MMA rules).
_TILE_M = (1, 2, 4) + _TILE_MN
_TILE_M_SEARCHED = (1, 2, 4) + _TILE_MN_SEARCHED

KNOBS: Tuple[Knob, ...] = (
    Knob("target", "", "enum", "any", "Restrict the spec to one target; `any` lets every target lower it.",
         choices=("any",) + TARGETS, searchable=False),
    # problem
    Knob("problem", "m", "dim", ANY, "Rows of A and C; `any` builds a shape-generic kernel.", lo=1, hi=MAX_DIM, searchable=False),
    Knob("problem", "n", "dim", ANY, "Columns of B and C.", lo=1, hi=MAX_DIM, searchable=False),
    Knob("problem", "k", "dim", ANY, "Reduction dimension.", lo=1, hi=MAX_DIM, searchable=False),
    Knob("problem", "batch", "dim", 1, "Batch count (strided batched GEMM); 1 for a plain GEMM.", lo=1, hi=MAX_DIM,
         searchable=False),
    # element types
    Knob("types", "a", "enum", "f16", "Element type of A.", choices=("f16", "bf16", "f32"), searchable=False),
    Knob("types", "b", "enum", "f16", "Element type of B (must equal A's).", choices=("f16", "bf16", "f32"),
         searchable=False),
    Knob("types", "c", "enum", "f16", "Element type of the output D (and of the C input when beta != 0).",
         choices=("f16", "bf16", "f32"), searchable=False),
    Knob("types", "acc", "enum", "f32", "Accumulator type.", choices=("f32", "f16"), searchable=False),
    Knob("types", "math", "enum", "tf32", "How f32 inputs are multiplied: tf32 tensor cores or exact ieee.",
         choices=("tf32", "ieee"), targets=("triton",), searchable=False),
    # layouts
    Knob("layout", "a", "enum", "row", "Storage order of A (M x K): row-major or column-major.",
         choices=("row", "col"), searchable=False),
    Knob("layout", "b", "enum", "row", "Storage order of B (K x N).", choices=("row", "col"), searchable=False),
    Knob("layout", "c", "enum", "row", "Storage order of C and D (M x N).", choices=("row", "col"),
         searchable=False),
    # tiling
    Knob("tile", "m", "int", 128, "Block tile rows.", choices=_TILE_M, search_choices=_TILE_M_SEARCHED),
    Knob("tile", "n", "int", 128, "Block tile columns.", choices=_TILE_MN, search_choices=_TILE_MN_SEARCHED),
    Knob("tile", "k", "int", 64, "Block tile depth per main-loop step.", choices=(16, 32, 64, 128, 256, 512)),
    Knob("pipeline", "stages", "auto_int", AUTO,
         "Shared-memory pipeline depth; `auto` lets the target fit it to shared memory.",
         choices=(1, 2, 3, 4, 5, 6, 7, 8)),
    Knob("launch", "warps", "auto_int", AUTO,
         "Warps per program (Triton) or per block of a CUTLASS-target gemv kernel; `auto` derives it from the tile.",
         choices=(2, 4, 8, 16), targets=TARGETS, search_targets=("triton",)),
    Knob("launch", "persistent", "enum", "no",
         "Persistent grid (one program per SM looping over tiles) instead of one program per tile (Triton).",
         choices=("no", "yes"), targets=("triton",)),
    Knob("launch", "schedule", "enum", AUTO,
         "Warp-specialized kernel schedule (CUTLASS): cooperative (2 consumer warpgroups share a tile), "
         "pingpong (consumer warpgroups alternate tiles) or basic (one consumer warpgroup, one block per tile, "
         "no persistent tile loop: the least fixed cost, for outputs of a few tiles); `auto` picks by tile size.",
         choices=(AUTO, "cooperative", "pingpong", "basic"), targets=("cutlass",)),
    Knob("launch", "swap", "enum", "no",
         "CUTLASS computes the transposed product D^T = B^T A^T (what cuBLAS does for row-major outputs): the "
         "warpgroup MMA's 64-row granularity then runs along N, so tile M may be any multiple of 8 (8-48 for few "
         "rows, 192 to fit M in one wave) while tile N takes the 64/128/256 rule. The spec's tile, cluster and "
         "layout knobs keep their meaning for D = A @ B.",
         choices=("no", "yes"), targets=("cutlass",), spelled_at_default=False),
    Knob("launch", "loads", "enum", "pointer",
         "How Triton programs read A and B: `pointer` (address arithmetic and masked loads), `tma` (tensor "
         "descriptors built on the host: one bulk copy per tile, out-of-bounds zero-filled; fp16/fp32 A and B "
         "without a batch) or `tma_device` (the same loads from descriptors each program builds itself: no "
         "descriptor encoding on the host per launch). CUTLASS kernels always load through TMA.",
         choices=("pointer", "tma", "tma_device"), targets=("triton",), spelled_at_default=False),
    Knob("launch", "family", "enum", "gemm",
         "Kernel family: `gemm` (tensor-core tiles: tl.dot in Triton, warpgroup MMA in CUTLASS) or `gemv` (a few rows "
         "against a large weight, as in LLM decoding, on CUDA cores or, on the CUTLASS target with `launch "
         "cores=tensor`, mma.sync: tile m of 1-16 rows; each program "
         "streams a tile n x tile k slab of B per step and reduces over K in registers; no batch). On the CUTLASS "
         "target gemv is plain CUDA C++ (no CUTLASS), whose K slices are the blocks of a thread-block cluster and "
         "add their sums through distributed shared memory, in slice order.",
         choices=("gemm", "gemv"), targets=TARGETS, spelled_at_default=False,
         # searched by scripts/serve_sweep.py and online choice, where the token count is small: drawn uniformly
         # in the tuner's space, gemv points almost never validate and starve its budget
         searchable=False),
    Knob("launch", "evict", "enum", "normal",
         "L2 eviction hints of the Triton kernels' pointer loads and of a CUTLASS-target gemv kernel's: `first` reads "
         "B (the weight, streamed once) evict-first and A (reused by every column tile) evict-last (Triton) or "
         "through L1 (gemv); `normal` gives no hint.",
         choices=("normal", "first"), targets=TARGETS, spelled_at_default=False, search_targets=("triton",)),
    Knob("launch", "cores", "enum", "cuda",
         "Which units a CUTLASS-target gemv kernel multiplies on: `cuda` (fp32 multiply-adds on CUDA cores, one "
         "instruction per product: limited by instruction issue from about 4 rows) or `tensor` (mma.sync with the "
         "weight on the MMA's 16-row side and up to 8 or 16 tokens on its narrow side, fed straight from 16-byte "
         "loads whose K order both operands share: tile m of 8 or 16 rows, memory-bound at any of them).",
         choices=("cuda", "tensor"), targets=("cutlass",), spelled_at_default=False, searchable=False),
    Knob("launch", "reduce", "enum", "step",
         "When a gemv kernel sums its products over K: `step` reduces each step's slab across the threads (fewest "
         "registers), `end` adds the products per K lane in registers and reduces once after the K loop (no "
         "cross-thread work in the loop; more registers).",
         choices=("step", "end"), targets=("triton",), spelled_at_default=False, searchable=False),
    Knob("cluster", "m", "int", 1, "Thread-block cluster size along M (CUTLASS, TMA multicast of B).",
         choices=(1, 2, 4), targets=("cutlass",)),
    Knob("cluster", "n", "int", 1, "Thread-block cluster size along N (CUTLASS, TMA multicast of A).",
         choices=(1, 2, 4), targets=("cutlass",)),
    # rasterization
    Knob("swizzle", "group", "int", 8, "Tiles per group of the grouped (L2-friendly) launch order; 1 = plain. "
         "A persistent CUTLASS kernel lowers it per call until CUTLASS's scheduler pads no tile.",
         choices=(1, 2, 4, 8, 16)),
    Knob("swizzle", "raster", "enum", "m",
         "Raster order: `m` walks down M inside a group of N-tiles, `n` walks along N inside a group of "
         "M-tiles.", choices=("m", "n")),
    # reduction decomposition
    Knob("split_k", "slices", "int", 1, "Split the K loop into this many slices (1 = no split).", lo=1, hi=32),
    Knob("split_k", "mode", "enum", "workspace",
         "How slices are combined: `workspace` (deterministic fp32 partials; Triton reduces them in parallel, "
         "CUTLASS's split-K scheduler adds them one slice after another), `atomic` (fp32 atomic adds), "
         "`stream_k` (CUTLASS stream-K scheduler; slices ignored), `parallel` (CUTLASS: the slices run as one "
         "batched GEMM into fp32 partials, summed in slice order by a second kernel that applies the epilogue).",
         choices=("workspace", "atomic", "stream_k", "parallel")),
    Knob("split_k", "reduce", "enum", "inkernel",
         "How a Triton workspace-mode split-K kernel sums its slices: `inkernel` (the last program of each tile to "
         "finish its slice sums the tile's partials, counted by a per-tile semaphore: one launch) or `finalize` (a "
         "second kernel sums them). Atomic mode always sums in a second kernel.",
         choices=("inkernel", "finalize"), targets=("triton",), spelled_at_default=False,
         # measured cheaper on the H200 (one launch fewer, benchmarks/NOTES.md): searching it would spend budget
         searchable=False),
    # epilogue
    Knob("epilogue", "alpha", "float", 1.0, "D = activation(alpha * A@B + beta * C + bias).", searchable=False),
    Knob("epilogue", "beta", "float", 0.0, "Scale of the C input; 0 means no C input is read.", searchable=False),
    Knob("epilogue", "bias", "enum", "none", "Bias vector: `row` (one value per output row, length M) or "
                                              "`col` (one per output column, length N, as nn.Linear).",
         choices=("none", "row", "col"), searchable=False),
    Knob("epilogue", "activation", "enum", "none", "Activation applied last.",
         choices=("none", "relu", "gelu", "silu"), searchable=False),
    Knob("epilogue", "gate", "enum", "none",
         "Gated epilogue of an LLM's MLP (Triton; the CUTLASS target's CUDA-core gemv, and its GEMMs with "
         "store=staged, B column-major): B "
         "holds 2N columns, the gate projection's [0, N) then the up "
         "projection's [N, 2N) (gate_proj and up_proj weights concatenated), and D (M x N) = act(alpha * A@B_gate "
         "+ bias_gate) * (alpha * A@B_up + bias_up) in fp32: `silu` (SwiGLU) or `gelu_tanh` (GeGLU, GELU's tanh "
         "form); `none`: a plain GEMM. A bias holds 2N values; no C input or activation, and split-K only as the "
         "CUTLASS gemv's K slices.",
         choices=("none", "silu", "gelu_tanh"), searchable=False, spelled_at_default=False),
    Knob("epilogue", "store", "enum", "tma",
         "How a CUTLASS GEMM writes its output tile: `tma` (through shared memory in sub-tiles and TMA bulk "
         "stores, which each block waits for before it ends), `direct` (each consumer thread stores its "
         "accumulators to global memory itself: no shared memory for the epilogue, which leaves more for pipeline "
         "stages, no store to wait for, and a lighter kernel to compile; alpha, beta and C only) or `staged` "
         "(the consumer threads write the finished tile, in the output type, to shared memory, then copy it out "
         "in 16-byte stores along D's contiguous dimension: whole-line stores as TMA makes, with l2c's own short "
         "epilogue, which compiles in about half the TMA store's time at the same speed; every epilogue the TMA "
         "store fuses; the store of the new kernels `l2c tune` builds).",
         choices=("tma", "direct", "staged"), targets=("cutlass",), spelled_at_default=False,
         # not a searched dimension: the tuner gives each CUTLASS point its store (`search.space.tuner_store`:
         # staged for a new kernel, TMA where the pack holds the point), so no study spends draws on twins
         searchable=False),
)

KNOBS_BY_FIELD = {k.field: k for k in KNOBS}
SECTIONS: Tuple[str, ...] = tuple(dict.fromkeys(k.section for k in KNOBS))


def knobs_in(section: str) -> Tuple[Knob, ...]:
    return tuple(k for k in KNOBS if k.section == section)


DTYPE_BYTES = {"f16": 2, "bf16": 2, "f32": 4}
