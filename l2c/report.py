"""`l2c report`: summarize a results file of `l2c bench` and plot it.

Per kernel and protocol: the geometric mean speedup over torch.matmul (the headline), the arithmetic
mean (what the published LLM+RL HGEMM work reports), the share of shapes won (speedup > 1), the worst
shape, and the breakdown by FLOP bucket. When several candidates were measured on the same shapes, a
"best of" line reports the per-shape best candidate, as a tuned dispatcher would pick it; it is
labelled as such because picking the best on the very measurements it is scored on flatters it.

Rows measured with `l2c bench --roofline` add each side's median fraction of roofline, and rows of `dispatch` /
`linear` candidates how many calls a tuned kernel served.

Plots (matplotlib, Agg; optional dependency `l2c[plots]`): speedup against FLOPs, for the grid set heatmaps of
speedup over (M, N), one panel per K, and for roofline rows the fraction of roofline and the speedup against M.
"""
from __future__ import annotations

import hashlib
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, TextIO, Tuple

from .errors import BenchError
from .shapes import BUCKET_LABELS, GRID_DIMS, bucket

BEST_OF = "best-of"
BEST_OF_LABEL = ("best of all candidates per shape (as a tuned dispatcher would pick it; chosen on these same "
                 "measurements, so optimistic)")


@dataclass(frozen=True)
class Point:
    """One measured shape: its dims, FLOPs and speedup over the baseline (> 1: candidate faster)."""
    m: int
    n: int
    k: int
    batch: int
    flops: float
    speedup: float
    kernel: str = ""

    @property
    def shape(self) -> str:
        dims = f"{self.m}x{self.n}x{self.k}"
        return dims if self.batch == 1 else f"{self.batch}x{dims}"


@dataclass
class Stats:
    n: int
    geomean: float
    mean: float
    won: int

    @property
    def won_share(self) -> float:
        return self.won / self.n if self.n else float("nan")


@dataclass
class Summary:
    overall: Stats
    worst: Optional[Point]
    best: Optional[Point]
    buckets: Dict[str, Stats] = field(default_factory=dict)


def stats(speedups: Sequence[float]) -> Stats:
    """Geometric and arithmetic means and wins (strictly > 1) of a list of speedups."""
    if not speedups:
        return Stats(0, float("nan"), float("nan"), 0)
    if any(not (s > 0) or math.isinf(s) for s in speedups):
        raise ValueError("speedups must be positive and finite")
    geo = math.exp(statistics.fmean(math.log(s) for s in speedups))
    return Stats(len(speedups), geo, statistics.fmean(speedups), sum(1 for s in speedups if s > 1.0))


def summarize(points: Sequence[Point]) -> Summary:
    """Overall statistics, the worst and best shape, and the statistics per FLOP bucket (empty buckets out)."""
    by_bucket: Dict[str, List[float]] = {label: [] for label in BUCKET_LABELS}
    for p in points:
        by_bucket[bucket(p.flops)].append(p.speedup)
    return Summary(
        overall=stats([p.speedup for p in points]),
        worst=min(points, key=lambda p: p.speedup) if points else None,
        best=max(points, key=lambda p: p.speedup) if points else None,
        buckets={label: stats(v) for label, v in by_bucket.items() if v},
    )


# --------------------------------------------------------------------------------------------- results

@dataclass
class Results:
    envs: List[dict]
    rows: List[dict]

    def groups(self) -> Dict[Tuple[str, str], List[dict]]:
        """Result rows per (kernel, protocol, problem kind), in first-seen order; the title names the dtype, layouts
        or gate where the rows hold more than one of it. The entries of one tuned table are one group holding, per
        shape, the row of the entry the dispatcher serves there (the table is what a user deploys: one kernel per
        shape); an entry another one shadows at its own shape (`table_served` false) is left out."""
        kinds = {problem_kind(r) for r in self.rows}
        varies = [i for i in range(3) if len({kind[i] for kind in kinds}) > 1]   # dtype, layouts, gate
        out: Dict[Tuple[str, str], Dict[Tuple, dict]] = {}
        for r in self.rows:
            if r.get("table_served") is False:
                continue
            name = table_or_kernel(r)
            if varies:
                name = f"{name} ({' '.join(problem_kind(r)[i] for i in varies)})"
            out.setdefault((name, r["protocol"]), {})[r["m"], r["n"], r["k"], r.get("batch", 1)] = r
        return {key: list(rows.values()) for key, rows in out.items()}

    def shadowed(self) -> int:
        """Rows of table entries measured at a shape another entry of their table serves."""
        return sum(1 for r in self.rows if r.get("table_served") is False)


def problem_kind(row: dict) -> Tuple[str, str, str]:
    """(dtype, layouts, gate) of a result row: rows of different kinds are different problems."""
    return str(row.get("dtype")), str(row.get("layout")), str(row.get("gate", "none"))


def table_or_kernel(row: dict) -> str:
    source = str(row.get("source", ""))
    return f"tuned table {source}" if source.endswith(".json") and row.get("target") != "dispatch" else row["kernel"]


def load_results(*paths) -> Results:
    """The rows of one or more results files. Where several files measured the same kernel on the same shape
    under the same protocol, the later file's row stands (a re-measurement replaces, never doubles, a point)."""
    from .results_file import read_rows
    envs: List[dict] = []
    by_key: Dict[Tuple, dict] = {}
    for path in paths:
        rows = read_rows(path)
        envs += [r for r in rows if r.get("type") == "env"]
        for r in rows:
            if r.get("type") == "result":
                missing = [f for f in ("kernel", "protocol") if r.get(f) is None]
                if r.get("status") == "ok" and r.get("flops") is None:   # the plots' x axis
                    missing.append("flops")
                if missing:
                    raise BenchError(f"{path}: a result row ({r['m']}x{r['n']}x{r['k']}) without "
                                     f"{', '.join(repr(f) for f in missing)}: not a row l2c bench wrote")
                key = (r["kernel"], r["protocol"], r["m"], r["n"], r["k"], r.get("batch", 1), r.get("dtype"),
                       r.get("layout"), r.get("gate", "none"))
                by_key.pop(key, None)      # re-inserted: the row keeps the later file's position
                by_key[key] = r
    machines = {(e.get("device"), e.get("gpu")) for e in envs}
    if len(machines) > 1:   # one summary of two GPUs' speedups describes neither
        shown = ", ".join(sorted(f"{gpu or 'no GPU'} ({device})" for device, gpu in machines))
        raise BenchError(f"results from different machines: {shown}; report each GPU's files on their own")
    return Results(envs, list(by_key.values()))


def points_of(rows: Sequence[dict]) -> List[Point]:
    return [Point(r["m"], r["n"], r["k"], r.get("batch", 1), r["flops"], r["speedup"], r["kernel"])
            for r in rows if r.get("status") == "ok"]


def best_of(results: Results) -> Dict[str, List[Point]]:
    """Per protocol, the fastest candidate on each shape, over every measured kernel except `torch` (A/A).

    Empty unless some shape has at least two candidates under one protocol.
    """
    per: Dict[Tuple[str, Tuple[int, int, int, int]], List[Point]] = {}
    for r in results.rows:
        if r.get("status") == "ok" and r["kernel"] != "torch":
            key = (r["protocol"], (r["m"], r["n"], r["k"], r.get("batch", 1), r.get("dtype"), r.get("layout"),
                                   r.get("gate", "none")))
            per.setdefault(key, []).extend(points_of([r]))
    if not any(len({p.kernel for p in pts}) > 1 for pts in per.values()):
        return {}
    out: Dict[str, List[Point]] = {}
    for (protocol, _), pts in per.items():
        out.setdefault(protocol, []).append(max(pts, key=lambda p: p.speedup))
    return out


# --------------------------------------------------------------------------------------------- printing

def _x(v: float) -> str:
    return f"{v:.3f}x" if math.isfinite(v) else "n/a"


def _print_summary_block(title: str, points: List[Point], failed: Dict[str, int], out: TextIO) -> None:
    s = summarize(points)
    fails = ", ".join(f"{n} {status}" for status, n in sorted(failed.items())) or "none failed"
    print(f"{title}: {s.overall.n} shape(s) measured; {fails}", file=out)
    if not s.overall.n:
        return
    o = s.overall
    print(f"  geomean speedup {_x(o.geomean)} (headline)   mean {_x(o.mean)}   "
          f"won {100 * o.won_share:.1f}% ({o.won}/{o.n})   worst {_x(s.worst.speedup)} at {s.worst.shape}   "
          f"best {_x(s.best.speedup)} at {s.best.shape}", file=out)
    print(f"  {'FLOP bucket':18s} {'shapes':>6s} {'geomean':>8s} {'mean':>8s} {'won':>6s}", file=out)
    for label, b in s.buckets.items():
        print(f"  {label:18s} {b.n:6d} {_x(b.geomean):>8s} {_x(b.mean):>8s} {100 * b.won_share:5.1f}%", file=out)


def print_summary(results: Results, out: TextIO, with_best_of: bool = True, only_best_of: bool = False) -> None:
    for env in results.envs[-1:]:
        print(f"environment: {env.get('gpu')} ({env.get('device')}), driver {env.get('driver')}, "
              f"CUDA {env.get('cuda')}, torch {env.get('torch')}, triton {env.get('triton')}, "
              f"CUTLASS {env.get('cutlass')}; {env.get('date')} on {env.get('hostname')}", file=out)
        print(f"command: {env.get('command')}", file=out)
        if env.get("note"):
            print(f"NOTE: {env['note']}", file=out)
    if len(results.envs) > 1:
        print(f"({len(results.envs)} sessions appended to this file; environment of the last shown)", file=out)
    print("speedup = torch.matmul time / candidate time (kernel: medians; call/server: ratio of mean TFLOPS)",
          file=out)
    if results.shadowed():
        print(f"({results.shadowed()} row(s) of table entries that another entry shadows at their own shape left "
              f"out of the tables' summaries: the dispatcher never serves them there)", file=out)
    for (kernel, protocol), rows in ({} if only_best_of else results.groups()).items():
        failed: Dict[str, int] = {}
        for r in rows:
            if r.get("status") != "ok":
                failed[r.get("status", "?")] = failed.get(r.get("status", "?"), 0) + 1
        print(file=out)
        _print_summary_block(f"{kernel} [{protocol}]", points_of(rows), failed, out)
        _print_roofline_and_serving(rows, out)
    if with_best_of or only_best_of:
        combined = best_of(results)
        for protocol, points in combined.items():
            print(file=out)
            _print_summary_block(f"{BEST_OF} [{protocol}] — {BEST_OF_LABEL}", points, {}, out)
        if only_best_of and not combined:
            print("\nno best-of: no shape was measured with two or more candidates under one protocol", file=out)


def _print_roofline_and_serving(rows: Sequence[dict], out: TextIO) -> None:
    ok = [r for r in rows if r.get("status") == "ok"]
    fractions = [(r["roofline_fraction"], r["baseline_roofline_fraction"]) for r in ok
                 if r.get("roofline_fraction") is not None and r.get("baseline_roofline_fraction") is not None]
    if fractions:
        print(f"  fraction of roofline (median): {statistics.median(f for f, _ in fractions):.3f}, torch "
              f"{statistics.median(b for _, b in fractions):.3f}", file=out)
    served = [r["served_by"] for r in ok if "served_by" in r]
    if served:
        tuned = sum(1 for s in served if s != "torch")
        print(f"  served by a tuned kernel on {tuned} of {len(served)} shapes, by torch on the rest", file=out)


# --------------------------------------------------------------------------------------------- plots

def _safe(name: str) -> str:
    """A file-name stem for a plot: the name's safe characters, and where it is too long its last 100 of them and a
    hash of the whole name (the kernel and protocol are at its end; two long names must not share a file)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")
    if len(stem) <= 120:
        return stem
    return f"{hashlib.sha256(name.encode()).hexdigest()[:12]}_{stem[-100:].lstrip('._-')}"


def is_grid(points: Sequence[Point]) -> bool:
    """Whether the points are grid shapes spread over at least two K values (worth a heatmap)."""
    dims = set(GRID_DIMS)
    return (len(points) >= 4 and all(p.m in dims and p.n in dims and p.k in dims and p.batch == 1 for p in points)
            and len({p.k for p in points}) >= 2)


def plot_scatter(points: Sequence[Point], title: str, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(8, 5))
    colours = plt.get_cmap("viridis")(range(0, 256, 256 // len(BUCKET_LABELS)))
    for label, colour in zip(BUCKET_LABELS, colours):
        pts = [p for p in points if bucket(p.flops) == label]
        if pts:
            ax.scatter([p.flops for p in pts], [p.speedup for p in pts], s=14, color=colour, label=label,
                       alpha=0.8)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("FLOPs (2·M·N·K·batch)")
    ax.set_ylabel("speedup over torch.matmul")
    ax.set_title(title, fontsize=9)
    ax.legend(title="FLOP bucket", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_grid_heatmaps(points: Sequence[Point], title: str, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ks = sorted({p.k for p in points})
    idx = {d: i for i, d in enumerate(GRID_DIMS)}
    cols = min(5, len(ks))
    rows = -(-len(ks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows + 0.8), squeeze=False)
    logs = [math.log2(p.speedup) for p in points]
    lim = max(0.25, max(abs(v) for v in logs))
    image = None
    for i, (ax, k) in enumerate(zip(axes.flat, ks)):
        grid = np.full((len(GRID_DIMS), len(GRID_DIMS)), np.nan)
        for p in points:
            if p.k == k:
                grid[idx[p.m], idx[p.n]] = math.log2(p.speedup)
        image = ax.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, origin="lower")
        ax.set_title(f"K = {k}", fontsize=9)
        ax.set_xticks(range(len(GRID_DIMS)), [str(d) for d in GRID_DIMS], rotation=90, fontsize=6)
        ax.set_xlabel("N", fontsize=7)
        if i % cols == 0:
            ax.set_yticks(range(len(GRID_DIMS)), [str(d) for d in GRID_DIMS], fontsize=6)
            ax.set_ylabel("M", fontsize=7)
        else:
            ax.set_yticks([])
    for ax in list(axes.flat)[len(ks):]:
        ax.axis("off")
    bar = fig.colorbar(image, ax=axes, shrink=0.8)
    ticks = [t for t in (-3, -2, -1, -0.5, 0, 0.5, 1, 2, 3) if abs(t) <= lim]
    bar.set_ticks(ticks, labels=[f"{2 ** t:.2f}x" for t in ticks])
    bar.set_label("speedup over torch.matmul (blue: faster)")
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_roofline_vs_m(rows: Sequence[dict], title: str, path: Path) -> Path:
    """Fraction of roofline (both sides) and speedup against M: median over the weights (N, K) at each M, with
    the range from the worst to the best weight shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    by_m: Dict[int, List[dict]] = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("roofline_fraction") is not None:
            by_m.setdefault(r["m"], []).append(r)
    ms = sorted(by_m)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label, style in (("roofline_fraction", "candidate", "-"), ("baseline_roofline_fraction", "torch", "--")):
        values = [[r[key] for r in by_m[m]] for m in ms]
        left.plot(ms, [statistics.median(v) for v in values], style, marker="o", label=label)
        left.fill_between(ms, [min(v) for v in values], [max(v) for v in values], alpha=0.15)
    speed = [[r["speedup"] for r in by_m[m]] for m in ms]
    right.plot(ms, [statistics.median(v) for v in speed], marker="o", label="median over weights")
    right.fill_between(ms, [min(v) for v in speed], [max(v) for v in speed], alpha=0.15, label="worst to best")
    right.axhline(1.0, color="gray", lw=0.8)
    for ax, ylabel in ((left, "fraction of roofline"), (right, "speedup over torch")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(results: Results, out_dir: Path, with_best_of: bool = True, only_best_of: bool = False) -> List[Path]:
    """Scatter (and grid heatmap) PNGs per kernel and protocol, and for the best-of combination."""
    out_dir.mkdir(parents=True, exist_ok=True)
    series: List[Tuple[str, str, List[Point]]] = [] if only_best_of else [
        (kernel, protocol, points_of(rows)) for (kernel, protocol), rows in results.groups().items()]
    if with_best_of or only_best_of:
        series += [(BEST_OF, protocol, pts) for protocol, pts in best_of(results).items()]
    written = []
    for kernel, protocol, points in series:
        if not points:
            continue
        title = f"{kernel} [{protocol}]" + (" — per-shape best candidate (optimistic)" if kernel == BEST_OF else "")
        stem = _safe(f"{kernel}_{protocol}")
        written.append(plot_scatter(points, title, out_dir / f"{stem}_speedup_vs_flops.png"))
        if is_grid(points):
            written.append(plot_grid_heatmaps(points, title, out_dir / f"{stem}_grid_heatmap.png"))
    for (kernel, protocol), rows in ({} if only_best_of else results.groups()).items():
        if any(r.get("roofline_fraction") is not None for r in rows):
            written.append(plot_roofline_vs_m(rows, f"{kernel} [{protocol}]",
                                              out_dir / f"{_safe(f'{kernel}_{protocol}')}_roofline_vs_m.png"))
    return written
