"""The Triton target's rules: what its templates (gemm and gemv families) assume, and its resolution of `auto`
stages and warps."""
from __future__ import annotations

from typing import Tuple

from ...arch import Arch
from ...ir import KernelSpec, knob
from ...knobs import ANY, AUTO, DTYPE_BYTES
from ...rules import ValidSpec, alignment_checks, declare, fail, gated, mainloop_stage_bytes

TMA_LOADS = ("tma", "tma_device")   # `launch loads=` values that read A and B through tensor descriptors

# A gemv step's products per thread (tile m x n x k / threads): above this the products and the loaded slab spill out
# of registers (measured with Triton's compiler for sm_90, tests/test_triton_gemv.py).
GEMV_PRODUCTS_PER_THREAD = 128


RULES = declare({
    "stream-k-target": "stream-K is a CUTLASS scheduler; Triton supports split_k modes workspace and atomic",
    "parallel-split-k-target": "split_k mode=parallel is a CUTLASS decomposition (a batched GEMM over the slices "
                               "and a reduction kernel); Triton's workspace mode already sums its slices in parallel",
    "triton-tma-loads": "Triton `launch loads=tma` or `tma_device` reads fp16 or fp32 A and B of a plain (unbatched) GEMM whose "
                        "contiguous extents are multiples of 16 bytes (not bf16: the CPU interpreter reads bf16 "
                        "through a descriptor wrongly, so such kernels could not be tested)",
    "triton-tile-pow2": "Triton tiles are powers of two (tl.arange) of at least 16 (tl.dot)",
    "split-k-reduce": "`split_k reduce=finalize` chooses how workspace-mode split-K sums its slices: it needs "
                      "split_k slices > 1 and mode=workspace (atomic mode always sums in a second kernel)",
    "gemv-reduce": "`launch reduce` chooses how a gemv kernel sums over K; the gemm family reduces in tl.dot",
    "evict-loads": "`launch evict=first` hints Triton's pointer loads; TMA descriptor loads take no eviction hint",
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
    "gated-split-k": "a gated Triton kernel runs its K loop in one program (split_k slices=1): its slices would "
                     "reduce two partial tiles, and its 2N weight columns already give the SMs many programs",
    "triton-offsets": "a Triton kernel indexes inside one matrix in 32-bit arithmetic: at a fixed problem shape, "
                      "A (M x K), B (K x N; K x 2N gated) and C (M x N) each hold at most 2^31 elements (the "
                      "kernel refuses larger operands at every call)",
})

# Elements one matrix may hold for the Triton kernels' 32-bit offsets (templates/triton/common.j2, `_check_offsets`).
MAX_MATRIX_ELEMENTS = 2 ** 31


def check(spec: KernelSpec, arch: Arch) -> ValidSpec:
    """The Triton target's rules for `spec` (common rules already passed); its ValidSpec with stages and warps."""
    if spec.split_k_mode == "stream_k":
        raise fail(spec, "split_k_mode", "stream-k-target", "split_k mode=stream_k on Triton")
    if spec.split_k_mode == "parallel":
        raise fail(spec, "split_k_mode", "parallel-split-k-target", "split_k mode=parallel on Triton")
    if spec.launch_evict != "normal" and spec.launch_loads in TMA_LOADS:
        raise fail(spec, "launch_evict", "evict-loads", f"evict={spec.launch_evict} with loads={spec.launch_loads}")
    if spec.split_k_reduce != "inkernel" and (spec.split_k_slices == 1 or spec.split_k_mode != "workspace"):
        raise fail(spec, "split_k_reduce", "split-k-reduce",
                    f"reduce={spec.split_k_reduce} with split_k slices={spec.split_k_slices} mode={spec.split_k_mode}")
    if gated(spec):
        _check_gated(spec)
    _check_offsets(spec)
    if spec.launch_family == "gemv":
        return _validate_triton_gemv(spec, arch)
    if spec.launch_reduce != "step":
        raise fail(spec, "launch_reduce", "gemv-reduce", f"reduce={spec.launch_reduce} with family=gemm")
    if spec.launch_loads in TMA_LOADS:
        _check_triton_tma(spec)
    for field in ("tile_m", "tile_n", "tile_k"):
        size = getattr(spec, field)
        if size < 16 or size & (size - 1):
            raise fail(spec, field, "triton-tile-pow2", f"{knob(field).key}={size}")
    acc_tile = spec.tile_m * spec.tile_n
    if spec.launch_warps == AUTO:
        warps = 8 if acc_tile >= 128 * 128 else 4
    else:
        warps = int(spec.launch_warps)
    per_thread = acc_tile * (2 if gated(spec) else 1) // (warps * 32)
    limit = accumulator_limit(warps * 32)
    if per_thread > limit:
        raise fail(spec, "launch_warps" if spec.launch_warps != AUTO else "tile_n", "accumulator-registers",
                    f"{'two ' if gated(spec) else ''}{spec.tile_m}x{spec.tile_n} accumulator{'s' if gated(spec) else ''} "
                    f"over {warps} warps {'are' if gated(spec) else 'is'} {per_thread} values per thread "
                    f"(at most {limit} at {warps * 32} threads)")
    stages, smem = _triton_stages(spec, arch)
    return ValidSpec(spec, "triton", arch, stages=stages, warps=warps, schedule="none", smem_bytes=smem)


def accumulator_limit(threads: int) -> int:
    """fp32 accumulators a thread of a Triton program may hold: 256 (ptxas spills past its 255 registers, but
    builds), and above 256 threads, where the 64K-register file gives each thread fewer than 255, three quarters of
    its share (ptxas refuses a kernel whose accumulators leave no registers for addresses and loads)."""
    return 256 if threads <= 256 else REGISTER_FILE // threads * 3 // 4


REGISTER_FILE = 65536   # 32-bit registers of one SM, which one program's threads share


def _check_offsets(spec: KernelSpec) -> None:
    """Rule `triton-offsets`, for the operands whose both extents the spec fixes."""
    b_cols = spec.problem_n * 2 if gated(spec) and spec.problem_n != ANY else spec.problem_n
    for name, rows, cols, field in (("A", spec.problem_m, spec.problem_k, "problem_k"),
                                    ("B", spec.problem_k, b_cols, "problem_n"),
                                    ("C", spec.problem_m, spec.problem_n, "problem_n")):
        if rows != ANY and cols != ANY and rows * cols > MAX_MATRIX_ELEMENTS:
            raise fail(spec, field, "triton-offsets", f"{name} of {rows} x {cols} = {rows * cols} elements")


def _check_gated(spec: KernelSpec) -> None:
    """What the gated epilogue of the Triton templates needs beyond the common rule gated-epilogue: rule
    gated-split-k."""
    if spec.split_k_slices > 1:
        raise fail(spec, "split_k_slices", "gated-split-k",
                   f"split_k slices={spec.split_k_slices} with gate={spec.epilogue_gate}")


def _triton_stages(spec: KernelSpec, arch: Arch) -> Tuple[int, int]:
    """(stages, shared memory bytes) of a Triton kernel: `auto` is the deepest of 4..1 stages that fits."""
    per_stage = mainloop_stage_bytes(spec)
    if spec.pipeline_stages == AUTO:
        fitting = [s for s in (4, 3, 2, 1) if s * per_stage <= arch.smem_per_block]
        stages = fitting[0] if fitting else 1
    else:
        stages = int(spec.pipeline_stages)
    smem = stages * per_stage
    if smem > arch.smem_per_block:
        raise fail(spec, "pipeline_stages" if spec.pipeline_stages != AUTO else "tile_k", "shared-memory",
                    f"{stages} stages x {per_stage} bytes = {smem} bytes > {arch.smem_per_block}")
    # after the main loop Triton converts the accumulator tile to the store's layout through shared memory (reusing
    # the loop's buffers): a tile of what the kernel stores, fp32 where it stores partial sums or an f32 output
    stored = 4 if spec.types_c == "f32" or spec.split_k_slices > 1 else DTYPE_BYTES[spec.types_c]
    epilogue = spec.tile_m * spec.tile_n * stored
    if epilogue > arch.smem_per_block:
        raise fail(spec, "tile_n", "shared-memory",
                    f"the epilogue's {spec.tile_m}x{spec.tile_n} tile of {stored}-byte values = {epilogue} bytes > "
                    f"{arch.smem_per_block}")
    return stages, max(smem, epilogue)


def _validate_triton_gemv(spec: KernelSpec, arch: Arch) -> ValidSpec:
    """The gemv family (templates/triton/gemv.py.j2): what its kernel assumes."""
    if spec.launch_loads != "pointer":
        raise fail(spec, "launch_loads", "gemv-loads", f"loads={spec.launch_loads} with family=gemv")
    if spec.problem_batch != 1:
        raise fail(spec, "problem_batch", "gemv-batch", f"problem.batch={spec.problem_batch} with family=gemv")
    if spec.launch_persistent != "no":
        raise fail(spec, "launch_persistent", "gemv-persistent", "persistent=yes with family=gemv")
    if spec.types_acc != "f32":
        raise fail(spec, "types_acc", "gemv-acc", f"accumulator {spec.types_acc} with family=gemv")
    if spec.tile_m not in (1, 2, 4, 8, 16):
        raise fail(spec, "tile_m", "gemv-tile-m", f"tile m={spec.tile_m}")
    for field in ("tile_n", "tile_k"):
        size = getattr(spec, field)
        if size & (size - 1):
            raise fail(spec, field, "gemv-tile-pow2", f"{knob(field).key}={size}")
    warps = 4 if spec.launch_warps == AUTO else int(spec.launch_warps)
    products = spec.tile_m * spec.tile_n * spec.tile_k * (2 if gated(spec) else 1) // (warps * 32)
    # reduce=end keeps every product's running sum in a register besides the loaded slab: half the budget
    if products > (GEMV_PRODUCTS_PER_THREAD // 2 if spec.launch_reduce == "end" else GEMV_PRODUCTS_PER_THREAD):
        raise fail(spec, "launch_warps" if spec.launch_warps != AUTO else "tile_k", "gemv-registers",
                    f"{spec.tile_m}x{spec.tile_n}x{spec.tile_k} products{' of two slabs' if gated(spec) else ''} "
                    f"over {warps} warps is {products} per thread"
                    + (" (reduce=end: at most half as many)" if spec.launch_reduce == "end" else ""))
    stages, smem = _triton_stages(spec, arch)
    return ValidSpec(spec, "triton", arch, stages=stages, warps=warps, schedule="none", smem_bytes=smem)


def _check_triton_tma(spec: KernelSpec) -> None:
    """What the Triton template's TMA loads assume (templates/triton/gemm.py.j2); a shape-generic kernel checks
    the row alignment of each call's operands instead (ValueError, so the dispatcher falls back)."""
    if spec.problem_batch != 1:
        raise fail(spec, "problem_batch", "triton-tma-loads", f"loads={spec.launch_loads} with problem.batch={spec.problem_batch}")
    if spec.types_a not in ("f16", "f32"):
        raise fail(spec, "types_a", "triton-tma-loads", f"loads={spec.launch_loads} with {spec.types_a} inputs")
    for field, _, extent, nbytes in alignment_checks(spec)[:2]:   # A and B (the output is stored by pointer)
        if extent != ANY and (extent * nbytes) % 16:
            raise fail(spec, field, "triton-tma-loads",
                        f"loads={spec.launch_loads} with {knob(field).key}={extent}: rows of {extent * nbytes} bytes")
