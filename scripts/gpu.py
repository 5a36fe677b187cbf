#!/usr/bin/env python
"""The one supported way to run l2c's GPU checks and benchmarks: named stages, each a list of ordinary commands.

    python scripts/gpu.py --list
    python scripts/gpu.py check dispatch serve --out out/          # stages in the order given
    python scripts/gpu.py serve --out out/ --graphs-table T.json --eager-table E.json --limit-s 300
    python scripts/gpu.py points overlap --out /tmp/run --bundle $OUT/results.tar.xz   # one file comes back

Every stage writes its results (JSON or JSON lines) under --out, its output to OUT/<stage>.log, and a line per
command to OUT/stages.json (command, exit status, seconds), so a run cut short keeps what finished. A command that
fails does not stop the others; the exit status is 1 when any failed. Each command can be run by hand as printed
(`--dry-run` prints them all). Every figure is a ratio to torch measured side by side in one process
(../shared/BENCHMARKING.md); memory-bound shapes are measured with cold weights and their fraction of roofline.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


@dataclass(frozen=True)
class Stage:
    doc: str
    commands: Callable[[argparse.Namespace], List[List[str]]]


def l2c(*args: str) -> List[str]:
    return [PY, "-m", "l2c", *args]


def script(path: str, *args: str) -> List[str]:
    return [PY, str(ROOT / path), *args]


def _check(a):
    return [script("scripts/gpu_check.py", "--out", f"{a.out}/gpu_check_triton.json"),
            script("scripts/cutlass_gpu_check.py", "--count", "13", "--out", f"{a.out}/cutlass_gpu_check.json"),
            script("scripts/cross_target_check.py", "--out", f"{a.out}/cross_target.json"),
            script("scripts/dispatch_check.py", "--out", f"{a.out}/dispatch_check.json"),
            script("scripts/checker_check.py", "--out", f"{a.out}/checker_check.json"),
            script("scripts/overlap_check.py", "--out", f"{a.out}/overlap_check.json")]


def _call_checks(a):
    return [script("scripts/checker_check.py", "--out", f"{a.out}/checker_check.json"),
            script("scripts/dispatch_check.py", "--out", f"{a.out}/dispatch_check.json")]


def _overhead(a):
    return [script("scripts/call_overhead.py", "--out", f"{a.out}/call_overhead.json"),
            script("scripts/cublas_gemmex_probe.py", f"{a.out}/cublas_gemmex_probe.json"),
            script("scripts/host_path_probe.py", f"{a.out}/host_path_probe.json"),
            script("scripts/served_path.py", f"{a.out}/served_path.json"),
            script("scripts/cutlass_host_cost.py", f"{a.out}/cutlass_host_cost.json")]


def _dispatch(a):
    table = a.eager_table
    heldout = [l2c("bench", f"dispatch:{table}", "--shapes", "heldout", "--dtype", dtype, "--protocol", "kernel,call",
                   "--reps", "5", "--iters", "10", "-o", f"{a.out}/dispatch_heldout_{dtype}.jsonl")
               for dtype in ("f16", "bf16")]   # the cells' held-out check: how often a cell's kernel loses inside
    inside = [l2c("bench", f"dispatch:{table}", "--shapes", str(ROOT / "benchmarks" / "range_inside.txt"), "--dtype",
                  dtype, "--protocol", "kernel,call", "--reps", "5", "--iters", "10", "-o",
                  f"{a.out}/dispatch_range_inside_{dtype}.jsonl")
              for dtype in ("f16", "bf16")]   # the token-count ranges' check at ragged M
    return [l2c("warmup", table), *heldout, *inside,
            l2c("bench", f"dispatch:{table}", "--shapes", "offgrid", "--protocol", "kernel,kernel_apart,call", "--reps",
                "5", "--iters", "10", "-o", f"{a.out}/dispatch_offgrid.jsonl"),
            l2c("bench", f"linear:{table}", "--shapes", "offgrid", "--protocol", "kernel,call", "--reps", "5",
                "--iters", "10", "-o", f"{a.out}/linear_offgrid.jsonl"),
            l2c("bench", f"dispatch:{table}", "--shapes", "grid", "--protocol", "kernel,kernel_apart,call",
                "--reps", "5", "--iters", "10", "-o", f"{a.out}/dispatch_grid.jsonl"),
            # what a served kernel after another library's kernel gains from overlapped launches, and what it loses
            ["env", "L2C_OVERLAP=0"] + l2c("bench", f"dispatch:{table}", "--shapes", "grid", "--protocol",
                                           "kernel_apart", "--reps", "5", "--iters", "10", "-o",
                                           f"{a.out}/dispatch_grid_apart_overlap0.jsonl")]


def _online(a):
    """`offgrid` through l2c.matmul and l2c.nn.Linear with online choice on (`L2C_TUNE=online`; the bench's first call
    of each shape waits for its tuning, whose decision is persisted), f16 and bf16, then what a caller's first calls
    cost while their shapes are tuned. The table alone on the same shapes is the `dispatch` stage."""
    online = ["env", "L2C_TUNE=online"]
    return [online + l2c("bench", f"{via}:{a.eager_table}", "--shapes", "offgrid", "--dtype", dtype, "--protocol",
                         "kernel,call", "--reps", "5", "--iters", "10", "-o",
                         f"{a.out}/{name}_offgrid_online_{dtype}.jsonl")
            for via, name in (("dispatch", "dispatch"), ("linear", "linear")) for dtype in ("f16", "bf16")] + \
        [script("scripts/online_first_call.py", "--count", "40", "--out", f"{a.out}/online_first_call_f16.json")]


def _as_shipped(a):
    """`offgrid` through l2c.matmul and l2c.nn.Linear as a user on this GPU gets them: no table named, so the shipped
    table serves only on the GPU it was measured on (elsewhere every call is torch's), then with online choice on
    (there, the shipped table's kernels timed on this GPU); f16, kernel and call."""
    runs = []
    for mode in ("off", "online"):
        for via, layout in (("dispatch", "row,row,row"), ("linear", "row,col,row")):
            runs.append(["env", f"L2C_TUNE={mode}"] + l2c(
                "bench", via, "--shapes", "offgrid", "--layout", layout, "--protocol", "kernel,call", "--reps", "5",
                "--iters", "10", "-o", f"{a.out}/as_shipped_{via}_offgrid_{mode}_f16.jsonl"))
    return runs


def _points_through(a, via: str, name: str, shapes: str = "points", table: str = ""):
    """The `shapes` set (`points` by default) through `via` (`dispatch`: l2c.matmul, `linear`: l2c.nn.Linear) with
    online choice on, so each point is the table's own entry (the eager table, or `table`), the best of the table's
    nearest prebuilt kernels that beat torch, or torch; f16 then bf16. A file already under --out is continued
    (`--resume`): its shapes are not measured again."""
    return [["env", "L2C_TUNE=online"] + l2c("bench", f"{via}:{table or a.eager_table}", "--shapes", shapes, "--dtype",
                                             dtype, "--protocol", "kernel,call", "--reps", "5", "--iters", "10", "-o",
                                             f"{a.out}/{name}_{dtype}.jsonl", "--resume")
            for dtype in ("f16", "bf16")]


def _points(a):
    """The measured points of neighbourhood cells (`l2c table --near`) in `a @ b`: the `points` set (shapes of
    `offgrid`'s distribution under 2 GFLOP, another seed) through l2c.matmul."""
    return _points_through(a, "dispatch", "points")


def _gpu_points(a):
    """The points of this GPU's own table (`l2c/tuned/<arch>.<gpu>.json`): `points` through l2c.matmul (`a @ b`) and
    through l2c.nn.Linear (nn.Linear's layout) with no table serving (`dispatch:none`, `linear:none`) and online
    choice timing the arch table's kernels, so each point is the best of them on this GPU or torch (about 11 minutes
    per dtype and layout on an H100). The table is then `l2c table ENV.jsonl --near gpu_points_*.jsonl
    gpu_linear_points_*.jsonl --protocol kernel,call --min-speedup 1.03` (README)."""
    return (_points_through(a, "dispatch", "gpu_points", table="none")
            + _points_through(a, "linear", "gpu_linear_points", table="none"))


def _gpu_serve(a):
    """The serving entries of this GPU's own table: the `serve` weights (1-512 tokens, nn.Linear's layout) through
    l2c.nn.Linear with no table serving and online choice timing the arch table's kernels, cold weights (the
    points); a candidate table of their wins (exact entries, token ranges); its served shapes measured again (the
    confirmation); each weight's winning kernels timed at every `serve` M of that weight through l2c.nn.Linear
    (serve_sweep.py's `entries` stage: the evidence for token ranges where the best kernel changes from one M to the
    next); the table of all three, where each kernel counts at its worst run; its served shapes measured again (a
    kernel the entries stage put in place of the confirmed one has one run there: a second, so that it too stands
    only where it won twice; this run adds `kernel_apart`, a launch after a torch kernel, which `l2c table` counts as
    `kernel`), the table remade with that run; and that table on `decode_between` (token counts it holds no entry
    for: its ranges' held-out check). The GPU's table then takes these files among its `sources` (README, "The
    H100's table"). About 15 minutes on an H100."""
    measure = ["--roofline", "--reps", "5", "--iters", "10"]
    common = ["--protocol", "kernel,call", *measure]
    points = [f"{a.out}/gpu_serve_points_{d}.jsonl" for d in ("f16", "bf16")]
    confirm = [f"{a.out}/gpu_serve_confirm_{d}.jsonl" for d in ("f16", "bf16")]
    entries = [f"{a.out}/serve_entries_{d}.jsonl" for d in ("f16", "bf16")]
    again = [f"{a.out}/gpu_serve_again_{d}.jsonl" for d in ("f16", "bf16")]
    table = ["--protocol", "kernel,call", "--min-speedup", "1.03", "--ranges"]

    def served_again(made, paths, protocols="kernel,call"):
        """`made`'s served `serve` shapes measured once more through l2c.nn.Linear, f16 then bf16."""
        return [l2c("bench", f"linear:{made}", "--shapes", "serve", "--only-served", "--dtype", d,
                    "--protocol", protocols, *measure, "-o", path) for d, path in zip(("f16", "bf16"), paths)]

    return ([["env", "L2C_TUNE=online"] + l2c("bench", "linear:none", "--shapes", "serve", "--dtype", d, *common,
                                             "-o", path, "--resume") for d, path in zip(("f16", "bf16"), points)]
            + [l2c("table", *points, *table, "-o", f"{a.out}/gpu_serve_candidates.json")]
            + served_again(f"{a.out}/gpu_serve_candidates.json", confirm)
            + [script("scripts/serve_sweep.py", "--out", a.out, "--dtype", d, "--stages", "entries", "--table",
                      f"{a.out}/gpu_serve_candidates.json", "--shapes", "serve", "--budget-s", "600")
               for d in ("f16", "bf16")]
            + [l2c("table", *points, *confirm, *entries, *table, "-o", f"{a.out}/gpu_serve_remade.json")]
            + served_again(f"{a.out}/gpu_serve_remade.json", again, "kernel,call,kernel_apart")
            + [l2c("table", *points, *confirm, *entries, *again, *table, "-o", f"{a.out}/gpu_serve_table.json")]
            + [l2c("bench", f"linear:{a.out}/gpu_serve_table.json", "--shapes", "decode_between", "--dtype", d,
                   *common, "-o", f"{a.out}/gpu_serve_between_{d}.jsonl") for d in ("f16", "bf16")])


def _points2(a):
    """More points where small calls are decided: the `points2` set (541 shapes under 1 GFLOP, another seed) through
    l2c.matmul, as `points` (about 5 minutes per dtype)."""
    return _points_through(a, "dispatch", "points2", "points2")


def _points_linear(a):
    """The same through l2c.nn.Linear (B the weight, column-major): the points of nn.Linear's neighbourhood cells,
    which the shipped table has none of yet."""
    return _points_through(a, "linear", "points_linear")


def _overlap(a):
    """Does an overlapped launch (programmatic dependent launch, `L2C_OVERLAP`) pay where a GEMM follows another
    library's kernel? The grid shapes the table serves, through l2c.matmul in `kernel` and `kernel_apart`, replayed
    in CUDA graphs and launched eagerly, with the launch overlapped and not; a Llama-8B-shaped Hugging Face model's
    prefill and decoding step (its GEMMs follow norms, attention and activations) against torch eager both ways;
    then the six corner-cell kernels around the shape where a neighbourhood cell lost
    (benchmarks/near_false_win.txt)."""
    out = []
    for overlap in ("measured", "0"):   # the default, and none
        env = ["env", f"L2C_OVERLAP={overlap}"]
        for mode, flags in (("graphs", []), ("eager", ["--no-graphs"])):
            out.append(env + l2c("bench", f"dispatch:{a.eager_table}", "--shapes", "grid", "--only-served",
                                 "--protocol", "kernel,kernel_apart", "--reps", "5", *flags, "-o",
                                 f"{a.out}/overlap{overlap}_grid_{mode}.jsonl"))
        out.append(env + script("examples/llama_e2e.py", "--out", f"{a.out}/overlap{overlap}_model_f16.json",
                                "--table", a.eager_table, "--dtypes", "fp16", "--sides", "torch_eager,l2c",
                                "--mlp-tokens", "", "--prefill", "128,512,2048", "--decode-batch", "1,8,32,128"))
    out.append(l2c("bench", f"serving:{ROOT / 'benchmarks' / 'cell_specs_f16.l2'}", "--shapes",
                   str(ROOT / "benchmarks" / "near_false_win.txt"), "--protocol", "kernel,kernel_apart", "--reps", "5",
                   "-o", f"{a.out}/near_false_win.jsonl"))
    return out


def _captured_overlap(a):
    """The captured-overlap rule (the call-plan shim: inside a CUDA-graph capture a planned launch overlaps only
    l2c's own previous launch) against the rule before it (`L2C_OVERLAP=measured-any`): what its driver query costs
    an eager launch, the C++ table in a replayed graph (dispatch_check), the grid's served shapes in `kernel` and
    `kernel_apart` replayed in CUDA graphs, and a Llama-8B-shaped model's decoding step, f16."""
    out = [script("scripts/capture_query_cost.py", f"{a.out}/capture_query_cost.json"),
           script("scripts/dispatch_check.py", "--out", f"{a.out}/dispatch_check.json")]
    for overlap in ("measured", "measured-any"):
        env = ["env", f"L2C_OVERLAP={overlap}"]
        out.append(env + l2c("bench", f"dispatch:{a.eager_table}", "--shapes", "grid", "--only-served", "--dtype",
                             "f16", "--protocol", "kernel,kernel_apart", "--reps", "5", "-o",
                             f"{a.out}/captured_overlap_{overlap}_grid_graphs.jsonl"))
        out.append(env + script("examples/llama_e2e.py", "--out", f"{a.out}/captured_overlap_{overlap}_model_f16.json",
                                "--table", a.eager_table, "--dtypes", "fp16", "--sides", "torch_eager,l2c",
                                "--mlp-tokens", "", "--prefill", "", "--decode-batch", "1,32,128"))
    return out


def _near_check(a):
    """The shipped table's cells on shapes they were not made from: `offgrid` and `heldout`, f16 and bf16."""
    return [l2c("bench", f"dispatch:{a.eager_table}", "--shapes", shapes, "--dtype", dtype, "--protocol", "kernel,call",
                "--reps", "5", "--iters", "10", "-o", f"{a.out}/dispatch_{shapes}_{dtype}.jsonl")
            for shapes in ("offgrid", "heldout") for dtype in ("f16", "bf16")]


def _evidence(a):
    """Every entry of both tables through the dispatcher at its own shapes, in `kernel` and `call`: what
    `l2c table --protocol kernel,call` makes the default table from (README, "Two tables ship"); each row records
    the serving entry's spec (`served_spec`), so the rebuild may overwrite the table it measured."""
    sys.path.insert(0, str(ROOT))
    from l2c.tuned_table import load_table, served_problem_shapes
    out = [l2c("warmup", a.eager_table, a.graphs_table)]   # every kernel built and verified first, in parallel
    for name, table in (("eager", a.eager_table), ("graphs", a.graphs_table)):
        loaded = load_table(table)
        for dtype in ("f16", "bf16"):
            for via, layout in (("dispatch", "row,row,row"), ("linear", "row,col,row")):
                if served_problem_shapes(loaded, dtype, layout):
                    out.append(l2c("bench", f"{via}:{table}", "--shapes", "served", "--dtype", dtype, "--layout",
                                   layout, "--protocol", "kernel,call", "--reps", "5", "--iters", "10", "-o",
                                   f"{a.out}/evidence_{name}_{dtype}_{via}.jsonl"))
    return out


def _cells(a):
    """The corner evidence of cells: each of the narrow CUTLASS kernels that win the tables' small shapes, served by
    `l2c.matmul` at every grid corner under 1 GFLOP (M also 16 and 32), and at M = 1, 2, 4, 8 below those corners;
    the swapped decoding kernels (64 wide along N) at M = 1-16 where N >= 2048; the gemv family with B row-major
    at M = 1-16 (on tensor cores where N >= 2048 and K >= 1024); f16 and bf16: `l2c table --cells`
    makes the default table's cells from it (README, "Two tables ship")."""
    return [l2c("bench", f"serving:{ROOT / 'benchmarks' / specs.format(dtype=dtype)}", "--shapes",
                str(ROOT / "benchmarks" / corners), "--protocol", "kernel,call", "--reps", "5", "--iters", "10", "-o",
                f"{a.out}/{name}_{dtype}.jsonl")
            for specs, corners, name in (("cell_specs_{dtype}.l2", "cell_corners.txt", "cells"),
                                         ("cell_specs_{dtype}.l2", "cell_corners_small_m.txt", "cells_small_m"),
                                         ("cell_specs_swapped_{dtype}.l2", "cell_corners_wide.txt", "cells_wide"),
                                         ("cell_specs_gemv_{dtype}.l2", "cell_corners_gemv.txt", "cells_gemv"),
                                         ("cell_specs_tensorgemv_{dtype}.l2", "cell_corners_gemv_wide.txt",
                                          "cells_tensorgemv"))
            for dtype in ("f16", "bf16")]


def _serve_kernel(a):
    """#20's measurement: the `serve` set through l2c.nn.Linear with the graphs table, `kernel`, cold weights and
    fraction of roofline, f16 then bf16: (commands, result paths)."""
    paths = [f"{a.out}/serve_kernel_{d}.jsonl" for d in ("f16", "bf16")]
    return [l2c("bench", f"linear:{a.graphs_table}", "--shapes", "serve", "--dtype", d, "--protocol", "kernel",
                "--roofline", "--reps", "7", "-o", path) for d, path in zip(("f16", "bf16"), paths)], paths


def _serve(a):
    return [*_serve_kernel(a)[0],
            l2c("bench", f"linear:{a.eager_table}", "--shapes", "serve", "--protocol", "call", "--iters", "20",
                "-o", f"{a.out}/serve_call_f16.jsonl")]


def _bars(a):
    """The open issues' done-when figures, each as its issue measures it, in the order the issues come: #16
    `offgrid` through l2c.matmul with the table this GPU's users get (kernel and call, f16 and bf16); #20 the `serve`
    set through l2c.nn.Linear with the graphs table (kernel, cold weights, fraction of roofline) and its summary;
    #21 the gated MLP block at 1-8192 tokens against torch eager and max-autotune. About 9 minutes on an H200;
    `--total-s` cuts it where the device call ends."""
    issue16 = [_issue16_file(a, "offgrid", d) for d in ("f16", "bf16")]
    issue20, serve = _serve_kernel(a)
    issue20.append(script("scripts/serve_summary.py", *serve, "-o", f"{a.out}/serve_summary.json"))
    issue21 = [script("examples/llama_e2e.py", "--out", f"{a.out}/mlp.json", "--table", a.graphs_table,
                      "--mlp-tokens", "1,16,128,512,2048,8192", "--prefill", "", "--decode-batch", "",
                      "--dtypes", "fp16", "--sides", "torch_eager,torch_max_autotune,l2c")]
    return issue16 + issue20 + issue21


def _issue16_file(a, shapes: str, dtype: str) -> List[str]:
    """One of #16's files: `shapes` through l2c.matmul with the table this GPU's users get, `kernel` and `call`."""
    return l2c("bench", f"dispatch:{a.eager_table}", "--shapes", shapes, "--dtype", dtype, "--protocol", "kernel,call",
               "--reps", "5", "--iters", "10", "-o", f"{a.out}/dispatch_{shapes}_{dtype}.jsonl")


def _grid16(a):
    """#16's grid file: the 1,000-shape grid (f16; about 4 minutes on an H200)."""
    return [_issue16_file(a, "grid", "f16")]


def _graphs16(a):
    """#16's CUDA-graphs files: `offgrid` and the grid through l2c.matmul with the graphs table (`--graphs-table`),
    `kernel` only (graph replay is the only use of that table); each file is named after the table's file."""
    tag = Path(a.graphs_table).name.split(".")[0]
    return [l2c("bench", f"dispatch:{a.graphs_table}", "--shapes", shapes, "--protocol", "kernel", "--reps", "5",
                "-o", f"{a.out}/{tag}_{shapes}_f16.jsonl")
            for shapes in ("offgrid", "grid")]


def _sweep(a):
    return [script("scripts/serve_sweep.py", "--out", a.out, "--dtype", "f16", "--stages", "explore,gemv,cutlass",
                   "--budget-s", "150"),
            script("scripts/serve_sweep.py", "--out", a.out, "--dtype", "bf16", "--stages", "gemv,cutlass",
                   "--top-from", f"{a.out}/serve_gemv_explore_f16.jsonl")]


def _gemv_check(a):
    return [script("scripts/gemv_check.py", "--out", f"{a.out}/gemv_check.json")]


def _gemv(a):
    return [*_gemv_check(a),
            *(script("scripts/serve_sweep.py", "--out", a.out, "--dtype", dtype, "--stages", "cudagemv", "--max-m", "8",
                     "--build-jobs", str(os.cpu_count() or 8), "--budget-s", "120")
              for dtype in ("f16", "bf16")),
            *(script("scripts/serve_sweep.py", "--out", a.out, "--dtype", dtype, "--stages", "tensorgemv", "--max-m",
                     "16", "--build-jobs", str(os.cpu_count() or 8), "--budget-s", "90")
              for dtype in ("f16", "bf16"))]


def _widegemv_fit(a):
    """Whether a ring grid's fit on the GPU decides wide N: every ring depth of every CUDA-core tile and slice count
    at benchmarks/widegemv_fit.txt (M = 1-2, N 4096-14336), f16, `kernel` (about 3 minutes), then the ring
    configurations and cuBLAS under Nsight Compute at three of those shapes (scripts/ring_profile.py)."""
    ncu = ["/usr/local/cuda/bin/ncu", "--profile-from-start", "off", "--nvtx", "--print-nvtx-rename", "kernel",
           "--section", "SpeedOfLight", "--section", "Occupancy", "--section", "LaunchStats",
           "--section", "MemoryWorkloadAnalysis", "--section", "WarpStateStats", "--section", "SchedulerStats",
           "--log-file", f"{a.out}/ncu_ring.txt"]
    return [script("scripts/widegemv_sweep.py", "--out", a.out, "--fit", str(ROOT / "benchmarks" / "widegemv_fit.txt"),
                   "--dtypes", "f16", "--budget-s", "150"),
            ncu + script("scripts/ring_profile.py")]


def _widegemv_points(a):
    """The ring configurations that the fit found best per tile m class (benchmarks/results/s43's H100 fit: a ring
    shallow enough that its clusters fit one wave) at every `points` shape of M = 1-2, kernel and call, f16 then
    bf16 (about 8 minutes): evidence for `l2c table --near`."""
    fit = ROOT / "benchmarks" / "results" / "s43" / "widegemv_fit_f16_h100.jsonl.xz"
    return [script("scripts/widegemv_sweep.py", "--out", a.out, "--from-fit", str(fit), "--budget-s", "480")]


def _widegemv(a):
    """Wide-column gemv kernels (64-256 columns per block, B row-major; on CUDA cores through the shared-memory ring)
    against cuBLAS at M <= 8 in `a @ b`, through l2c.matmul: the ring's GPU check (`gemv_check.py --only ring`), a
    sample of the `points` shapes, then the best configurations at the other points, f16 and bf16
    (scripts/widegemv_sweep.py; about 8 minutes)."""
    return [script("scripts/gemv_check.py", "--only", "ring", "--out", f"{a.out}/gemv_ring_check.json"),
            script("scripts/widegemv_sweep.py", "--out", a.out, "--budget-s", "420")]


# The plain CUTLASS GEMM entries whose twin with `epilogue store=direct` is valid (rule direct-store).
STORE_WHERE = ("--where", "target=cutlass", "--where", "launch_family=gemm", "--where", "epilogue_bias=none",
               "--where", "epilogue_activation=none", "--where", "epilogue_store=tma")
# Which table entries each store is paired on: the direct store (plain epilogues, wins only on small outputs) on the
# default table's entries under 1 GFLOP; the staged store (to replace the TMA store, for its build time) on entries of
# every size.
STORE_SETS = {
    "direct": {"default": ("sm_90.json", ("--max-gflop", "1", "--per-spec", "3")),
               "graphs": ("sm_90_graphs.json", ("--where", "layout_b=col", "--per-spec", "2"))},
    "staged": {"default": ("sm_90.json", ("--per-spec", "2")),
               "graphs": ("sm_90_graphs.json", ("--where", "layout_b=col", "--per-spec", "2"))},
}


def _store_study(a, store: str):
    """`epilogue store=STORE` against the same kernels with the TMA store, paired side by side with torch
    (scripts/table_variant.py, then scripts/variant_pairs.py): the default table's plain CUTLASS GEMM entries (`kernel`
    and `call`) and the graphs table's nn.Linear ones (`kernel` with cold weights), selected per STORE_SETS. The B
    kernels are built first in parallel (`l2c build`: cache hits where the build cache holds them, e.g. unpacked from
    a tarball made here), the A side's come from the shipped pack; the bench verifies each before it times it."""
    tables, out = ROOT / "l2c" / "tuned", []
    sets = STORE_SETS[store]
    for name, (table, select) in sets.items():
        for side, change in (("a", ()), ("b", ("--set", f"epilogue_store={store}"))):
            out.append(script("scripts/table_variant.py", str(tables / table), *STORE_WHERE, *select,
                              *change, "-o", f"{a.out}/{store}_{name}_{side}.json", "--specs-out",
                              f"{a.out}/{store}_{name}_{side}.l2"))
    out.append(l2c("build", *(f"{a.out}/{store}_{name}_b.l2" for name in sets), "--target", "cutlass", "-j", "16"))
    for name, protocol in (("default", ("--protocol", "kernel,call", "--iters", "10")),
                           ("graphs", ("--protocol", "kernel", "--roofline"))):
        pair = (f"{a.out}/{store}_{name}_a.json", f"{a.out}/{store}_{name}_b.json")
        out += [l2c("bench", *pair, *protocol, "--reps", "5", "-o", f"{a.out}/{store}_store_{name}.jsonl"),
                script("scripts/variant_pairs.py", f"{a.out}/{store}_store_{name}.jsonl", "--a", pair[0], "--b",
                       pair[1], "--out", f"{a.out}/{store}_store_{name}_summary.json")]
    return out


def _direct_store(a):
    """The direct store's study (about a minute and a half on the H200 with its kernels in the cache)."""
    return _store_study(a, "direct")


def _staged_store(a):
    """l2c's staged epilogue: its GPU check (`cutlass_gpu_check.py --only staged`: thirteen specs over the
    schedules, layouts, C, biases, activations, f32 output, swap=yes, split-K and stream-K, column halves at 96-256
    wide, verified then timed), #19's build part on this host with the TMA store and with the staged one (32 pack
    kernels each), then the study, whose benches are the longest part."""
    return [script("scripts/cutlass_gpu_check.py", "--only", "staged", "--out", f"{a.out}/staged_gpu_check.json"),
            *(script("scripts/zero_wait.py", "--parts", "build", "--build-store", store, "--out",
                     f"{a.out}/zero_wait_build_{store}.json") for store in ("tma", "staged")),
            *_store_study(a, "staged")]


STAGED_WHOLE_WHERE = ("--where", "target=cutlass", "--where", "launch_family=gemm", "--where", "epilogue_store=tma")


def _staged_tables(a):
    """The shipped tables with every CUTLASS GEMM entry's staged twin (`table_variant.py --whole`), the twins built on
    this host's cores, then each table against its twin side by side with torch: `l2c.matmul` on `offgrid` and
    `heldout` (`kernel`, `call`), nn.Linear on `serve` (`kernel`, cold weights): whether the tables should switch."""
    out = []
    for name, table in (("default", a.eager_table), ("graphs", a.graphs_table)):
        out.append(script("scripts/table_variant.py", table, "--whole", *STAGED_WHOLE_WHERE, "--set",
                          "epilogue_store=staged", "-o", f"{a.out}/staged_whole_{name}.json", "--specs-out",
                          f"{a.out}/staged_whole_{name}.l2"))
    out.append(l2c("build", f"{a.out}/staged_whole_default.l2", f"{a.out}/staged_whole_graphs.l2", "--target",
                   "cutlass", "-j", str(os.cpu_count() or 16)))
    for shapes in ("offgrid", "heldout"):
        for dtype in ("f16", "bf16"):
            out.append(l2c("bench", f"dispatch:{a.eager_table}", f"dispatch:{a.out}/staged_whole_default.json",
                           "--shapes", shapes, "--dtype", dtype, "--protocol", "kernel,call", "--reps", "5",
                           "--iters", "10", "-o", f"{a.out}/staged_dispatch_{shapes}_{dtype}.jsonl"))
    out.append(l2c("bench", f"linear:{a.graphs_table}", f"linear:{a.out}/staged_whole_graphs.json", "--shapes",
                   "serve", "--protocol", "kernel", "--roofline", "--reps", "5", "-o",
                   f"{a.out}/staged_serve_f16.jsonl"))
    return out


def _unswapped(a):
    return [script("scripts/serve_sweep.py", "--out", a.out, "--dtype", dtype, "--stages", "unswapped", "--min-m", "48",
                   "--max-m", "512", "--build-jobs", str(os.cpu_count() or 8), "--budget-s", "330")
            for dtype in ("f16", "bf16")]


def _unswapped_grid(a):
    """The unswapped stage on the grid's `a @ b` shapes of 64-1024 rows with N >= 1024 and K >= 512 (B row-major),
    f16 then bf16 (about 2 minutes each on the H200 machine, most of it building)."""
    return [script("scripts/serve_sweep.py", "--out", a.out, "--dtype", dtype, "--stages", "unswapped", "--shapes",
                   "grid", "--layout", "row,row,row", "--min-m", "64", "--max-m", "1024", "--min-n", "1024", "--min-k",
                   "512", "--build-jobs", str(os.cpu_count() or 8), "--budget-s", "400")
            for dtype in ("f16", "bf16")]


def _decode(a):
    """The decode step replays CUDA graphs, so it is measured with the graphs table (and, for comparison, the
    default one)."""
    graphs = ["env", f"L2C_TUNED_TABLE={a.graphs_table}"]
    with_graphs_table = [graphs + script("examples/decode_step.py", "--dtype", dtype, "--out",
                                         f"{a.out}/decode_step_{dtype}.json") for dtype in ("f16", "bf16")]
    return with_graphs_table + [script("examples/decode_step.py", "--out",
                                       f"{a.out}/decode_step_f16_default_table.json")]


def _mlp(a):
    return [script("examples/mlp_block.py", "--tokens", "16,128,512,2048,8192", "--out", f"{a.out}/mlp_block.json")]


def _model(a):
    return [script("examples/llama_e2e.py", "--out", f"{a.out}/model_h200.json", "--table", a.graphs_table)]


def _gated(a):
    return [script("scripts/serve_sweep.py", "--out", a.out, "--dtype", dtype, "--stages", "gated")
            for dtype in ("f16", "bf16")]


def _gated_cutlass(a):
    """The CUTLASS target's gated GEMM: its GPU check (`cutlass_gpu_check.py --only gated`: five specs over the
    schedules, both gates, a bias, bf16 and clusters, at ragged M and K), then its tiles against torch's gated
    projection (the module's two GEMMs) for the Llama-8B gate_up weight at 64-8192 tokens, f16 and bf16."""
    tokens = "64,128,192,256,384,512,768,1024,2048,4096,8192"
    return [script("scripts/cutlass_gpu_check.py", "--only", "gated", "--out", f"{a.out}/gated_gpu_check.json")] + [
        script("scripts/serve_sweep.py", "--out", a.out, "--dtype", dtype, "--stages", "gated", "--gated-targets",
               "cutlass", "--gated-tokens", tokens) for dtype in ("f16", "bf16")]


def _grid(a):
    return [l2c("bench", "torch", a.eager_table, "--shapes", "grid", "--protocol", "kernel,kernel_apart,call", "-o",
                f"{a.out}/grid.jsonl", "--resume"),
            l2c("report", f"{a.out}/grid.jsonl", "-o", f"{a.out}/grid_report")]


def _clusters(a):
    return [script("scripts/cluster_occupancy.py", "--out", f"{a.out}/cluster_occupancy.json")]


def _cublas(a):
    return [script("scripts/cublas_kernels.py", "--shapes", "llm", "--b-col", "--out", f"{a.out}/cublas_llm.json")]


def _zerowait(a):
    return [script("scripts/zero_wait.py", "--out", f"{a.out}/zero_wait_h200.json")]


STAGES: Dict[str, Stage] = {
    "check": Stage("generated kernels verified on the GPU: random and fixed Triton specs, CUTLASS specs, one spec "
                   "on both targets, l2c.matmul through a tuned table (served kernels, autograd), l2c's checker "
                   "against l2c.verify (faults injected), every shipped CUTLASS-target kernel in chains of calls "
                   "with and without overlapping launches", _check),
    "call_checks": Stage("what a served call relies on, quickly (about 2 minutes): l2c's checker against l2c.verify "
                         "with faults injected, and l2c.matmul through the default table (served kernels, autograd, "
                         "a side stream, a CUDA graph, workspaces on two streams, a declined signature)",
                         _call_checks),
    "overhead": Stage("host cost per call of the kernels' call paths against torch.matmul, and of each step inside "
                      "a CUTLASS kernel's entry point", _overhead),
    "dispatch": Stage("l2c.matmul and l2c.nn.Linear with the default table on shapes no table was tuned for "
                      "(heldout: the cells' held-out check, f16 and bf16; offgrid) and on the grid, kernel and call "
                      "protocols (and kernel_apart on offgrid and the grid)", _dispatch),
    "online": Stage("l2c.matmul and l2c.nn.Linear on `offgrid` with online choice (L2C_TUNE=online: the table's "
                    "nearest prebuilt CUTLASS kernels timed per new shape), kernel and call, f16 and "
                    "bf16, and the first calls while tuning", _online),
    "as_shipped": Stage("l2c.matmul and l2c.nn.Linear on `offgrid` with no table named, as a user of this GPU gets "
                        "them (on a GPU the shipped table was not measured on, every call is torch's), then with "
                        "online choice (the shipped table's kernels timed here), f16, kernel and call", _as_shipped),
    "points": Stage("the measured points of neighbourhood cells: the `points` shapes through l2c.matmul with online "
                    "choice, kernel and call, f16 and bf16 (`l2c table --near` makes cells from them)", _points),
    "gpu_points": Stage("the points of this GPU's own table: `points` through l2c.matmul and l2c.nn.Linear with no "
                        "table serving and online choice timing the arch table's kernels, f16 and bf16", _gpu_points),
    "gpu_serve": Stage("the serving entries of this GPU's own table: the `serve` weights at 1-512 tokens through "
                       "l2c.nn.Linear with online choice (cold weights), the candidate table's wins measured again, "
                       "each weight's winning kernels at all its token counts, the table of the three and its "
                       "held-out check on `decode_between`", _gpu_serve),
    "points2": Stage("a second, denser draw of points under 1 GFLOP (`points2`) through l2c.matmul with online "
                     "choice, f16 and bf16", _points2),
    "points_linear": Stage("the same points through l2c.nn.Linear (nn.Linear's layout), kernel and call, f16 and bf16",
                           _points_linear),
    "near_check": Stage("the neighbourhood cells on shapes they were not made from: offgrid and heldout, f16 and "
                        "bf16, kernel and call (about 2 minutes)", _near_check),
    "overlap": Stage("the overlapped launch where a GEMM follows another library's kernel: the grid's served shapes "
                     "in kernel and kernel_apart, graphs and eager, L2C_OVERLAP measured and 0; a Llama-shaped "
                     "model's prefill and decode both ways; the corner-cell kernels around the neighbourhood cells' "
                     "false win", _overlap),
    "captured_overlap": Stage("the captured-overlap rule against `measured-any`: its eager query cost, the C++ "
                              "table in a replayed graph, the served grid in kernel and kernel_apart under CUDA "
                              "graphs, a Llama-shaped model's decode step", _captured_overlap),
    "evidence": Stage("every entry of both tables through l2c.matmul / l2c.nn.Linear at its own shapes, kernel and "
                      "call protocols: `l2c table --protocol kernel,call` makes the default table from it", _evidence),
    "cells": Stage("the corner evidence of cells: narrow CUTLASS kernels served by l2c.matmul at every grid corner "
                   "under 1 GFLOP, kernel and call, f16 and bf16 (about 20 minutes)", _cells),
    "bars": Stage("the open issues' done-when figures in one run (about 9 minutes on an H200): #16 `offgrid` "
                  "through l2c.matmul, #20 the `serve` set through l2c.nn.Linear with the graphs table and its "
                  "summary, #21 the gated MLP block against eager and max-autotune", _bars),
    "grid16": Stage("#16's grid file: the grid through l2c.matmul with the users' table, kernel and call (f16)",
                    _grid16),
    "graphs16": Stage("#16's graphs-table files: `offgrid` and the grid through l2c.matmul with --graphs-table, "
                      "kernel (f16)", _graphs16),
    "serve": Stage("l2c.nn.Linear on the decoding set (29 weights x 15 token counts): the graphs table with cold "
                   "weights and fraction of roofline (f16, bf16), the eager table in the call protocol", _serve),
    "sweep": Stage("search decoding kernels per weight (gemv and swapped CUTLASS families) into JSON lines that "
                   "`l2c table --ranges` turns into table entries", _sweep),
    "gemv_check": Stage("the CUTLASS target's gemv family verified on the GPU (20 specs, the gated ones included; "
                        "about a minute): the first command of `gemv`", _gemv_check),
    "gemv": Stage("the CUTLASS target's gemv family: verified on the GPU (both layouts of B, CUDA and tensor cores, "
                  "every epilogue, clusters), then swept on the decoding set (CUDA cores at M <= 8, tensor cores at "
                  "M <= 16; f16, bf16) into JSON lines for `l2c table`",
                  _gemv),
    "widegemv": Stage("wide-column gemv kernels (B row-major, the CUDA-core ones through the shared-memory ring) at "
                      "the `points` shapes with M <= 8 in `a @ b`: the ring's GPU check, a sample, then the best at "
                      "the rest; f16 and bf16 (evidence for `l2c table --near`)", _widegemv),
    "widegemv_fit": Stage("every ring depth of the wide gemv at eight wide-N shapes (M = 1-2), then its grids and "
                          "cuBLAS's under Nsight Compute: does the clusters' fit on the GPU decide wide N?",
                          _widegemv_fit),
    "widegemv_points": Stage("the wide gemv configurations the fit ranked best (any ring depth) at the `points` "
                             "shapes of M = 1-2 in `a @ b`, kernel and call, f16 and bf16 (evidence for `l2c table "
                             "--near`)", _widegemv_points),
    "direct_store": Stage("CUTLASS GEMMs with `epilogue store=direct` (no shared memory in the epilogue) against the "
                          "same kernels with the TMA store, paired: the default table's small entries and the graphs "
                          "table's nn.Linear ones", _direct_store),
    "staged_store": Stage("l2c's staged epilogue (`epilogue store=staged`) verified on the GPU, then against the same "
                          "kernels with the TMA store, paired: plain entries of every size of both tables (its build "
                          "is a third shorter; this decides whether it can replace the TMA store)", _staged_store),
    "unswapped": Stage("search CUTLASS tiles with the tokens on the MMA's M side and the grid sized to whole waves of "
                       "the SMs on the decoding set at 48-512 tokens (f16, bf16) into JSON lines for `l2c table`",
                       _unswapped),
    "staged_tables": Stage("the shipped tables against their twins with every CUTLASS GEMM entry on the staged "
                           "epilogue, through l2c.matmul (offgrid, heldout) and nn.Linear (serve): whether to switch",
                           _staged_tables),
    "unswapped_grid": Stage("the unswapped stage's wave-sized CUTLASS tiles on the grid's `a @ b` shapes of 64-1024 "
                            "rows (N >= 1024, K >= 512, f16 and bf16) into JSON lines for `l2c table`",
                            _unswapped_grid),
    "decode": Stage("a Llama-8B decoding step's linears under CUDA graphs, batch 1-256", _decode),
    "mlp": Stage("the end-to-end MLP block example, torch against l2c.nn", _mlp),
    "gated": Stage("search fused gated (SwiGLU) kernels for the Llama-8B gate_up weights at 1-8192 tokens, f16 and "
                   "bf16, into JSON lines for `l2c table`", _gated),
    "gated_cutlass": Stage("the CUTLASS target's gated GEMM verified on the GPU, then its tiles against torch's gated "
                           "projection at 64-8192 tokens, f16 and bf16 (about 4 minutes)", _gated_cutlass),
    "model": Stage("a Llama-3.1-8B-shaped Hugging Face LlamaForCausalLM: MLP block, prefill and decode, torch eager, "
                   "max-autotune, l2c, l2c under torch.compile (examples/llama_e2e.py)", _model),
    "grid": Stage("the 1,000-shape grid: cuBLAS against itself (the noise floor) and the eager table", _grid),
    "clusters": Stage("how many thread-block clusters of each size the GPU runs at once (a clustered kernel's waves)",
                      _clusters),
    "cublas": Stage("which kernels cuBLAS runs on the decoding shapes (its tiles, split-K)", _cublas),
    "zerowait": Stage("issue #19 with empty caches: first calls of a prebuilt kernel (a first and a later process) "
                      "and of an unbuilt one against torch, CUTLASS build seconds per kernel, a one-shape l2c "
                      "tune's wall time", _zerowait),
}


def users_table() -> Path:
    """The table `l2c.matmul` serves from on this machine's GPU (sm_90.json where no GPU is visible)."""
    sys.path.insert(0, str(ROOT))
    import torch
    from l2c.dispatch import default_table_path
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return default_table_path("sm_90", gpu) or ROOT / "l2c" / "tuned" / "sm_90.json"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stages", nargs="*", help="stages to run, in order (see --list)")
    p.add_argument("--list", action="store_true", help="list the stages and exit")
    p.add_argument("--out", default="out", help="where results, logs and stages.json go (default out/)")
    p.add_argument("--eager-table", default=None, help="default: the table l2c.matmul reads on this GPU "
                                                       "(L2C_TUNED_TABLE, else the one shipped for it: on an H100 "
                                                       "its own, whose kernels the H200's table does not serve)")
    p.add_argument("--graphs-table", default=str(ROOT / "l2c" / "tuned" / "sm_90_graphs.json"))
    p.add_argument("--total-s", type=float, default=None, help="stop the whole run after this many seconds (the "
                                                               "command then running is cut, what it wrote stays, "
                                                               "the later ones are skipped; leave a minute under the "
                                                               "device machine's per-call limit for the bundle)")
    p.add_argument("--limit-s", type=float, default=None, help="stop each command after this many seconds "
                                                               "(what it wrote so far stays)")
    p.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    p.add_argument("--start-from", action="append", default=[], metavar="NAME=FILE",
                   help="before the stages, write FILE (results, .jsonl or .jsonl.xz) to --out/NAME, so that a "
                        "stage writing NAME with --resume continues it (e.g. points_f16.jsonl=a committed part)")
    p.add_argument("--bundle", default=None, help="after each command, write every file under --out into this "
                                                  ".tar.xz (on the device machine: --out /tmp/run --bundle "
                                                  "$OUT/results.tar.xz, one file to bring back)")
    args = p.parse_args(argv)
    if args.list or not args.stages:
        for name, stage in STAGES.items():
            print(f"{name:<9} {stage.doc}")
        return 0
    if args.eager_table is None:
        args.eager_table = str(users_table())
    unknown = [s for s in args.stages if s not in STAGES]
    if unknown:
        p.error(f"unknown stage(s) {', '.join(unknown)}; --list shows them")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.start_from:
        name, _, source = seed.partition("=")
        if not name or "/" in name or not source:
            p.error(f"--start-from {seed!r}: expected NAME=FILE, NAME a file name under --out")
        if not args.dry_run:
            start_from(Path(source), out / name)
    record_path = out / "stages.json"
    records = json.loads(record_path.read_text()) if record_path.exists() else []
    failed = 0
    run_start = time.monotonic()
    for name in args.stages:
        for command in STAGES[name].commands(args):
            shown = " ".join(command)
            if args.dry_run:
                print(shown)
                continue
            timeout = command_timeout(args.limit_s, args.total_s, time.monotonic() - run_start)
            if timeout is not None and timeout <= 0:
                print(f"[{name}] skipped: --total-s {args.total_s:g} spent", flush=True)
                records.append({"stage": name, "command": shown, "rc": None, "seconds": 0.0})
                record_path.write_text(json.dumps(records, indent=1) + "\n")
                continue
            print(f"[{name}] {shown}", flush=True)
            start = time.monotonic()
            with open(out / f"{name}.log", "a") as log:
                log.write(f"$ {shown}\n")
                log.flush()
                try:
                    rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                        timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1")).returncode
                except subprocess.TimeoutExpired:
                    rc = 124
            seconds = time.monotonic() - start
            failed += rc != 0
            print(f"[{name}] exit {rc} after {seconds:.0f} s", flush=True)
            records.append({"stage": name, "command": shown, "rc": rc, "seconds": round(seconds, 1)})
            record_path.write_text(json.dumps(records, indent=1) + "\n")
            if args.bundle:
                bundle(out, Path(args.bundle))
    return 1 if failed else 0


def command_timeout(limit_s: float | None, total_s: float | None, elapsed_s: float) -> float | None:
    """The next command's time limit: its own limit, cut to what is left of the whole run's (None: no limit)."""
    left = None if total_s is None else total_s - elapsed_s
    if limit_s is None:
        return left
    return limit_s if left is None else min(limit_s, left)


def start_from(source: Path, target: Path) -> None:
    """`target` holds the rows of `source` (unpacked where it is .xz), unless it exists already."""
    import lzma
    if target.exists():
        return
    opener = lzma.open if source.suffix == ".xz" else open
    with opener(source, "rb") as src, open(target, "wb") as dst:
        dst.write(src.read())


def bundle(out: Path, path: Path) -> None:
    """Every file under `out` in one .tar.xz at `path`, rewritten after each command (so a run cut short keeps what
    finished): the device machine returns a few files only."""
    import tarfile
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, "w:xz") as tar:
        for f in sorted(out.rglob("*")):
            if f.is_file() and f.resolve() not in (path.resolve(), partial.resolve()):
                tar.add(f, arcname=str(f.relative_to(out)))
    partial.replace(path)


if __name__ == "__main__":
    sys.exit(main())
