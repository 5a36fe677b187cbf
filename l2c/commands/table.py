"""`l2c table RESULTS.jsonl -o TABLE.json`: a tuned table from measured bench results.

For every shape, the fastest verified candidate of the results file (one protocol) becomes the table entry,
if its speedup over torch.matmul is at least `--min-speedup`. Choosing the best of several candidates on the
same measurements favours lucky draws (a winner's curse), so the default margin, 1.05, is the run-to-run
spread of identical kernels on the H200: an entry that clears it is a win, not noise. The table has the
format of docs/CONTRACTS.md, which `l2c.matmul`, `l2c bench` and `l2c tune --export` share.

`--ranges` adds token-count ranges (docs/CONTRACTS.md, the dispatch rule): where one shape-generic kernel won by
the margin at three or more consecutive measured token counts M of the same (N, K, dtype, layouts) — consecutive
among every M measured there, so a loss in between breaks the run — an entry with `m_range` [first, last] serves
every M in between, measured or not.

`--cells` adds cells (docs/CONTRACTS.md, the dispatch rule): where one kernel generic in M, N and K qualifies as an
entry (won by the margin; with several protocols, by the margin in one and slower in none) at each of the eight
corners of a box whose sides join consecutive values of M, N and K at which that kernel was measured (same dtype,
layouts, batch), an entry with `m_range`, `n_range` and `k_range` serves every shape inside the box. The box's
shapes all launch the kernel's tiles in one number of waves (`launch_waves`: clusters counted in how many of their
size the GPU runs at once); its tiles are at most 16 wide along N (`MAX_CELL_TILE_N`), or wider in a box whose N
starts at 32 of its tiles or more and whose K starts at 1024 or more (`WIDE_CELL_MIN_TILES`, `WIDE_CELL_MIN_K`).
Where several kernels qualify, the one with the best worst corner; its figures are that worst corner's. No cell
holds a shape where its kernel lost: among the sources, or, with `--near`, among the points in device time.

`--near POINTS...` adds neighbourhood cells (docs/CONTRACTS.md, the dispatch rule) from shapes measured at random
(`--shapes points`, each through `l2c.matmul` with online choice: the table's entry, the best of its nearest
prebuilt kernels that beat torch, or torch): boxes half an octave wide along M, N and K, on a lattice
(`NEAR_M_EDGES`, `NEAR_NK_EDGES`) and on the same shifted a quarter octave (`NEAR_LATTICES`); a box is served by one
shape-generic kernel where the NEAR_COUNT measured shapes nearest its centre (within NEAR_RADIUS octaves, at least
NEAR_SUPPORT of them) were all won by some kernel, two in three of them by that one, at shapes on both sides of the
box along each axis, in one number of launch waves across the box (a gemv kernel: in one number of row tiles, each
of which streams the whole weight); a shape where a kernel failed, or where torch
served without online tuning's timings, counts as lost; a candidate online tuning timed at a shape (the row's
`online_timings`) won it from NEAR_TIMED_MARGIN on, and lost it below that or where online choice then left the
shape to torch (a kernel it did not time there may have won it in another row). Those rows make no other entry
(among the sources their ragged shapes would cut the corner cells' boxes); the table records them under `near`,
and marks the cells `near`, which serve only where no exact entry, range or corner cell does.

`--protocol kernel,call` asks for evidence in both: a candidate (one spec at one shape) qualifies only with rows in
every named protocol, none of them slower than torch (worst row per protocol >= 1.0), and a win by the margin in
at least one; its figures are the first protocol's, with each protocol's worst in `speedups`. Rows of
`l2c bench dispatch:TABLE` / `linear:TABLE` (what users call) count for the entry of TABLE that served them (the
row's `served_spec`, else TABLE's entry at the row's shape).

Rows in `kernel_apart` (the `kernel` protocol with each launch placed after a torch kernel, as a GEMM inside a
replayed model runs) count as `kernel` rows (`apart_as_kernel`), among the sources, the `--near` points and the
`--confirmed-by` checks: a kernel counts at the worse of its back-to-back and its apart figure, so a kernel that wins
only by overlapping its own previous launch does not displace one that wins in both. Among the sources, at a shape
where some kernel has a verified apart row, a kernel with none there is a measured loss (status NOT_APART,
`unmeasured_apart`): otherwise the kernels left unmeasured apart would be favoured for it.

`--host-overhead triton=30e-6,cutlass=10e-6` makes a `kernel`-protocol table safe for eager callers: each
candidate is also charged the extra host time per launch that l2c's call path costs over torch.matmul's
(measured by scripts/call_overhead.py), times its launches (a Triton atomic split-K kernel also clears its
buffer and launches a finalize kernel; workspace mode reduces in the GEMM kernel unless
`split_k reduce=finalize`), and must not lose after the charge:
baseline_s / (candidate_s + charge) >= 1, besides clearing the margin uncharged. A kernel 10% faster on a 3 µs
problem does not make a synchronized call faster when its launch costs 20 µs more. The per-shape winner is the
best charged candidate.
"""
from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path
from typing import Optional


def add_parser(sub) -> None:
    p = sub.add_parser("table", help="build a tuned table from l2c bench results (per-shape best candidate)")
    p.add_argument("results", nargs="*", help="JSON-lines files written by l2c bench (none: --into with --withdraw)")
    p.add_argument("-o", "--output", required=True, help="tuned table JSON to write")
    p.add_argument("--protocol", default="kernel",
                   help="the protocol whose figures make the table, or several (kernel,call): a candidate must then be "
                        "measured in each, slower in none, and win by the margin in one")
    p.add_argument("--min-speedup", type=float, default=1.05)
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--host-overhead", default="", metavar="TARGET=SECONDS,...",
                   help="charge each candidate this extra host time per launch (kernel protocol), e.g. "
                        "triton=30e-6,cutlass=10e-6; default: no charge")
    p.add_argument("--ranges", action="store_true",
                   help="also write token-count ranges: a shape-generic kernel that won at 3+ consecutive measured "
                        "M of one (N, K) serves every M between the first and the last")
    p.add_argument("--cells", action="store_true",
                   help="also write cells: a kernel generic in M, N and K that won at all eight corners of a box "
                        "between consecutive measured M, N and K serves every shape inside it")
    p.add_argument("--near", nargs="+", default=[], metavar="RESULTS",
                   help="also write neighbourhood cells from the shapes these results measured (recorded as `near`, "
                        "not as sources: they make no other entry): "
                        "a box of the half-octave lattice whose NEAR_COUNT nearest measured shapes (within "
                        "NEAR_RADIUS octaves of its centre, at least NEAR_SUPPORT) were all won by a kernel, two in "
                        "three of them by one shape-generic kernel that won on both sides of the box, is served by "
                        "that kernel after any exact entry, range or corner cell")
    p.add_argument("--every-shape", action="store_true",
                   help="keep each shape's best candidate even where it loses to torch.matmul: a table for measuring "
                        "the kernels alone (l2c bench TABLE.json), not for dispatch")
    p.add_argument("--into", metavar="TABLE",
                   help="add the new entries to this tuned table's (same GPU and protocol), each replacing the entry "
                        "of the same problem (dtype, layout, N, K, batch, gate, and its M or token range); the "
                        "merged table goes to -o: how a shipped table gains a new set of shapes")
    p.add_argument("--only-faster", type=float, default=None, metavar="RATIO",
                   help="with --into: add a new entry only where the table serves its shape with no entry, or with "
                        "one whose speedup times RATIO is at most the new one's (e.g. 1.03, the spread of two "
                        "measurements): a new kernel family never displaces a faster entry")
    p.add_argument("--withdraw", nargs="+", default=[], metavar="DTYPE:LAYOUT:GATE:MxNxK",
                   help="with --into: take out of the table every entry (exact, range or cell) that serves one of "
                        "these shapes, e.g. f16:row,col,row:silu:384x14336x4096, for evidence outside its own protocol "
                        "(a model's step slower with the entry than without it); the table records them as "
                        "`withdrawn`, and a shape no entry serves is refused")
    p.add_argument("--confirmed-by", nargs="+", default=[], metavar="RESULTS",
                   help="candidates are only the specs that won again (speedup >= 1.0 in every row, same protocol "
                        "and shape) in these later measurements, e.g. `l2c bench` of the candidate table: each shape "
                        "keeps its best confirmed candidate. Choosing the best of several candidates on one "
                        "measurement favours lucky draws")
    p.set_defaults(func=run)


def parse_overhead(text: str):
    """'triton=30e-6,cutlass=1e-5' -> {"triton": 3e-05, "cutlass": 1e-05}; ValueError on anything else."""
    charges = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        target, sep, value = part.partition("=")
        if not sep or target not in ("triton", "cutlass"):
            raise ValueError(f"--host-overhead: expected TARGET=SECONDS with TARGET triton or cutlass, got {part!r}")
        seconds = float(value)
        if not 0 <= seconds < 1:
            raise ValueError(f"--host-overhead: {part!r} is not a per-launch time in seconds")
        charges[target] = seconds
    return charges


@functools.lru_cache(maxsize=None)
def _spec(spec_text: str):
    """A spec text parsed once per text, not once per row (the facts below are read from it)."""
    from ..parser import parse_one
    return parse_one(spec_text)


def launches(spec_text: str) -> int:
    """Kernel launches of one call of a spec: a Triton atomic split-K call also clears its buffer and runs the
    finalize kernel; workspace mode runs the finalize kernel only under `split_k reduce=finalize`."""
    spec = _spec(spec_text)
    if spec.target != "triton" or spec.split_k_slices == 1:
        return 1
    if spec.split_k_mode == "atomic":
        return 3
    return 2 if spec.split_k_reduce == "finalize" else 1


def _problem_m(spec_text: str):
    """A spec text's problem M (`any` for a kernel generic in M)."""
    return _spec(spec_text).problem_m


def unusable_row(row) -> str:
    """What keeps a measured kernel's result row (ok, not torch's) out of a table, or '' (`checked_row` has checked
    what every reader needs; a table also needs the problem's kind and both sides' rates)."""
    missing = [f for f in ("dtype", "layout", "candidate_tflops", "baseline_tflops") if row.get(f) is None]
    if missing:
        return f"no {', '.join(repr(f) for f in missing)}"
    for field in ("candidate_tflops", "baseline_tflops", "candidate_s", "baseline_s"):
        value = row.get(field)
        if value is not None and (type(value) not in (int, float) or not 0 < value < math.inf):
            return f"{field!r} must be a positive finite number, got {value!r}"[:200]
    return ""


def charged_speedup(row, charges) -> float:
    """The row's speedup with its target's host overhead charged (its plain speedup without charges)."""
    charge = charges.get(row.get("target"), 0.0)
    if not charge or row.get("protocol") != "kernel" or not row.get("candidate_s") or not row.get("baseline_s"):
        return row["speedup"]
    return row["baseline_s"] / (row["candidate_s"] + charge * launches(row["spec"]))


def served_entry(row, cache):
    """(spec text, target) of the table entry that served a `dispatch:TABLE` / `linear:TABLE` row: the row's own
    `served_spec`, or for rows written before it was recorded the entry the table the row names (`source`) holds at
    its shape; None where torch served it or the table is not there."""
    if row.get("target") != "dispatch" or row.get("served_by", "torch") == "torch":
        return None
    if row.get("served_spec"):
        return row["served_spec"], row["served_target"]
    from ..tuned_table import TableError, load_table
    source = row.get("source", "")
    if ("table", source) not in cache:
        try:
            cache[("table", source)] = load_table(source)
        except TableError:
            cache[("table", source)] = None
    table = cache[("table", source)]
    if table is None:
        return None
    entry = table.lookup(row["dtype"], row["layout"], row["m"], row["n"], row["k"], row.get("batch", 1),
                         row.get("gate", "none"))
    return None if entry is None else (entry.spec_text, entry.target)


def spec_text(row, cache) -> str:
    """The measured spec's canonical text: from the row, or from the `.l2` file it names (`source`). Rows of what
    users call have theirs from `as_candidates`."""
    if row.get("spec"):
        return row["spec"]
    from ..errors import L2Error
    from ..parser import parse_file
    source = row.get("source", "")
    if source not in cache:
        try:
            if source.endswith(".l2"):
                cache[source] = {s.name: s.to_l2() for s in parse_file(source)}
            elif source.endswith(".json"):   # a table: one name may stand for specs of several dtypes or layouts
                from ..parser import parse_one
                entries = json.loads(Path(source).read_text()).get("entries", [])
                by_name: dict = {}
                for e in entries:
                    spec = parse_one(e["spec"])
                    problem = (spec.types_a, f"{spec.layout_a},{spec.layout_b},{spec.layout_c}")
                    by_name.setdefault(spec.name, {})[problem] = e["spec"]
                cache[source] = {name: texts if len(texts) > 1 else next(iter(texts.values()))
                                 for name, texts in by_name.items()}
            else:
                cache[source] = {}
        except (L2Error, OSError, ValueError, KeyError):
            cache[source] = {}
    found = cache[source].get(row.get("name"), "")
    if isinstance(found, dict):   # the spec of the row's own dtype and layouts, or none
        found = found.get((row.get("dtype"), row.get("layout")), "")
    return found


def shape_key(row) -> tuple:
    """What one table entry is for: shape, dtype and layout (a results row and a table entry alike), and the gated
    problem of a gated row (its own entry: tuned_table's lookup keeps gated and plain apart)."""
    key = (row["m"], row["n"], row["k"], row.get("batch", 1), row["dtype"], row["layout"])
    return key + (row["gate"],) if row.get("gate", "none") != "none" else key


def best_rows(rows, protocol: str, min_speedup: float, charges=None, every_shape: bool = False, cache=None,
              admit=None):
    """The best verified non-torch row per (shape, dtype, layout), chosen by charged speedup among each spec's worst
    row there (a spec measured twice counts at its slower figure, as in every other rule), if its speedup is
    at least `min_speedup` and its charged speedup at least 1 (no charges: the two are the same); with
    `every_shape`, each shape's best whatever its speedup. `cache`: spec_text's, to share the .l2/.json files
    already read. `admit(row)`, when given, decides which rows are candidates at all (--confirmed-by)."""
    worst, best, charges = {}, {}, charges or {}
    cache = {} if cache is None else cache
    for r in rows:
        if r.get("type") != "result" or r.get("status") != "ok" or r.get("protocol") != protocol:
            continue
        if r.get("kernel") == "torch" or r.get("speedup") is None:
            continue
        r = dict(r, spec=spec_text(r, cache))
        if not r["spec"]:
            continue
        if admit is not None and not admit(r):
            continue
        r["charged_speedup"] = charged_speedup(r, charges)
        key = (shape_key(r), r["spec"])   # a spec measured more than once at a shape counts at its worst
        if key not in worst or r["charged_speedup"] < worst[key]["charged_speedup"]:
            worst[key] = r
    for r in worst.values():
        key = shape_key(r)
        if key not in best or r["charged_speedup"] > best[key]["charged_speedup"]:
            best[key] = r
    if every_shape:
        return list(best.values())
    return [r for r in best.values() if r["speedup"] >= min_speedup and r["charged_speedup"] >= 1.0]


NOT_PLAIN = "not_plain_epilogue"   # the status of a row whose kernel's epilogue is not one the dispatcher serves


def as_candidates(rows, cache):
    """Result rows of kernels as table candidates: a `dispatch:`/`linear:` row served by a table entry becomes a row
    of that entry's spec and target; one torch served is a measurement of torch (kept: it marks the M measured).
    A row a kernel served whose entry cannot be found (no `served_spec`, the table gone or changed) keeps no spec,
    so that `l2c table` refuses it by name rather than count a kernel's measurement as torch's. A kernel measured
    with an epilogue the dispatcher does not serve plain calls with (`_serves_plain`: an alpha, a C input, an
    activation, another output type) is no evidence for them: its row stays as a measurement that won nothing
    (status NOT_PLAIN), so its shape still breaks ranges and cells."""
    out = []
    for r in rows:
        if r.get("type") == "result" and r.get("target") == "dispatch":
            served = served_entry(r, cache)
            if served is not None:
                r = dict(r, spec=served[0], target=served[1])
            elif r.get("served_by", "torch") == "torch":
                r = dict(r, kernel="torch")
        if r.get("type") == "result" and r.get("status") == "ok" and r.get("kernel") != "torch":
            text = spec_text(r, cache)
            if text and not _serves_plain(text):
                r = dict(r, status=NOT_PLAIN)
        out.append(r)
    return out


@functools.lru_cache(maxsize=None)
def _serves_plain(spec_text: str) -> bool:
    """Whether a measured kernel's epilogue is one of those the dispatcher builds from a table entry (alpha 1, no C
    input, no activation, the output in the inputs' type; no bias or nn.Linear's per-column one; a gate only for
    the gated problem its row names)."""
    spec = _spec(spec_text)
    return (spec.epilogue_alpha == 1.0 and spec.epilogue_beta == 0.0 and spec.epilogue_activation == "none"
            and spec.types_c == spec.types_a and spec.epilogue_bias in ("none", "col"))


APART = "kernel_apart"


NOT_APART = "not_measured_apart"   # the status of a kernel row at a shape where other kernels were measured apart


def apart_as_kernel(rows):
    """Rows with `kernel_apart` rows as `kernel` rows (module docstring): the same device-time figure, with the launch
    after a foreign kernel instead of after its own."""
    return [dict(r, protocol="kernel") if r.get("type") == "result" and r.get("protocol") == APART else r
            for r in rows]


def unmeasured_apart(rows, cache):
    """`rows` (apart rows not yet made kernel rows) with, at each shape where some kernel has a verified apart row,
    the `kernel` rows of every spec with none there marked NOT_APART: measurements that won nothing."""
    apart = {}
    for r in rows:
        if r.get("type") == "result" and r.get("protocol") == APART and r.get("kernel") != "torch" \
                and r.get("status") == "ok":
            apart.setdefault(shape_key(r), set()).add(spec_text(r, cache))
    return [dict(r, status=NOT_APART)
            if r.get("type") == "result" and r.get("protocol") == "kernel" and r.get("kernel") != "torch"
            and r.get("status") == "ok" and shape_key(r) in apart and spec_text(r, cache) not in apart[shape_key(r)]
            else r for r in rows]


def combined_rows(rows, protocols, min_speedup: float, cache):
    """One row per (shape, spec) measured in every protocol of `protocols`, in the protocol named by all of them
    joined: its figures are the first protocol's worst row, `speedups` each protocol's worst speedup. A candidate
    slower than torch in any protocol, or winning by the margin in none, gets a speedup below 1 (a measured loss)."""
    worst, failed = {}, {}
    for r in rows:
        if r.get("type") != "result" or r.get("protocol") not in protocols or r.get("kernel") == "torch":
            continue
        text = spec_text(r, cache)
        if not text:
            continue
        key = (*shape_key(r), text)
        if r.get("status") != "ok" or r.get("speedup") is None:
            failed.setdefault(key, dict(r, spec=text))
            continue
        slot = worst.setdefault(key, {})
        p = r["protocol"]
        if p not in slot or r["speedup"] < slot[p]["speedup"]:
            slot[p] = dict(r, spec=text)
    joined = ",".join(protocols)
    out = []
    for key, slot in worst.items():
        speedups = {p: slot[p]["speedup"] for p in protocols if p in slot}
        # a protocol without a figure (its row failed) is no win: the shape stays measured, as a loss
        won = len(speedups) == len(protocols) and key not in failed and min(speedups.values()) >= 1.0 and \
            max(speedups.values()) >= min_speedup
        first = next(slot[p] for p in protocols if p in slot)
        speedup = first["speedup"] if won else min(0.999, *speedups.values())
        out.append(dict(first, protocol=joined, speedup=speedup, speedups=speedups))
    for key, r in failed.items():   # a candidate that failed every row: its shape stays measured, as a failure
        if key not in worst:
            out.append(dict(r, protocol=joined))
    for r in rows:   # torch's rows: the M they measured still bound the token-count ranges
        if r.get("type") == "result" and r.get("protocol") == protocols[0] and r.get("kernel") == "torch":
            out.append(dict(r, protocol=joined))
    return out


MIN_RANGE_POINTS = 3


def range_rows(rows, protocol: str, min_speedup: float, cache=None, admit=None):
    """Token-count ranges (module docstring): (row of the run's best point, first M, last M, worst speedup) for
    each maximal run of >= MIN_RANGE_POINTS consecutive measured M at which one M-generic spec won by
    `min_speedup`. Consecutive means among every M the results measured for that (N, K, batch, dtype, layout), of
    every spec, so that a range never crosses an M where all lost. `admit((group, spec))`, when given, decides which
    specs may make ranges (--confirmed-by)."""
    cache = {} if cache is None else cache
    measured, by_spec = {}, {}
    for r in rows:
        if r.get("type") != "result" or r.get("protocol") != protocol:
            continue
        group = shape_key(r)[1:]
        measured.setdefault(group, set()).add(r["m"])   # a failed row too: its M breaks every run it would join
        if r.get("status") != "ok" or r.get("kernel") == "torch" or r.get("speedup") is None:
            continue
        text = spec_text(r, cache)
        if not text or _problem_m(text) != "any":
            continue
        if admit is not None and not admit((group, text)):
            continue
        r = dict(r, spec=text)
        slot = by_spec.setdefault((group, text), {})
        if r["m"] not in slot or r["speedup"] < slot[r["m"]]["speedup"]:   # a repeated point counts its worst
            slot[r["m"]] = r
    out = []
    for (group, _), points in by_spec.items():
        run = []
        for m in sorted(measured[group]) + [None]:
            row = points.get(m)   # a win: by the margin, and faster (with several protocols the margin is 1.0)
            if row is not None and row["speedup"] >= min_speedup and row["speedup"] > 1.0:
                run.append(row)
                continue
            if len(run) >= MIN_RANGE_POINTS:
                best = max(run, key=lambda x: x["speedup"])
                out.append((best, run[0]["m"], run[-1]["m"], min(x["speedup"] for x in run)))
            run = []
    return out


# The widest tile along N a cell's kernel may have at any N. Corners are powers of two, which every tile divides;
# inside a box a wide tile pads a ragged N and its speed jumps with the tile count, so its corners do not predict
# it: on the shapes of `--shapes between` (benchmarks/NOTES.md), cells of 64-wide kernels lost in device time at 41
# of 50 shapes, those of kernels 8 or 16 wide at 6 of 75 (2 below 0.97).
MAX_CELL_TILE_N = 16
# A wider kernel makes a cell only where the box's N starts at this many of its tiles, so that a ragged N pads at
# most 1/32 of the tiles along N (the swapped decoding kernels, 64 wide along N, from N = 2048), and where every
# shape of the box launches its tiles in the same number of waves over the GPU's SMs: a step in waves inside the box
# (with M in one tile, N = 8192 is 128 tiles of 64, one wave on 132 SMs; N = 12288 two) is a step in time no corner
# shows (`launch_waves`: one block per SM, a clustered kernel's waves counted in the clusters the GPU runs at once).
WIDE_CELL_MIN_TILES = 32
# ... and where the box's K starts here: below it a few tokens against the weight take under about 6 us, latency-
# bound, where the wide kernels tie cuBLAS, a few percent either way from one ragged shape to the next (on the
# H200, 13 of 89 shapes drawn inside such boxes lost below 0.97 in device time; inside boxes from K = 1024, 12 of
# 120, every one of them still faster in an eager call: benchmarks/NOTES.md, "Swapped decoding kernels as
# cells").
WIDE_CELL_MIN_K = 1024


def _cell_tiling(spec_text: str) -> Optional[tuple]:
    """(tile_m, tile_n, split-K slices) of a spec text whose kernel may make cells (generic in M, N and K), else
    None."""
    spec = _spec(spec_text)
    if not spec.shape_generic:
        return None
    return int(spec.tile_m), int(spec.tile_n), int(spec.split_k_slices)


def cell_fits(spec_text: str, ms: tuple, ns: tuple, ks: tuple, sm_count: int, arch: str = "sm_90") -> bool:
    """Whether a kernel (a shape-generic spec) may make the cell of M in `ms`, N in `ns`, K in `ks`: one number of
    launch waves over `sm_count` SMs at every shape of the box (`launch_waves`: tiles grow with M and N, so the two
    far corners decide), and at most MAX_CELL_TILE_N wide, or N from WIDE_CELL_MIN_TILES of its tiles on and K from
    WIDE_CELL_MIN_K on."""
    if launch_waves(spec_text, ms[0], ns[0], sm_count, arch) != launch_waves(spec_text, ms[1], ns[1], sm_count, arch):
        return False
    tile_n = _cell_tiling(spec_text)[1]
    return tile_n <= MAX_CELL_TILE_N or (ns[0] >= WIDE_CELL_MIN_TILES * tile_n and ks[0] >= WIDE_CELL_MIN_K)


def kernel_points(rows, protocol: str, cache) -> dict:
    """((batch, dtype, layout), (m, n, k)) -> {spec text: its worst row there} of the shape-generic kernels with a
    plain epilogue measured in `protocol` (a failed row is a worst row of speedup 0: the kernel was measured there and
    won nothing); every shape measured in it is a key (an empty dict where only torch, or kernels that serve no other
    shape, were): what cells and neighbourhood cells are made from."""
    out: dict = {}
    for r in rows:
        if r.get("type") != "result" or r.get("protocol") != protocol or r.get("gate", "none") != "none":
            continue
        text = spec_text(r, cache) if r.get("kernel") != "torch" else ""
        ok = r.get("status") == "ok" and r.get("speedup") is not None
        if not ok and (not text or _cell_tiling(text) is None):
            continue
        kernels = out.setdefault((shape_key(r)[3:], (r["m"], r["n"], r["k"])), {})
        if not text or _cell_tiling(text) is None:
            continue
        if not ok:   # a failed row (a build, verification, a timing): the kernel's worst there, no win
            r = dict(r, speedup=0.0)
        if text not in kernels or r["speedup"] < kernels[text]["speedup"]:   # a repeated point counts its worst
            kernels[text] = dict(r, spec=text)
    return out


def cell_rows(rows, protocol: str, min_speedup: float, sm_count: int, cache=None, arch: str = "sm_90",
              losses=frozenset()):
    """Cells (module docstring): (row of the worst corner, (m_lo, m_hi), (n_lo, n_hi), (k_lo, k_hi)) for each box
    whose eight corners one shape-generic spec won by `min_speedup`, between consecutive values of each axis at which
    that spec was measured in its (batch, dtype, layout), where the spec's tiling fits the box (`cell_fits`, over
    `sm_count` SMs) and it lost at no shape inside (`losses`, `lost_inside`); per box the spec with the best worst
    corner."""
    import itertools
    cache = {} if cache is None else cache
    points = {}   # (group, spec) -> {(m, n, k): worst row}
    for (group, at), kernels in kernel_points(rows, protocol, cache).items():
        for text, r in kernels.items():
            points.setdefault((group, text), {})[at] = r
    best = {}
    for (group, text), measured in points.items():
        axes = [sorted({at[i] for at in measured}) for i in range(3)]
        for sides in itertools.product(*(list(zip(a, a[1:])) for a in axes)):
            if not cell_fits(text, *sides, sm_count, arch):
                continue
            corners = [measured.get(at) for at in itertools.product(*sides)]
            if any(c is None or c["speedup"] < min_speedup for c in corners):
                continue
            worst = min(corners, key=lambda c: c["speedup"])
            if worst["speedup"] <= 1.0 or lost_inside((worst, *sides), losses):
                continue
            key = (group, sides)
            if key not in best or worst["speedup"] > best[key][0]["speedup"]:
                best[key] = (worst, *sides)
    return list(best.values())


def _launch(spec_text: str) -> tuple:
    """(tile_m, tile_n, split-K slices, cluster size along M, along N) of a tensor-core GEMM spec, or () for the gemv
    family (small blocks, several resident on an SM, so no wave count is kept for them); stream-K counts one slice
    (it divides the work among the SMs itself)."""
    spec = _spec(spec_text)
    if spec.launch_family != "gemm":
        return ()
    slices = 1 if spec.split_k_mode == "stream_k" else int(spec.split_k_slices)   # stream-K: its own work split
    return (int(spec.tile_m), int(spec.tile_n), slices, int(spec.cluster_m or 1), int(spec.cluster_n or 1))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def launch_waves(spec_text: str, m: int, n: int, sm_count: Optional[int] = None, arch: str = "sm_90") -> int:
    """How many waves of blocks the kernel launches at M x N (0 where `_launch` has no tiling): its output tiles in
    clusters, times the split-K slices, over the clusters of that size the GPU runs at once with one block per SM
    (`Arch.max_active_clusters` of `arch` with its SM count; SMs / size on a GPU with another count, or where none
    was measured)."""
    from ..arch import ARCHS
    tiling = _launch(spec_text)
    if not tiling:
        return 0
    tile_m, tile_n, slices, cluster_m, cluster_n = tiling
    size, info = cluster_m * cluster_n, ARCHS.get(arch)
    measured = info.max_active_clusters.get(size) if info and sm_count in (None, info.sm_count) else None
    capacity = measured or max(1, (sm_count or info.sm_count) // size)
    clusters = ceil_div(ceil_div(m, tile_m), cluster_m) * ceil_div(ceil_div(n, tile_n), cluster_n) * slices
    return ceil_div(clusters, capacity)


def weight_passes(spec_text: str, m: int) -> int:
    """How many times a gemv-family kernel streams the weight at M: once per tile of M rows (each block owns tile m
    rows of A and reads its whole slab of B), so M = 2 on a one-row tile reads twice the bytes of M = 1 where cuBLAS
    reads them once; 0 for the other families (their waves are `launch_waves`)."""
    spec = _spec(spec_text)
    return ceil_div(m, int(spec.tile_m)) if spec.launch_family == "gemv" else 0


def _half_octaves(lo: int, hi: int, step: int, offset: float = 0.0) -> list:
    """Edges of a neighbourhood lattice along one axis: `lo` times the powers of sqrt(2) from sqrt(2)^offset, up to
    `hi`, rounded to `step` (so, along M, 1 to 2 is one box: no whole number lies between)."""
    out, i = [], 0
    while True:
        edge = max(step, step * round(lo * 2 ** ((i + offset) / 2) / step))
        if edge > hi:
            return out
        if not out or edge > out[-1]:
            out.append(edge)
        i += 1


# The neighbourhood rule's constants, chosen by two-fold cross-validation on the `points` measurements (each half's
# cells checked on the other half's shapes; benchmarks/NOTES.md, "neighbourhood cells"): of 2,018 shapes under
# 1 GFLOP, 268 fell in a cell, 237 of them measured wins of its kernel (worst 1.05x in `kernel`), 31 won by another
# kernel, none where every kernel tried lost.
NEAR_COUNT = 12        # the measured shapes nearest a box's centre that decide it
NEAR_RADIUS = 2.0      # ... those of them within this many octaves (Euclidean over log2 M, N and K)
NEAR_SUPPORT = 3       # at least this many, and at least this many won by the kernel that serves the box
NEAR_SHARE = 2 / 3     # the share of them that kernel must have won (every one of them won by some kernel)
NEAR_TIMED_MARGIN = 1.05   # a kernel online tuning timed at a point won there from this speedup on (its own margin)
NEAR_M_EDGES = _half_octaves(1, 16384, 1)
NEAR_NK_EDGES = _half_octaves(64, 16384, 8)
# the lattices whose boxes are candidates: the one above and the same shifted a quarter octave along every axis
# (boxes straddling its edges; on the points, two-fold cross-validation served 20% more held-out shapes, none slower)
NEAR_LATTICES = ((NEAR_M_EDGES, NEAR_NK_EDGES),
                 (sorted({1, *_half_octaves(1, 16384, 1, 0.5)}), _half_octaves(64, 16384, 8, 0.5)))


def measured_points(rows, protocols, min_speedup: float, cache=None):
    """(batch, dtype, layout) -> {(m, n, k): {spec text: worst row}}: every shape `rows` measured, with the
    shape-generic kernels that won there: by `min_speedup` (with several protocols, `combined_rows`: by it in one and
    slower in none), in every row of theirs at that shape, and the candidates online tuning timed there
    (`online_timings`) from NEAR_TIMED_MARGIN on. A kernel online tuning timed at a shape below that margin, or
    timed where it then left the shape to torch, won nothing there, whatever other rows say; a kernel it did not time
    there holds the shape where another row measured it winning (a family that was not among the candidates then).
    A shape holds none where a row failed (verification, a build), or where torch served a row that records no
    online timings (no entry served it, or the measured kernel declined it: `serving:` rows)."""
    cache = {} if cache is None else cache
    blank, slower = set(), set()   # shapes that hold no kernel; (group, shape, spec text) that won nothing there
    for r in rows:
        if r.get("type") != "result" or r.get("gate", "none") != "none":
            continue
        group, at, timings = shape_key(r)[3:], (r["m"], r["n"], r["k"]), r.get("online_timings")
        torch_served = r.get("kernel") == "torch" or r.get("served_by") == "torch"
        if r.get("status") != "ok" or (torch_served and timings is None):
            blank.add((group, at))
        for text, speedup in (timings or {}).items():   # timed, and below its margin or passed over for torch
            if speedup < NEAR_TIMED_MARGIN or torch_served:
                slower.add((group, at, text))
    joined = ",".join(protocols)
    if len(protocols) > 1:
        rows, min_speedup = combined_rows(rows, protocols, min_speedup, cache), 1.0
    worst: dict = {}
    for (group, at), kernels in kernel_points(rows, joined, cache).items():
        worst.setdefault(group, {})[at] = kernels
    for r in rows:   # what online tuning timed there: each candidate's device time, a win from its margin on
        if r.get("type") != "result" or r.get("protocol") != joined or r.get("status") != "ok":
            continue
        kernels = worst.get(shape_key(r)[3:], {}).get((r["m"], r["n"], r["k"]))
        for text, speedup in (r.get("online_timings") or {}).items():
            if kernels is None or speedup < NEAR_TIMED_MARGIN or _cell_tiling(text) is None:
                continue
            if len(protocols) > 1 and _spec(text).target != "cutlass":
                continue   # device time stands for an eager call only where the C++ call table launches the kernel
            # (CUTLASS); a Triton launch is Python's, and Triton winners lost eager calls (sessions 26-28)
            if text not in kernels or speedup < kernels[text]["speedup"]:   # its own figures, device time only
                kernels[text] = dict({k: v for k, v in r.items() if k != "speedups"}, spec=text,
                                     target=_spec(text).target, speedup=speedup, speedups={"kernel": speedup},
                                     candidate_tflops=r["baseline_tflops"] * speedup)
    return {group: {at: ({} if (group, at) in blank else
                         {t: r for t, r in kernels.items() if r["speedup"] >= min_speedup and r["speedup"] > 1.0
                          and (group, at, t) not in slower})
                    for at, kernels in points.items()}
            for group, points in worst.items()}


def near_boxes(rows, protocols, min_speedup: float, cache=None, count: int = NEAR_COUNT,
               radius: float = NEAR_RADIUS, support: int = NEAR_SUPPORT, share: float = NEAR_SHARE,
               sm_count: Optional[int] = None, arch: str = "sm_90"):
    """Neighbourhood cells (module docstring) of the points `rows` measured (`measured_points`): (row of the worst
    supporting point, (m_lo, m_hi), (n_lo, n_hi), (k_lo, k_hi)) for each box of the lattice whose `count` nearest
    measured shapes within `radius` octaves of its centre are at least `support`, were all won by some
    shape-generic kernel, and one kernel won at least `share` and `support` of them and at shapes on both sides of
    the box along each axis (so the box lies between its wins, never past them), launching its blocks in one
    number of waves over the whole box (`launch_waves`: tiles grow with M and N, so the two far corners decide), a
    gemv kernel streaming the weight as many times at both ends of the box's M (`weight_passes`);
    per box the kernel that won most of them, then the best worst point."""
    import itertools
    import math
    out = []
    for group, points in measured_points(rows, protocols, min_speedup, cache).items():
        shapes = list(points)
        logs = [(math.log2(m), math.log2(n), math.log2(k)) for m, n, k in shapes]
        lattice_boxes = (itertools.product(zip(m_edges, m_edges[1:]), zip(nk_edges, nk_edges[1:]),
                                           zip(nk_edges, nk_edges[1:])) for m_edges, nk_edges in NEAR_LATTICES)
        for sides in itertools.chain.from_iterable(lattice_boxes):
            centre = [(math.log2(lo) + math.log2(hi)) / 2 for lo, hi in sides]
            nearest = sorted((sum((a - b) ** 2 for a, b in zip(p, centre)), i) for i, p in enumerate(logs))[:count]
            near = [shapes[i] for d2, i in nearest if d2 <= radius * radius]
            if len(near) < support or any(not points[at] for at in near):
                continue
            wins = {}
            for at in near:
                for text, r in points[at].items():
                    wins.setdefault(text, []).append(r)
            best = None
            for won in wins.values():
                if len(won) < support or len(won) < share * len(near) - 1e-9:
                    continue
                if any(min(r[axis] for r in won) > lo or max(r[axis] for r in won) < hi
                       for axis, (lo, hi) in zip("mnk", sides)):
                    continue   # the box reaches past where the kernel won: a step in tiles or waves may lie there
                text = won[0]["spec"]
                if launch_waves(text, sides[0][0], sides[1][0], sm_count, arch) != \
                        launch_waves(text, sides[0][1], sides[1][1], sm_count, arch):
                    continue   # a step in waves inside the box: twice the time for a few more tiles, which the
                    # points around it need not show (64x16 tiles in clusters of 4: 30 clusters in one wave)
                if weight_passes(text, sides[0][0]) != weight_passes(text, sides[0][1]):
                    continue   # a second pass over the weight inside the box (cross-validated on the H100's
                    # nn.Linear points: a one-row gemv's box over M = 1-2 held 2 x 832 x 3872 at 0.80)
                worst = min(won, key=lambda r: r["speedup"])
                if best is None or (len(won), worst["speedup"]) > best[0]:
                    best = ((len(won), worst["speedup"]), worst)
            if best is not None:
                out.append((best[1], *sides))
    return out


def near_rows(rows, protocols, min_speedup: float, cache=None, sm_count: Optional[int] = None, arch: str = "sm_90",
              losses=frozenset()):
    """The neighbourhood cells `l2c table --near` writes: `near_boxes` with the module's constants, less the boxes
    holding a shape where their kernel lost (`losses`: among the table's sources, `source_losses`, an entry counting
    at its worst row wherever it was measured; among the points, `point_losses`), the boxes of one kernel that touch
    joined into one (`_merged_boxes`: the same shapes served by fewer entries)."""
    return _merged_boxes([box for box in near_boxes(rows, protocols, min_speedup, cache, sm_count=sm_count, arch=arch)
                          if not lost_inside(box, losses)])


def lost_inside(box, losses) -> bool:
    """Whether the cell `box` (row, *sides) holds a shape where its kernel lost (`losses`: `source_losses`,
    `point_losses`)."""
    r, *sides = box
    group = shape_key(r)[3:]
    return any(g == group and text == r["spec"] and all(lo <= x <= hi for x, (lo, hi) in zip(at, sides))
               for g, at, text in losses)


def source_losses(rows, protocol: str, cache) -> set:
    """(group, (m, n, k), spec text) of every shape-generic kernel that failed or was slower than torch at a shape of
    `rows` in `protocol` (with several protocols, `combined_rows`' joined one: slower in any)."""
    return {(group, at, text) for (group, at), kernels in kernel_points(rows, protocol, cache).items()
            for text, r in kernels.items() if r["speedup"] < 1.0}


def point_losses(rows, cache) -> set:
    """`source_losses` of the measured points (`--near`'s rows) in device time: a kernel that served a point slower
    than torch in the `kernel` protocol, or that online tuning timed there slower than torch (`online_timings`)."""
    out = source_losses(rows, "kernel", cache)
    for r in rows:
        if r.get("type") != "result" or r.get("status") != "ok":
            continue
        for text, speedup in (r.get("online_timings") or {}).items():
            if speedup < 1.0 and _cell_tiling(text) is not None:
                out.add((shape_key(r)[3:], (r["m"], r["n"], r["k"]), text))
    return out


def _merged_boxes(cells):
    """The same cells in fewer boxes: two boxes of one kernel and group that share two sides and touch along the
    third become one (its figures the worse box's); along M, N and K, twice over."""
    cells = list(cells)
    for axis in (0, 1, 2, 0, 1, 2):
        def key(c):
            sides = c[1:]
            return (shape_key(c[0])[3:], c[0]["spec"], tuple(sides[i] for i in range(3) if i != axis), sides[axis])
        merged = []
        for c in sorted(cells, key=key):
            last = merged[-1] if merged else None
            if last is not None and key(last)[:3] == key(c)[:3] and last[1 + axis][1] == c[1 + axis][0]:
                sides = list(last[1:])
                sides[axis] = (last[1 + axis][0], c[1 + axis][1])
                worse = min(last[0], c[0], key=lambda r: r["speedup"])
                merged[-1] = (worse, *sides)
            else:
                merged.append(c)
        cells = merged
    return cells


def won_again(rows, protocols):
    """(shape, dtype, layout, spec) -> True for each spec with at least one row in `rows` on that shape in
    `protocols`, all of them verified wins (speedup >= 1.0); False where any lost or failed."""
    verdicts, cache = {}, {}
    for r in rows:
        if r.get("type") != "result" or r.get("protocol") not in protocols or r.get("kernel") == "torch":
            continue
        key = (*shape_key(r), spec_text(r, cache))
        won = r.get("status") == "ok" and (r.get("speedup") or 0.0) >= 1.0
        verdicts[key] = verdicts.get(key, True) and won
    return verdicts


def problem_key(entry) -> tuple:
    """What one entry serves: two entries with the same key answer the same calls, so a merge keeps one."""
    served_m = tuple(entry["m_range"]) if "m_range" in entry else entry["m"]
    if "n_range" in entry:   # a cell: its box, and whether its neighbours or its corners made it
        return (entry["dtype"], entry["layout"], tuple(entry["n_range"]), tuple(entry["k_range"]),
                entry.get("batch", 1), entry.get("gate", "none"), served_m, entry.get("near", False))
    return (entry["dtype"], entry["layout"], entry["n"], entry["k"], entry.get("batch", 1),
            entry.get("gate", "none"), served_m)


def faster_than_served(base: dict, new: dict, ratio: float) -> dict:
    """`new` less the entries whose own shape `base` already serves with an entry at least 1/`ratio` as fast."""
    from ..tuned_table import TunedTable, entry_from_row
    served = TunedTable([entry_from_row(e) for e in base["entries"]], arch=base.get("arch", "sm_90"))
    kept = []
    for e in new["entries"]:
        old = served.lookup(e["dtype"], e["layout"], e["m"], e["n"], e["k"], e.get("batch", 1), e.get("gate", "none"))
        if old is None or old.speedup * ratio <= e["speedup"]:
            kept.append(e)
    return dict(new, entries=kept)


def _serves_at(entry: dict, row) -> bool:
    """Whether a table file's entry serves the shape of a result row (its batch, dtype, layouts and gate too)."""
    if shape_key(entry)[3:] != shape_key(row)[3:]:
        return False
    return all(lo <= row[axis] <= hi for axis, (lo, hi) in
               (("m", entry.get("m_range", (entry["m"], entry["m"]))), ("n", entry.get("n_range", (entry["n"],) * 2)),
                ("k", entry.get("k_range", (entry["k"],) * 2))))


def parse_withdrawn(text: str) -> dict:
    """'f16:row,col,row:silu:384x14336x4096' -> the shape as a results row (m, n, k, batch, dtype, layout, gate);
    ValueError naming what is wrong otherwise."""
    parts = text.split(":")
    if len(parts) != 4:
        raise ValueError(f"--withdraw {text!r}: expected DTYPE:LAYOUT:GATE:MxNxK, "
                         "e.g. f16:row,col,row:silu:384x14336x4096")
    dtype, layout, gate, shape = parts
    if dtype not in ("f16", "bf16", "f32"):
        raise ValueError(f"--withdraw {text!r}: dtype {dtype!r} is not f16, bf16 or f32")
    if len(layout.split(",")) != 3 or any(part not in ("row", "col") for part in layout.split(",")):
        raise ValueError(f"--withdraw {text!r}: layout {layout!r} is not three of row/col (A, B, D), e.g. row,col,row")
    if gate not in ("none", "silu", "gelu_tanh"):
        raise ValueError(f"--withdraw {text!r}: gate {gate!r} is not none, silu or gelu_tanh")
    dims = shape.split("x")
    if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
        raise ValueError(f"--withdraw {text!r}: shape {shape!r} is not MxNxK of positive integers")
    m, n, k = map(int, dims)
    return {"m": m, "n": n, "k": k, "batch": 1, "dtype": dtype, "layout": layout, "gate": gate}


def merged(base: dict, new: dict, error, lost_rows=(), withdrawn=None) -> dict:
    """`base` with `new`'s entries added, each replacing base's entry of the same problem, less base's entries whose
    kernel `lost_rows` (rows of the new results: a failure or a loss to torch) measured losing at a shape they serve:
    an entry counts at its worst row, in whichever run it was measured. Both must come from one GPU and one
    protocol (a table's figures are ratios in its protocol); the margin kept is the smaller. `withdrawn` maps each
    --withdraw text to its shape: every entry serving one leaves, and a shape none serves is an error (a mistyped
    shape would otherwise withdraw nothing)."""
    if new["gpu"] is not None and base.get("gpu") not in (None, new["gpu"]):
        raise error(f"--into table is for {base.get('gpu')}, the results for {new['gpu']}")
    if base.get("protocol") != new["protocol"]:
        raise error(f"--into table is in the {base.get('protocol')} protocol, the new entries in {new['protocol']}")
    replaced = {problem_key(e) for e in new["entries"]}
    lost = {}
    for r in lost_rows:
        lost.setdefault(r["spec"], []).append(r)
    kept = [e for e in base["entries"] if problem_key(e) not in replaced
            and not any(_serves_at(e, r) for r in lost.get(e["spec"], ()))] + new["entries"]
    for text, shape in (withdrawn or {}).items():
        if not any(_serves_at(e, shape) for e in kept):
            raise error(f"--withdraw {text}: no entry of the merged table serves that shape")
    kept = [e for e in kept if not any(_serves_at(e, shape) for shape in (withdrawn or {}).values())]
    margins = [m for m in (base.get("min_speedup"), new["min_speedup"]) if m is not None]
    table = dict(base, gpu=base.get("gpu") or new["gpu"], min_speedup=min(margins) if margins else None,
                 sources=list(base.get("sources", [])) + new["sources"],
                 near=list(base.get("near", [])) + new.get("near", []),
                 confirmed_by=list(base.get("confirmed_by", [])) + new["confirmed_by"],
                 entries=kept)
    if withdrawn:
        table["withdrawn"] = list(base.get("withdrawn", [])) + list(withdrawn)
    return table


def run(args) -> int:
    from ..results_file import parse_protocols, read_rows
    from ..cli import UsageError
    from ..tuned_table import DTYPES
    try:
        protocols = parse_protocols(args.protocol)
    except ValueError as err:
        raise UsageError(f"--protocol {args.protocol!r}: {err}") from None
    args.protocol = ",".join(protocols)
    if not (math.isfinite(args.min_speedup) and args.min_speedup > 0):
        raise UsageError(f"--min-speedup must be a positive number, got {args.min_speedup}")
    if args.only_faster is not None and not (math.isfinite(args.only_faster) and args.only_faster > 0):
        raise UsageError(f"--only-faster must be a positive number, got {args.only_faster}")
    rows, gpus, sm_counts = [], set(), set()
    near_points = []   # rows of neighbourhood cells only: among the sources, ragged shapes would cut the cells' boxes
    other_dtypes = 0
    for path in [*args.results, *args.near]:
        for i, r in enumerate(read_rows(path)):
            if r.get("type") == "result" and r.get("status") == "ok" and r.get("kernel") != "torch":
                problem = unusable_row(r)
                if problem:
                    raise UsageError(f"{path}: row {i + 1} ({r['m']}x{r['n']}x{r['k']}): {problem}; not a row "
                                     f"l2c bench wrote")
                if r["dtype"] not in DTYPES:   # a table serves f16 and bf16 calls only
                    other_dtypes += 1
                    continue
            (rows if path in args.results or r.get("type") != "result" else near_points).append(r)
            if r.get("type") == "env" and r.get("gpu"):
                gpus.add(r["gpu"])
                if r.get("sm_count"):
                    sm_counts.add(r["sm_count"])
    if len(gpus) > 1:
        raise UsageError(f"results from different GPUs: {sorted(gpus)}")
    if len(sm_counts) > 1:
        raise UsageError(f"results from GPUs with different SM counts: {sorted(sm_counts)}")
    if args.withdraw and not args.into:
        raise UsageError("--withdraw takes entries out of the table of --into")
    if other_dtypes:
        print(f"l2c table: {other_dtypes} measured row(s) of a dtype a table does not serve (only "
              f"{', '.join(DTYPES)}) left out", file=sys.stderr)
    if not args.results and not args.withdraw:
        raise UsageError("name the l2c bench results to make the table from (or --into TABLE --withdraw SHAPE)")
    try:
        withdrawn = {text: parse_withdrawn(text) for text in args.withdraw}
        charges = parse_overhead(args.host_overhead)
    except ValueError as err:
        raise UsageError(str(err)) from None
    cache = {}
    rows, near_points = as_candidates(rows, cache), as_candidates(near_points, cache)
    if APART in protocols:
        raise UsageError(f"--protocol {args.protocol!r}: {APART} rows count as kernel rows; name kernel")
    if "kernel" in protocols:
        rows, near_points = apart_as_kernel(unmeasured_apart(rows, cache)), apart_as_kernel(near_points)
    protocol, margin = args.protocol, args.min_speedup
    unresolved = sorted({(r.get("source", ""), r.get("name", "")) for r in rows + near_points
                         if r.get("type") == "result" and r.get("status") == "ok" and r.get("kernel") != "torch"
                         and not spec_text(r, cache)})
    if unresolved:   # a silently skipped row would make the table "best" of fewer candidates than measured
        names = ", ".join(f"{name} in {source or '(no source)'}" for source, name in unresolved[:5])
        raise UsageError(f"{len(unresolved)} measured kernel(s) whose spec text is neither in the row nor in the file "
                         f"it names: {names}{' ...' if len(unresolved) > 5 else ''}; put that file at that path")
    admit = admit_range = None
    if args.confirmed_by:   # only specs that won again are candidates: each shape keeps its best confirmed one
        checks = [r for path in args.confirmed_by for r in read_rows(path)]
        gpus.update(r["gpu"] for r in checks if r.get("type") == "env" and r.get("gpu"))
        if len(gpus) > 1:
            raise UsageError(f"results from different GPUs: {sorted(gpus)}")
        checks = as_candidates(checks, cache)
        verdicts = won_again(apart_as_kernel(checks) if "kernel" in protocols else checks, protocols)
        admit = lambda r: verdicts.get((*shape_key(r), r["spec"]), False)  # noqa: E731
        range_verdicts = {}
        for (*shape, spec), won in verdicts.items():   # a range's spec: won again wherever it was measured again
            key = (tuple(shape[1:]), spec)
            range_verdicts[key] = range_verdicts.get(key, True) and won
        admit_range = lambda key: range_verdicts.get(key, False)  # noqa: E731
    if len(protocols) > 1:   # the margin is met in combined_rows; what is left is "slower nowhere"
        rows, margin = combined_rows(rows, protocols, args.min_speedup, cache), 1.0
    chosen = best_rows(rows, protocol, margin, charges, args.every_shape, cache, admit)
    def entry(r):
        row = {"m": r["m"], "n": r["n"], "k": r["k"], "batch": r.get("batch", 1), "dtype": r["dtype"],
               "layout": r["layout"], "target": r["target"], "spec": r["spec"],
               "tflops": r["candidate_tflops"], "baseline_tflops": r["baseline_tflops"], "speedup": r["speedup"]}
        if "speedups" in r:
            row["speedups"] = {p: round(v, 4) for p, v in r["speedups"].items()}
        return dict(row, gate=r["gate"]) if r.get("gate", "none") != "none" else row

    entries = [entry(r) for r in sorted(chosen, key=lambda r: (r["m"], r["n"], r["k"]))]
    if args.ranges:
        ranges = range_rows(rows, protocol, margin, cache, admit_range)
        entries += [dict(entry(r), m_range=[lo, hi], range_min_speedup=worst)
                    for r, lo, hi, worst in sorted(ranges, key=lambda t: (t[0]["n"], t[0]["k"], t[1]))]
    if args.cells or args.near:
        from ..arch import ARCHS
        known = ARCHS.get(args.arch)   # the SM count the results' GPU reported, else the arch's
        sm_count = next(iter(sm_counts), None) or (known.sm_count if known else None)
        if sm_count is None:
            raise UsageError(f"--cells and --near need the GPU's SM count: the results record none and --arch "
                             f"{args.arch} is not one l2c knows ({', '.join(ARCHS)})")
        losses = source_losses(rows, protocol, cache) | point_losses(near_points, cache)
    if args.cells:   # no cell holds a shape where its kernel lost, among the sources or the points
        cells = cell_rows(rows, protocol, margin, sm_count, cache, args.arch, losses)
        entries += [dict(entry(r), m_range=list(ms), n_range=list(ns), k_range=list(ks),
                         range_min_speedup=r["speedup"])
                    for r, ms, ns, ks in sorted(cells, key=lambda t: (t[0]["dtype"], t[0]["layout"], t[1:]))]
    if args.near:
        near = near_rows(near_points, protocols, args.min_speedup, cache, sm_count, args.arch, losses=losses)
        # each at its box's first corner, with the figures of its worst supporting point
        entries += [dict(entry(r), m=ms[0], n=ns[0], k=ks[0], m_range=list(ms), n_range=list(ns), k_range=list(ks),
                         range_min_speedup=r["speedup"], near=True)
                    for r, ms, ns, ks in sorted(near, key=lambda t: (t[0]["dtype"], t[0]["layout"], t[1:]))]
    table = {"format": 1, "arch": args.arch, "gpu": next(iter(gpus), None), "protocol": args.protocol,
             "min_speedup": None if args.every_shape or not args.results else args.min_speedup,
             "host_overhead_s": charges,
             "sources": [str(p) for p in args.results], "near": [str(p) for p in args.near],
             "confirmed_by": [str(p) for p in args.confirmed_by],
             "entries": entries}
    if args.only_faster is not None and not args.into:
        raise UsageError("--only-faster compares with the table of --into")
    if args.into:
        from ..tuned_table import TableError, load_table, read_table_data
        try:
            base, parsed = read_table_data(args.into), load_table(args.into)
        except TableError as err:
            raise UsageError(str(err)) from None
        if parsed.skipped:   # a merge would carry them on
            raise UsageError(f"{args.into}: {parsed.skipped} malformed entries (first: {parsed.first_skipped}); "
                             "fix or remove them before merging into it")
        if base.get("min_speedup") is not None and (type(base["min_speedup"]) not in (int, float)
                                                    or not math.isfinite(base["min_speedup"])):
            raise UsageError(f"{args.into}: min_speedup must be a number, got {base['min_speedup']!r}")
        if args.only_faster is not None:
            table = faster_than_served(base, table, args.only_faster)
            entries = table["entries"]
        lost_rows = [r for r in rows if r.get("type") == "result" and r.get("protocol") == protocol
                     and r.get("kernel") != "torch" and spec_text(r, cache)
                     and (r.get("status") != "ok" or (r.get("speedup") or 0.0) < 1.0)]
        table = merged(base, table, UsageError, [dict(r, spec=spec_text(r, cache)) for r in lost_rows], withdrawn)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    if not args.results:
        print(f"wrote {out}: {args.into}'s {len(base['entries'])} entries less those serving the {len(withdrawn)} "
              f"withdrawn shape(s), {len(table['entries'])} in all")
        return 0
    kept = "every shape's best" if args.every_shape else f">= {args.min_speedup}x"
    kept += ", won again in " + ", ".join(args.confirmed_by) if args.confirmed_by else ""
    celled = sum(1 for e in entries if "n_range" in e)
    ranged = sum(1 for e in entries if "m_range" in e) - celled
    print(f"wrote {out}: {len(entries) - ranged - celled} shape(s)"
          f"{f', {ranged} token-count range(s)' if ranged else ''}{f', {celled} cell(s)' if celled else ''}, "
          f"{kept} in the {args.protocol} protocol"
          + (f"; with {args.into}'s, {len(table['entries'])} entries in all" if args.into else "")
          + (f", {len(withdrawn)} shape(s) withdrawn" if withdrawn else ""))
    return 0
