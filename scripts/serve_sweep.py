#!/usr/bin/env python
"""Search kernels for the memory-bound `serve` shapes (LLM decoding: a few tokens against a large weight).

    python scripts/serve_sweep.py --out DIR --dtype f16 [--stages explore,gemv,cutlass] [--max-m 128]
    python scripts/serve_sweep.py --out DIR --dtype bf16 --stages gemv,cutlass --top-from EXPLORE.jsonl.xz
    python scripts/serve_sweep.py --out /tmp --warm-table TABLE.json --shapes serve    # before measuring a table

nn.Linear's layout (B is the weight transposed); `--layout row,row,row` times the CUTLASS-target stages (cutlass,
unswapped) in `a @ b` with B row-major instead, against torch.matmul (e.g. on `--shapes grid`, its files named
`..._rowrowrow.jsonl`). Stages:
- explore (A): the wide GEMV space — (tile n, tile k, warps) x reduce {step, end} x waves {1, 2, 4, 8} of programs
  over the SMs, split-K sized per shape — on eight representative weights at M = 1, 2, 4, 8, 16; the best
  configurations per M (geomean speedup) go on to stage B (`--top-from` ranks an earlier exploration instead);
- gemv (B): those configurations, and three 16-row tensor-core tiles at M = 4-16, on every weight;
- cutlass (C): swapped narrow CUTLASS tiles (tile M the smallest of 8-256 that holds the tokens; basic, pingpong,
  cooperative; split-K serial, stream-K, parallel), built in the background while the Triton stages run;
- cudagemv (not in the default stages): the CUTLASS target's gemv family (plain CUDA, templates/cutlass/gemv.cu.j2;
  K slices as the blocks of a cluster) at M <= 8: `CUDA_GEMV_COLUMN` configurations x `CUDA_GEMV_SLICES`, tile m the
  smallest power of two that holds the tokens, built with --build-jobs processes before measuring;
- tensorgemv (not in the default stages): the same family on tensor cores (`launch cores=tensor`, mma.sync with
  the tokens on the MMA's narrow side) at M <= 16: `TENSOR_GEMV_COLUMN` x `CUDA_GEMV_SLICES`;
- unswapped (not in the default stages): CUTLASS tiles with the tokens on the MMA's M side (64 or 128 rows) and
  a tile N sized so that the grid fills whole waves of the SMs (`unswapped_configs`), for 48-512 tokens;
- entries (not in the default stages; `--table TABLE.json`): every shape-generic kernel of TABLE's exact entries
  for a weight (this dtype, nn.Linear's layout, plain), timed at every --shapes M of that weight in the `kernel` and
  `call` protocols through l2c.nn.Linear with a table serving it, as an entry of it would serve users (the rows'
  `served_spec`; through the kernel's own Python call, `call` lost up to 25% that users do not lose): where online
  choice kept a different best kernel at each M, this is the evidence that one kernel also won at consecutive M,
  from which `l2c table --ranges` makes the token ranges that serve the M between (`--shapes decode`, then the
  table's held-out check on `decode_between`);
- gated (not in the default stages): the fused gated MLP projection (`epilogue gate`, SwiGLU by default) of
  `--gated-weights` (Llama-3.1-8B's gate_up: N = 14336 outputs over K = 4096) at `--gated-tokens` — the CUTLASS
  target's gated CUDA-core gemv up to 4 tokens, Triton GEMV kernels up to 16 tokens, narrow and wide tensor-core
  tiles (pointer and TMA loads) above, the CUTLASS target's gated GEMM tiles from 64 tokens (`--gated-targets`
  picks the targets) — each timed against torch's gated projection as the MLP modules run it (the
  gate's and the up projection's cuBLAS GEMMs, then act(g) * u). `l2c table --ranges` makes gated entries of the rows
  (their `gate` field), which only gated calls (`l2c.gated_matmul`, `l2c.nn.GatedMLP`) meet:

      python scripts/serve_sweep.py --out DIR --dtype f16 --stages gated --budget-s 1800
      l2c table DIR/serve_gated_silu_f16.jsonl --ranges -o DIR/gated_f16.json
Every candidate is verified, then timed against F.linear's cuBLAS call in the `kernel` protocol with cold
operands and each row's fraction of roofline (`l2c bench --roofline`, rates measured in the same run). Triton
compiles every (spec, specialization) on first launch; a pool of processes launches each pair once first so that
the measuring process finds them in Triton's cache. Rows go to DIR/serve_<stage>_<dtype>.jsonl in `l2c bench`'s
format, each with its spec text (`l2c table --ranges` and `l2c report` read them).
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

from l2c.online import SMS, split_for


LINEAR = "row,col,row"   # nn.Linear's layouts of A, B (the weight transposed) and D: every stage's default
GEMV_TILES = ((16, 256, 4), (32, 256, 4), (32, 128, 4), (64, 128, 4), (16, 512, 4), (64, 256, 8))
# The exploration's GEMV space: (tile n, tile k, warps) x reduce x waves of programs over the SMs
GEMV_EXPLORE = tuple((bn, bk, w) for bn in (8, 16, 32, 64, 128) for bk in (128, 256, 512) for w in (2, 4, 8))
WAVES = (1, 2, 4, 8)


def gemv_configs(m: int, n: int, k: int, dtype: str, tiles=GEMV_TILES, reduces=("step",), waves=(2, 4)):
    """GEMV candidates: one row block holds every token row, the weight streamed once with evict-first loads.
    Returns (spec text, (tile n, tile k, warps, reduce, waves)) pairs."""
    rows = 1 << max(0, (m - 1).bit_length())
    out, seen = [], set()
    for bn, bk, warps in tiles:
        for reduce in reduces:
            for w in waves:
                split = split_for(math.ceil(n / bn), k, bk, w)
                body = (f"launch family=gemv warps={warps} evict=first reduce={reduce}\n  tile m={rows} n={bn} "
                        f"k={bk}\n  split_k slices={split} mode=workspace")
                text = _spec(body, dtype, "gemv")
                if text not in seen:
                    seen.add(text)
                    out.append((text, (bn, bk, warps, reduce, w)))
    return out


GEMM_TILES = ((64, 128, 4), (128, 64, 4), (64, 64, 6), (128, 128, 3))


def gemm_specs(m: int, n: int, k: int, dtype: str, tiles=GEMM_TILES):
    """Tensor-core candidates: a narrow tile M (16 to 64) and split-K to fill the SMs."""
    tile_m = min(64, max(16, 1 << (m - 1).bit_length()))
    out = []
    for bn, bk, stages in tiles:
        tiles = math.ceil(m / tile_m) * math.ceil(n / bn)
        for split in _splits(tiles, k, bk):
            out.append(f"launch warps=4 evict=first\n  tile m={tile_m} n={bn} k={bk}\n  pipeline stages={stages}\n"
                       f"  split_k slices={split} mode=workspace")
    return [_spec(body, dtype, "gemm") for body in out]


# tile M of the swapped tiles: the tokens on the MMA's N side, so up to 256 of them in one tile (the weight is
# streamed once, where cuBLAS runs two 128-row tiles at M = 192)
CUTLASS_TILE_M = (8, 16, 32, 48, 64, 96, 128, 192, 256)
# (schedule, tile n, tile k, cluster n, split slices, split mode) under launch swap=yes: cuBLAS's own decoding
# kernels are this family (nvjet, 64 x 8 tiles along N x M, deep TMA pipelines, split-K with a reduction kernel)
CUTLASS_NARROW = (("basic", 64, 64, 1, 1, "workspace"), ("basic", 64, 64, 2, 1, "workspace"),
                  ("basic", 64, 128, 1, 1, "workspace"), ("pingpong", 64, 64, 1, 1, "workspace"),
                  ("cooperative", 128, 64, 1, 2, "workspace"), ("cooperative", 128, 64, 1, 1, "stream_k"),
                  ("basic", 64, 64, 1, 2, "parallel"), ("basic", 64, 64, 1, 4, "parallel"))
CUTLASS_WIDE = tuple(CUTLASS_NARROW[i] for i in (0, 1, 3, 4, 5, 6))
# from 96 tokens the activation tile outgrows the weight tile: every block reads it again from L2, so a cluster
# of two weight tiles multicasts it; and fewer weight tiles than SMs on the smaller weights need more K slices
CUTLASS_TOKEN_WIDE = CUTLASS_WIDE + (("cooperative", 128, 64, 2, 1, "workspace"),
                                    ("pingpong", 64, 64, 2, 1, "workspace"),
                                    ("cooperative", 128, 64, 1, 3, "workspace"),
                                    ("cooperative", 128, 64, 1, 4, "workspace"))


# (tile n, warps, tile k) of the CUTLASS target's gemv family with B column-major, and its K slices (cluster sizes)
CUDA_GEMV_COLUMN = ((8, 2, 256), (8, 4, 256), (16, 4, 256), (8, 8, 256), (16, 8, 256), (32, 8, 256), (8, 2, 512),
                    (8, 4, 512))
CUDA_GEMV_SLICES = (1, 2, 4)
# (tile m, tile n, warps, tile k) of the tensor-core gemv (launch cores=tensor) with B column-major: tile m 16 at
# every M up to 16 (one kernel per weight may win a token-count range), tile m 8 up to 8
TENSOR_GEMV_COLUMN = ((16, 16, 4, 128), (16, 16, 8, 128), (16, 32, 4, 128), (16, 16, 2, 128),
                      (8, 16, 4, 256), (8, 32, 8, 256))


def _cutlass_gemv_specs(tiles, cores: str, dtype: str):
    """CUTLASS-target gemv candidates (nn.Linear's layout): each (tile m, tile n, warps, tile k) of `tiles` on
    `cores` x `CUDA_GEMV_SLICES`, valid ones only."""
    texts = [_spec(f"launch family=gemv cores={cores} warps={warps} evict=first\n  tile m={bm} n={bn} k={bk}\n"
                   f"  split_k slices={slices}", dtype, "gemv", target="cutlass")
             for bm, bn, warps, bk in tiles for slices in CUDA_GEMV_SLICES]
    return _valid(texts)


def cuda_gemv_specs(m: int, dtype: str):
    """The cudagemv stage's candidates for M tokens: tile m the smallest power of two that holds them."""
    rows = 1 << max(0, (m - 1).bit_length())
    return _cutlass_gemv_specs([(rows, bn, warps, bk) for bn, warps, bk in CUDA_GEMV_COLUMN], "cuda", dtype)


def tensor_gemv_specs(m: int, dtype: str):
    """The tensorgemv stage's candidates for M tokens: the configurations whose tile m holds them."""
    return _cutlass_gemv_specs([tile for tile in TENSOR_GEMV_COLUMN if m <= tile[0]], "tensor", dtype)


def cutlass_tile_m(m: int) -> int:
    """The narrow side of a swapped CUTLASS tile for M rows: the smallest tile M that holds them."""
    return next((t for t in CUTLASS_TILE_M if t >= m), CUTLASS_TILE_M[-1])


def cutlass_specs(tile_m: int, dtype: str, layout: str = LINEAR):
    configs = CUTLASS_NARROW if tile_m <= 32 else CUTLASS_WIDE if tile_m < 96 else CUTLASS_TOKEN_WIDE
    out = []
    for schedule, bn, bk, cluster, split, mode in configs:
        body = (f"launch schedule={schedule} swap=yes\n  tile m={tile_m} n={bn} k={bk}\n  cluster m=1 n={cluster}\n"
                f"  split_k slices={split} mode={mode}")
        out.append(_spec(body, dtype, "cutlass", target="cutlass", layout=layout))
    return out


# The unswapped tiles (the tokens on the MMA's M side, the weight rows on its N side; cuBLAS runs 112 x 128 tiles at
# 128 tokens on 14336 weight rows: 128 tiles on 132 SMs): the basic schedule's 64- and 128-row tiles with the tile N
# choices that size the grid to whole waves of the SMs. Cooperative tiles, with split-K or without, measured 0.44-0.98
# of cuBLAS where the basic tile won (shared-memory bound: benchmarks/NOTES.md), so they are not candidates.
UNSWAPPED = (("basic", 64, 256), ("basic", 128, 128))   # schedule, tile m, widest tile n (128 accumulators a thread)
UNSWAPPED_TILE_N = (64, 96, 112, 128, 144, 176, 192, 224, 256)
UNSWAPPED_PER_TILE_M = 3


def wave_fill(m: int, n: int, tile_m: int, tile_n: int) -> float:
    """The share of the SMs' tile slots over all waves that holds output elements (padding and the last wave's
    idle SMs are the rest)."""
    tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n)
    return m * n / (math.ceil(tiles / SMS) * SMS * tile_m * tile_n)


def unswapped_configs(m: int, n: int):
    """(schedule, tile m, tile n, cluster m, cluster n) for M tokens against a weight of N rows: per tile M (a 128-row
    tile only from 96 tokens) the UNSWAPPED_PER_TILE_M tile N that fill the waves best, wider first on ties; the
    best of all also in a cluster of two along N (the token tile multicast to two weight tiles: the kernels are
    bound by L2-to-SM traffic, 80% of the L2's throughput in Nsight Compute) and, where the token tiles pair up
    without padding, along M (the weight tile multicast to two token tiles)."""
    ranked = []
    for schedule, tile_m, widest in UNSWAPPED:
        if tile_m > 64 and tile_m >= 2 * m:
            continue
        fills = sorted(((round(wave_fill(m, n, tile_m, t), 2), t) for t in UNSWAPPED_TILE_N if t <= widest),
                       reverse=True)[:UNSWAPPED_PER_TILE_M]
        ranked += [((fill, tile_m * tile_n), (schedule, tile_m, tile_n, 1, 1)) for fill, tile_n in fills]
    ranked.sort(reverse=True)
    configs = [config for _, config in ranked]
    schedule, tile_m, tile_n, _, _ = configs[0]
    if math.ceil(n / tile_n) >= 2:
        configs.append((schedule, tile_m, tile_n, 1, 2))
    if math.ceil(m / tile_m) % 2 == 0:
        configs.append((schedule, tile_m, tile_n, 2, 1))
    return configs


def unswapped_specs(m: int, n: int, dtype: str, layout: str = LINEAR):
    """The unswapped stage's candidates for one shape (unswapped_configs), as valid spec texts."""
    texts = [_spec(f"launch schedule={schedule} swap=no\n  tile m={tile_m} n={tile_n} k=64\n  cluster m={cm} n={cn}\n"
                   f"  split_k slices=1 mode=workspace", dtype, "cutlass", target="cutlass", layout=layout)
             for schedule, tile_m, tile_n, cm, cn in unswapped_configs(m, n)]
    return _valid(texts)


def cutlass_pool(shapes, dtype: str, layout: str = LINEAR):
    """Every swapped CUTLASS candidate stage C times on `shapes`: what its builder compiles."""
    return [t for tm in sorted({cutlass_tile_m(s.m) for s in shapes}) for t in cutlass_specs(tm, dtype, layout)]


def _splits(tiles: int, k: int, bk: int):
    """Split-K counts that put two and four waves of programs on the SMs, each slice at least two K tiles."""
    return sorted({split_for(tiles, k, bk, waves) for waves in (2, 4)})


def _spec(body: str, dtype: str, family: str, target: str = "triton", layout: str = LINEAR) -> str:
    from l2c.ir import config_name
    from l2c.parser import parse_one
    la, lb, lc = layout.split(",")
    text = (f"kernel k {{\n  target {target}\n  problem m=any n=any k=any\n  types a={dtype} b={dtype} c={dtype} "
            f"acc=f32\n  layout a={la} b={lb} c={lc}\n  {body}\n"
            + ("  swizzle group=1\n" if target == "triton" else "") + "}\n")
    spec = parse_one(text)
    return spec.replace(name=config_name(spec)).to_l2()


# The gated stage's kernels: a gated kernel keeps two accumulators (or two K-lane sums) and reads two B tiles, and
# its 2N weight columns give the SMs enough programs without split-K (rule gated-split-k).
GATED_GEMV = ((8, 256, 4), (8, 512, 4), (16, 256, 4), (8, 128, 2), (16, 128, 4), (32, 128, 8), (8, 64, 8),
              (8, 128, 8), (16, 64, 8))   # tile n, tile k, warps
GATED_NARROW = ((64, 128, 4), (128, 64, 4), (64, 64, 6), (32, 128, 4))     # tile n, k, stages for tile m 16-64
GATED_WIDE = ((64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (128, 128, 64, 3, 8),
              (128, 128, 32, 4, 8), (256, 64, 64, 3, 8), (64, 256, 64, 3, 8))   # tile m, n, k, stages, warps
GATED_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# the CUTLASS target's CUDA-core gemv with the gate (B column-major): (tile n, warps, tile k) x CUDA_GEMV_SLICES, up
# to 4 tokens (from 4 rows the CUDA-core gemv is instruction-bound, session 20; a gated one reads twice the rows)
GATED_CUDA_GEMV = ((8, 4, 256), (16, 4, 256), (8, 8, 256), (16, 8, 256), (8, 4, 512))
GATED_CUDA_GEMV_MAX_M = 4
# the CUTLASS target's gated GEMM (its tile holds tile n of the gate's columns and the same of the up projection's,
# paired in the staged epilogue; N a multiple of tile n): tile m, n, k, schedule, cluster m, n; from 64 tokens
GATED_CUTLASS = ((64, 64, 64, "basic", 1, 1), (64, 128, 64, "pingpong", 1, 1), (128, 64, 64, "pingpong", 1, 1),
                 (128, 64, 64, "cooperative", 1, 1), (128, 128, 64, "cooperative", 1, 1),
                 (128, 128, 64, "cooperative", 2, 1), (256, 64, 64, "cooperative", 1, 1))
GATED_CUTLASS_MIN_M = 64


def _gated_spec(body: str, dtype: str, gate: str, group: int) -> str:
    from l2c.ir import config_name
    from l2c.parser import parse_one
    text = (f"kernel k {{\n  target triton\n  problem m=any n=any k=any\n  types a={dtype} b={dtype} c={dtype} "
            f"acc=f32\n  layout a=row b=col c=row\n  {body}\n  swizzle group={group}\n  epilogue gate={gate}\n}}\n")
    spec = parse_one(text)
    return spec.replace(name=config_name(spec)).to_l2()


def gated_pool(m: int, dtype: str, gate: str, cutlass: bool = True, triton: bool = True):
    """The gated stage's candidates for M tokens (nn.Linear's layout: B the concatenated weight transposed); the
    CUTLASS target's only with `cutlass` (a GPU to run them), Triton's only with `triton`."""
    rows = 1 << max(0, (m - 1).bit_length())
    texts = []
    if cutlass and m <= GATED_CUDA_GEMV_MAX_M:
        for bn, warps, bk in GATED_CUDA_GEMV:
            for slices in CUDA_GEMV_SLICES:
                texts.append(_spec(f"launch family=gemv cores=cuda warps={warps} evict=first\n  tile m={rows} n={bn} "
                                   f"k={bk}\n  split_k slices={slices}\n  epilogue gate={gate}", dtype, "gemv",
                                   target="cutlass"))
    if cutlass and m >= GATED_CUTLASS_MIN_M:
        for bm, bn, bk, schedule, cm, cn in GATED_CUTLASS:
            texts.append(_spec(f"launch schedule={schedule}\n  tile m={bm} n={bn} k={bk}\n  cluster m={cm} n={cn}\n"
                               f"  epilogue gate={gate} store=staged", dtype, "gemm", target="cutlass"))
    if not triton:
        return _valid(texts)
    if m <= 16:
        for bn, bk, warps in GATED_GEMV:
            for reduce in ("step", "end"):
                texts.append(_gated_spec(f"launch family=gemv warps={warps} evict=first reduce={reduce}\n  tile m={rows} "
                                         f"n={bn} k={bk}", dtype, gate, 1))
    if 2 <= m <= 256:
        tile_m = min(64, max(16, rows))
        for bn, bk, stages in GATED_NARROW:
            texts.append(_gated_spec(f"launch warps=4 evict=first\n  tile m={tile_m} n={bn} k={bk}\n  pipeline "
                                     f"stages={stages}", dtype, gate, 1))
    if m >= 32:
        for bm, bn, bk, stages, warps in GATED_WIDE:
            if bm > max(64, rows):
                continue
            for loads in ("pointer", "tma"):
                for persistent in ("no", "yes"):
                    texts.append(_gated_spec(f"launch warps={warps} loads={loads} persistent={persistent}\n  tile m={bm} "
                                             f"n={bn} k={bk}\n  pipeline stages={stages}", dtype, gate, 8))
    return _valid(list(dict.fromkeys(texts)))


def _valid(texts):
    from l2c.errors import L2Error
    from l2c.parser import parse_one
    from l2c.validate import validate
    out = []
    for text in texts:
        spec = parse_one(text)
        try:
            validate(spec, spec.target, "sm_90")
            out.append(text)
        except L2Error:
            pass
    return out


def _warm(pairs):
    """Launch each (spec, shape) once: Triton compiles and caches what the measuring process will launch."""
    import torch
    from l2c.build import build
    from l2c.parser import parse_one
    from l2c.validate import validate
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    failed = 0
    for text, (m, n, k) in pairs:
        try:
            spec = parse_one(text)
            kernel = build(validate(spec, spec.target, "sm_90"))
            dt = {"f16": torch.float16, "bf16": torch.bfloat16}[spec.types_a]
            a = torch.empty(m, k, device=dev, dtype=dt).normal_()
            columns = 2 * n if spec.epilogue_gate != "none" else n   # a gated kernel's B: the gate's, then the up's
            w = torch.empty(columns, k, device=dev, dtype=dt).normal_()
            kernel(a, w.t())
            kernel(a, w.t())
        except Exception:  # noqa: BLE001 - the measuring process records the failure
            failed += 1
    if dev == "cuda":
        torch.cuda.synchronize()
    return failed


def entry_pools(table_path: str, shapes, dtype: str):
    """shape key -> the shape-generic specs of `table_path`'s plain exact entries in `dtype` and nn.Linear's layout at
    the shape's weight (N, K), whatever their M."""
    from l2c.parser import parse_one
    entries = json.loads(Path(table_path).read_text())["entries"]
    by_weight = {}
    for e in entries:
        if (e["dtype"] == dtype and e["layout"] == LINEAR and e.get("gate", "none") == "none"
                and "m_range" not in e and parse_one(e["spec"]).shape_generic):
            by_weight.setdefault((e["n"], e["k"]), set()).add(e["spec"])
    return {s.key: sorted(by_weight.get((s.n, s.k), ())) for s in shapes}


def sweep(shapes, pools, out_path, device, budget_s, workers, log, label, protocols=("kernel",),
          through_linear=False):
    """Verify and time every (shape, spec) of `pools` (shape key -> spec texts) into `out_path`, in `protocols`.
    `through_linear`: each spec timed as a table entry of it would serve l2c.nn.Linear (`l2c bench serving:`, the
    dispatcher's whole call path: the specs written to `out_path` with the suffix .l2, each row's `served_spec`
    its kernel), so that its `call` figures are the user's and not those of the kernel's own Python call."""
    import l2c.verify
    from l2c.bench import Settings, run_bench
    from l2c.candidates import Candidate, load_candidates
    from l2c.results_file import ResultsWriter, environment
    from l2c.roofline import measure_ceilings
    from l2c.parser import parse_one
    from l2c.validate import validate
    # every check against the float32 GPU reference: a float64 CPU one would copy each weight to the host
    l2c.verify.GPU_REFERENCE_MACS = 0
    specs = sorted({t for s in shapes for t in pools[s.key]})
    if any("target   cutlass" in t for t in specs):
        from l2c.targets.cutlass.toolchain import missing_headers
        missing = missing_headers()
        if missing:   # every CUTLASS kernel outside the pack would fail to build: nothing to measure
            raise SystemExit(f"serve_sweep {label}: {missing}")
    triton_pairs = [(t, (s.m, s.n, s.k)) for s in shapes for t in pools[s.key] if "target   triton" in t]
    t0 = time.monotonic()
    if workers > 1 and triton_pairs:
        with mp.get_context("spawn").Pool(workers) as pool:
            failed = sum(pool.map(_warm, [triton_pairs[i::workers] for i in range(workers)]))
    else:
        failed = _warm(triton_pairs)
    print(f"serve_sweep {label}: warmed {len(triton_pairs)} Triton (spec, shape) pairs in "
          f"{time.monotonic() - t0:.0f} s ({failed} failed)", file=log, flush=True)
    if through_linear:
        spec_file = Path(out_path).with_suffix(".l2")
        spec_file.write_text("\n".join(specs))
        serving = {c.serves: c for c in load_candidates([f"serving:{spec_file}"], arch="sm_90")}
        cands = {t: serving[parse_one(t).to_l2()] for t in specs}
    else:
        cands = {}
        for text in specs:
            spec = parse_one(text)
            cands[text] = Candidate(id=f"serve_sweep:{spec.name}", source="scripts/serve_sweep.py",
                                    target=spec.target, spec=spec, valid=validate(spec, spec.target, "sm_90"))
    jobs = {s.key: [cands[t] for t in pools[s.key]] for s in shapes}
    settings = Settings(list(protocols), reps=7, warmup=2, roofline=True)
    writer = ResultsWriter(Path(out_path), resume=True)
    ceilings = measure_ceilings(device)
    env = environment(device, list(protocols), " ".join(sys.argv) + f" [{label}]", settings.as_dict())
    env["ceilings"] = ceilings.as_row() if ceilings else None
    writer.write(env)
    written, deadline = 0, time.monotonic() + budget_s
    for s in shapes:
        if time.monotonic() > deadline:
            print(f"serve_sweep {label}: budget spent; {s} and later shapes not measured", file=log)
            break
        written += run_bench(list(cands.values()), [s], jobs, device, settings, writer, ceilings=ceilings)
    writer.close()
    print(f"serve_sweep {label}: {written} rows in {out_path} ({time.monotonic() - t0:.0f} s)", file=log, flush=True)
    return written


def speedups(path):
    """(m, n, k) -> {spec name: speedup} of a sweep file's verified rows."""
    from l2c.results_file import read_rows
    out = {}
    for r in read_rows(path):
        if r.get("type") == "result" and r.get("status") == "ok":
            out.setdefault((r["m"], r["n"], r["k"]), {})[r["name"]] = r["speedup"]
    return out


EXPLORE_WEIGHTS = ((4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (28672, 8192), (128256, 4096),
                   (1024, 4096), (6144, 4096))
GEMV_M = (1, 2, 4, 8, 16)


def explore_gemv(shapes, dtype, out, device, args, log, measured=None):
    """Stage A: the wide GEMV space on a few weights; the configurations that rank best per M go on to stage B.
    `measured`: an earlier stage A's results file (its dtype's spec names) to rank instead of measuring again."""
    from l2c.parser import parse_one
    chosen = [s for s in shapes if (s.n, s.k) in EXPLORE_WEIGHTS and s.m in GEMV_M]
    if measured is not None:
        from l2c.results_file import read_rows
        dtype = next(r["dtype"] for r in read_rows(measured) if r.get("type") == "result")
    configs, pools = {}, {}
    for s in chosen:
        made = [(t, c) for t, c in gemv_configs(s.m, s.n, s.k, dtype, GEMV_EXPLORE, ("step", "end"), WAVES)]
        valid = set(_valid([t for t, _ in made]))
        pools[s.key] = [t for t, _ in made if t in valid]
        configs.update({parse_one(t).name: c for t, c in made if t in valid})
    path = Path(measured) if measured is not None else out / f"serve_gemv_explore_{dtype}.jsonl"
    if measured is None:
        sweep(chosen, pools, path, device, args.budget_s, args.workers, log, f"gemv explore {dtype}")
    ranks = {}
    for (m, n, k), by_name in speedups(path).items():
        for name, speedup in by_name.items():
            ranks.setdefault(m, {}).setdefault(configs[name], []).append(math.log(speedup))
    top = {}
    for m, by_config in ranks.items():
        scored = sorted(by_config.items(), key=lambda kv: -sum(kv[1]) / len(kv[1]))
        top[m] = [c for c, _ in scored[:args.top]]
        print(f"serve_sweep: M={m} best GEMV configurations (tile n, tile k, warps, reduce, waves): "
              + "; ".join(f"{c} {math.exp(sum(v) / len(v)):.3f}x" for c, v in scored[:args.top]), file=log)
    return top


def gemv_pool(shape, dtype, top):
    """Stage B's pool of one shape: the explored configurations of its M, realized for its N and K, and the two
    tensor-core tiles that won at 4 to 16 rows in the first sweep."""
    m, n, k = shape.m, shape.n, shape.k
    texts = []
    for bn, bk, warps, reduce, waves in top.get(m, []):
        texts += [t for t, _ in gemv_configs(m, n, k, dtype, ((bn, bk, warps),), (reduce,), (waves,))]
    if 4 <= m <= 16:
        texts += gemm_specs(m, n, k, dtype, GEMM_TILES[:3])
    return _valid(list(dict.fromkeys(texts)))


def _build_cutlass(texts, jobs: int, log) -> None:
    """Compile CUTLASS-target spec texts into the build cache, `jobs` nvcc runs at a time (failures are the
    sweep's failed candidates)."""
    from l2c.parser import parse_one
    from l2c.targets import get
    from l2c.validate import validate
    t0 = time.monotonic()
    outcomes = get("cutlass").prebuild_many([validate(parse_one(t), "cutlass") for t in texts], jobs)
    failed = sum(not isinstance(o, str) for o in outcomes)
    print(f"serve_sweep: built {len(texts)} CUTLASS-target kernels in {time.monotonic() - t0:.0f} s ({failed} "
          f"failed)", file=log, flush=True)


def warm_served(table_path: str, shape_sets, dtypes, layout: str, workers: int, log) -> None:
    """Compile, in a pool of processes, the Triton kernels a table serves on these shapes (as the dispatcher
    specialises them), so that measuring through the dispatcher waits for no Triton compile."""
    from l2c.shapes import load_shapes
    from l2c.tuned_table import load_table, served_spec
    table = load_table(table_path)
    pairs = set()
    for name in shape_sets:
        for s in load_shapes(name):
            for dtype in dtypes:
                entry = table.lookup(dtype, layout, s.m, s.n, s.k)
                if entry is not None and entry.target == "triton":
                    pairs.add((served_spec(entry, s.m, False, "none").to_l2(), (s.m, s.n, s.k)))
    pairs = sorted(pairs)
    t0 = time.monotonic()
    with mp.get_context("spawn").Pool(workers) as pool:
        failed = sum(pool.map(_warm, [pairs[i::workers] for i in range(workers)]))
    print(f"serve_sweep: warmed {len(pairs)} served Triton (spec, shape) pairs of {table_path} in "
          f"{time.monotonic() - t0:.0f} s ({failed} failed)", file=log, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--stages", default="explore,gemv,cutlass",
                    help="explore (stage A: the wide GEMV space on a few weights), gemv (stage B: the best of it on "
                         "every weight, M <= 16), cutlass (swapped CUTLASS tiles on every weight, M <= --max-m; "
                         "built with --build-jobs processes while the Triton stages run); cudagemv (the CUTLASS "
                         "target's gemv family, M <= 8; not a default stage); tensorgemv (the same on tensor "
                         "cores, M <= 16; not a default stage); unswapped (wave-sized CUTLASS tiles with the tokens "
                         "on the MMA's M side, --min-m <= M <= --max-m; not a default stage); entries (every "
                         "shape-generic kernel of --table's exact entries for a weight at every M of it, kernel and "
                         "call; not a default stage); gated (the fused gated MLP projection of --gated-weights at "
                         "--gated-tokens; not a default stage)")
    ap.add_argument("--max-m", type=int, default=128)
    ap.add_argument("--min-m", type=int, default=1, help="the stages' shapes have --min-m <= M <= --max-m")
    ap.add_argument("--min-n", type=int, default=1, help="the stages' shapes have N >= --min-n")
    ap.add_argument("--min-k", type=int, default=1, help="the stages' shapes have K >= --min-k")
    ap.add_argument("--layout", default=LINEAR,
                    help="the CUTLASS-target stages' layouts of A, B and D (cutlass, unswapped): row,row,row times "
                         "`a @ b` with B row-major against torch.matmul; the other stages are nn.Linear's")
    ap.add_argument("--top", type=int, default=8, help="GEMV configurations per M kept for stage B")
    ap.add_argument("--top-from", default=None, metavar="EXPLORE.jsonl",
                    help="rank stage B's configurations from an earlier stage A's results instead of measuring")
    ap.add_argument("--budget-s", type=float, default=200.0, help="measuring time per stage")
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--build-jobs", type=int, default=8)
    ap.add_argument("--shapes", default="serve")
    ap.add_argument("--gate", default="silu", choices=("silu", "gelu_tanh"), help="the gated stage's epilogue")
    ap.add_argument("--gated-tokens", default=",".join(map(str, GATED_TOKENS)),
                    help="the gated stage's token counts M (comma-separated)")
    ap.add_argument("--gated-targets", default="triton,cutlass",
                    help="the gated stage's kernel targets (comma-separated; CUTLASS's only on a GPU)")
    ap.add_argument("--gated-weights", default="14336x4096", metavar="NxK,...",
                    help="the gated stage's problems: N outputs (the intermediate size) x K (the hidden size)")
    ap.add_argument("--table", metavar="TABLE.json", help="the entries stage's table")
    ap.add_argument("--warm-table", metavar="TABLE.json",
                    help="instead of sweeping: compile the Triton kernels TABLE serves on --shapes (comma-separated "
                         "sets) in f16 and bf16, nn.Linear's layout, before measuring through the dispatcher")
    args = ap.parse_args()
    if args.warm_table:
        warm_served(args.warm_table, args.shapes.split(","), ("f16", "bf16"), "row,col,row", args.workers, sys.stderr)
        return 0
    import subprocess
    import torch
    from l2c.devices import get_device
    from l2c.shapes import load_shapes
    device = get_device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = args.stages.split(",")
    layout_suffix = "" if args.layout == LINEAR else "_" + args.layout.replace(",", "")   # e.g. _rowrowrow
    shapes = sorted((s for s in load_shapes(args.shapes) if args.min_m <= s.m <= args.max_m and s.n >= args.min_n
                     and s.k >= args.min_k), key=lambda s: (s.m, s.n * s.k))
    builder = None
    if "cutlass" in stages:
        import tempfile
        work = Path(tempfile.mkdtemp(prefix="serve_sweep_"))   # $OUT returns at most 8 files: logs stay here
        pool_file = work / f"cutlass_pool_{args.dtype}.l2"
        pool_file.write_text("\n".join(cutlass_pool(shapes, args.dtype, args.layout)))
        builder = subprocess.Popen([sys.executable, "-m", "l2c", "build", str(pool_file), "--target", "cutlass",
                                    "-j", str(args.build_jobs)], stdout=open(work / "cutlass_build.log", "w"),
                                   stderr=subprocess.STDOUT)
    device.warm_up(3.0)
    top = {m: [(bn, bk, w, "step", waves) for bn, bk, w in GEMV_TILES for waves in (2, 4)] for m in GEMV_M}
    if "explore" in stages or args.top_from:
        top = explore_gemv(shapes, args.dtype, out, device, args, sys.stderr, measured=args.top_from)
    if "gemv" in stages:
        chosen = [s for s in shapes if s.m in GEMV_M]
        pools = {s.key: gemv_pool(s, args.dtype, top) for s in chosen}
        sweep(chosen, pools, out / f"serve_gemv_{args.dtype}.jsonl", device, args.budget_s, args.workers,
              sys.stderr, f"gemv {args.dtype}")
    # the CUTLASS-target stages: (stage, largest M or None, candidates for a shape), built before measuring
    for stage, max_m, candidates in (("cudagemv", 8, lambda s, dtype: cuda_gemv_specs(s.m, dtype)),
                                     ("tensorgemv", 16, lambda s, dtype: tensor_gemv_specs(s.m, dtype)),
                                     ("unswapped", None,
                                      lambda s, dtype: unswapped_specs(s.m, s.n, dtype, args.layout))):
        if stage in stages:
            chosen = [s for s in shapes if max_m is None or s.m <= max_m]
            pools = {s.key: candidates(s, args.dtype) for s in chosen}
            _build_cutlass(sorted({t for texts in pools.values() for t in texts}), args.build_jobs, sys.stderr)
            sweep(chosen, pools, out / f"serve_{stage}_{args.dtype}{layout_suffix}.jsonl", device, args.budget_s, 1,
                  sys.stderr, f"{stage} {args.dtype}")
    if "entries" in stages:
        if not args.table:
            ap.error("the entries stage needs --table")
        pools = entry_pools(args.table, shapes, args.dtype)
        chosen = [s for s in shapes if pools[s.key]]
        sweep(chosen, pools, out / f"serve_entries_{args.dtype}.jsonl", device, args.budget_s, 1, sys.stderr,
              f"entries {args.dtype}", protocols=("kernel", "call"), through_linear=True)
    if "gated" in stages:
        from l2c.shapes import Shape
        weights = [tuple(map(int, w.split("x"))) for w in args.gated_weights.split(",")]
        chosen = [Shape(m, n, k, label="gated") for m in map(int, args.gated_tokens.split(",")) for n, k in weights]
        targets = args.gated_targets.split(",")
        pools = {s.key: gated_pool(s.m, args.dtype, args.gate, cutlass=device.kind == "cuda" and "cutlass" in targets,
                                   triton="triton" in targets) for s in chosen}
        cutlass_texts = sorted({t for texts in pools.values() for t in texts if "target   cutlass" in t})
        if cutlass_texts:
            _build_cutlass(cutlass_texts, args.build_jobs, sys.stderr)
        sweep(chosen, pools, out / f"serve_gated_{args.gate}_{args.dtype}.jsonl", device, args.budget_s, args.workers,
              sys.stderr, f"gated {args.gate} {args.dtype}")
    if builder is not None:
        t0 = time.monotonic()
        code = builder.wait()
        print(f"serve_sweep: CUTLASS pool built (status {code}) after {time.monotonic() - t0:.0f} s more; "
              + (work / "cutlass_build.log").read_text().strip().splitlines()[-1], file=sys.stderr, flush=True)
        pools = {s.key: _valid(cutlass_specs(cutlass_tile_m(s.m), args.dtype, args.layout)) for s in shapes}
        sweep(shapes, pools, out / f"serve_cutlass_{args.dtype}{layout_suffix}.jsonl", device, args.budget_s, 1,
              sys.stderr, f"cutlass {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
