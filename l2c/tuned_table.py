"""The tuned-table format (docs/CONTRACTS.md) and the rule that decides which call a table entry may serve.

A table is measurements, and the dispatcher serves a kernel only where a measurement says it beats torch:

- an exact entry: the kernel was measured faster than torch.matmul on exactly this (M, N, K, batch, dtype,
  layouts);
- a token-count range: an entry with ``"m_range": [lo, hi]`` says its shape-generic kernel was measured
  faster than torch at both ends of the range and at every M the producer measured inside it (at least one),
  for the same N, K, batch, dtype and layouts; it serves any M in [lo, hi];
- a cell: an entry with ``"m_range"``, ``"n_range"`` and ``"k_range"`` says its shape-generic kernel was measured
  faster than torch at each of the box's eight corners (same batch, dtype and layouts; `l2c table --cells`); it
  serves any (M, N, K) inside the box;
- a neighbourhood cell (the same keys and ``"near": true``): the shapes measured nearest the box's centre were all
  won by some kernel, most of them by this one, with its wins on both sides of the box (`l2c table --near`). It
  serves where no exact entry, range or corner cell does.

How often a cell's kernel loses inside its box is measured on held-out shapes (docs/CONTRACTS.md, the dispatch rule).
Nothing else: no interpolation past measured shapes. An entry measured at or below torch's speed never serves.

A gated entry (``"gate": "silu"`` or ``"gelu_tanh"``: a kernel with that gated epilogue, measured against torch's
gated MLP projection on a B of K x 2N, N being the output's) is evidence for that gated problem only: it serves
gated calls of its own gate, and a plain call never sees it (nor a gated call a plain entry).

Reading a table never raises past `load_table`: a file that cannot be read or is not a table raises
`TableError` (the dispatcher warns once and runs torch), and a malformed entry is skipped and counted.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .arch import ARCHS
from .errors import DataFileError, L2Error
from .ir import KernelSpec, knob
from .knobs import ANY
from .parser import parse_one

MAX_TABLE_BYTES = 64 * 2**20
DTYPES = ("f16", "bf16")
LAYOUT_WORDS = ("row", "col")
TARGETS = ("triton", "cutlass")
GATES = knob("epilogue_gate").choices   # "none": a plain GEMM entry


class TableError(DataFileError):
    """A tuned table that cannot be used at all; the message names the file and what is wrong."""


@dataclass(frozen=True)
class TunedEntry:
    m: int
    n: int
    k: int
    batch: int
    dtype: str
    layout: str            # "row,col,row": layouts of A, B, C
    target: str
    spec_text: str
    tflops: float
    baseline_tflops: float
    m_lo: Optional[int] = None   # with m_hi: the measured token-count range this entry serves
    m_hi: Optional[int] = None
    range_min_speedup: Optional[float] = None   # the worst measured speedup inside that range (or at those corners)
    gate: str = "none"     # the gated problem it was measured on (epilogue gate); "none": a plain GEMM
    n_lo: Optional[int] = None   # with n_hi, k_lo, k_hi and the M range: the cell (a box of shapes) this entry serves
    n_hi: Optional[int] = None
    k_lo: Optional[int] = None
    k_hi: Optional[int] = None
    near: bool = False     # a neighbourhood cell: decided by the measured shapes nearest its box, not by corners
    recorded_speedup: Optional[float] = None   # the table's own figure (`l2c table`'s: paired per repetition)

    @property
    def speedup(self) -> float:
        """The figure `l2c table` admitted the entry by (its row's `speedup`), else the ratio of its rates."""
        if self.recorded_speedup is not None:
            return self.recorded_speedup
        return self.tflops / self.baseline_tflops if self.baseline_tflops else 0.0

    @property
    def serves_range(self) -> bool:
        """A token-count range of one (N, K), or a cell (`serves_cell`)."""
        return self.m_lo is not None and self.m_hi is not None

    @property
    def serves_cell(self) -> bool:
        return self.n_lo is not None

    def holds(self, m: int, n: int, k: int) -> bool:
        """Whether this cell's box holds (M, N, K)."""
        return self.m_lo <= m <= self.m_hi and self.holds_nk(n, k)

    def holds_nk(self, n: int, k: int) -> bool:
        """Whether this cell's box holds (N, K) at some M (its M range)."""
        return self.n_lo <= n <= self.n_hi and self.k_lo <= k <= self.k_hi

    def to_row(self) -> Dict[str, object]:
        row = {"m": self.m, "n": self.n, "k": self.k, "batch": self.batch, "dtype": self.dtype,
               "layout": self.layout, "target": self.target, "spec": self.spec_text, "tflops": self.tflops,
               "baseline_tflops": self.baseline_tflops, "speedup": round(self.speedup, 4)}
        if self.serves_range:
            row["m_range"] = [self.m_lo, self.m_hi]
            if self.serves_cell:
                row["n_range"], row["k_range"] = [self.n_lo, self.n_hi], [self.k_lo, self.k_hi]
            if self.range_min_speedup is not None:
                row["range_min_speedup"] = self.range_min_speedup
        if self.near:
            row["near"] = True
        if self.gate != "none":
            row["gate"] = self.gate
        return row


def _whole(value, what: str, lo: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value < 2**31:
        raise ValueError(f"{what} must be a whole number in [{lo}, 2^31), got {value!r}")
    return value


def _rate(value, what: str) -> float:
    try:   # float(): a JSON integer past 1e308 overflows here (math.isfinite would raise OverflowError)
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{what} must be a finite non-negative number, got {value!r}"[:300])
    return number


# Every `layout` value of an entry or results row: A, B and C each row or col, joined by commas.
LAYOUTS = frozenset(f"{a},{b},{c}" for a in LAYOUT_WORDS for b in LAYOUT_WORDS for c in LAYOUT_WORDS)
_BIG = 2**31


def _span_ok(rng, value: int) -> bool:
    return (type(rng) is list and len(rng) == 2 and type(rng[0]) is int and type(rng[1]) is int
            and 0 < rng[0] <= value <= rng[1] < _BIG)


def _quick_entry(row: dict) -> Optional[TunedEntry]:
    """A well-formed row built with one quick test per field, or None for a row with anything unusual, which
    `entry_from_row`'s full checks then take (and name what is wrong with). A 3,000-row table is read on a process's
    first tuned call, or beside it: the full checks cost twice as long."""
    m, n, k, batch = row.get("m"), row.get("n"), row.get("k"), row.get("batch", 1)
    dtype, layout, target, spec = row.get("dtype"), row.get("layout"), row.get("target"), row.get("spec")
    tflops, base, speedup = row.get("tflops"), row.get("baseline_tflops"), row.get("speedup")
    gate, near, worst = row.get("gate", "none"), row.get("near", False), row.get("range_min_speedup")
    m_range, n_range, k_range = row.get("m_range"), row.get("n_range"), row.get("k_range")
    if not (type(m) is int and type(n) is int and type(k) is int and type(batch) is int
            and 0 < m < _BIG and 0 < n < _BIG and 0 < k < _BIG and 0 < batch < _BIG
            and type(dtype) is str and dtype in DTYPES and type(layout) is str and layout in LAYOUTS
            and type(target) is str and target in TARGETS and type(spec) is str and spec.strip()
            and type(tflops) is float and type(base) is float and 0.0 <= tflops < math.inf and 0.0 <= base < math.inf
            and (speedup is None or (type(speedup) is float and 0.0 <= speedup < math.inf))
            and type(gate) is str and gate in GATES and near in (True, False)
            and (m_range is None or _span_ok(m_range, m))
            and ((n_range is None and k_range is None and not near)
                 or (m_range is not None and _span_ok(n_range, n) and _span_ok(k_range, k)))
            and (worst is None or m_range is None or (type(worst) is float and 1.0 < worst < math.inf))):
        return None
    ranged = m_range is not None
    cell = ranged and n_range is not None
    return TunedEntry(m=m, n=n, k=k, batch=batch, dtype=dtype, layout=layout, target=target, spec_text=spec,
                      tflops=tflops, baseline_tflops=base, m_lo=m_range[0] if ranged else None,
                      m_hi=m_range[1] if ranged else None, range_min_speedup=worst if ranged else None, gate=gate,
                      n_lo=n_range[0] if cell else None, n_hi=n_range[1] if cell else None,
                      k_lo=k_range[0] if cell else None, k_hi=k_range[1] if cell else None, near=near,
                      recorded_speedup=speedup)


def entry_from_row(row) -> TunedEntry:
    """One table row as a TunedEntry; ValueError saying which field is wrong."""
    if type(row) is dict:
        plain = _quick_entry(row)
        if plain is not None:
            return plain
    if not isinstance(row, dict):
        raise ValueError(f"an entry must be an object, got {type(row).__name__}")
    missing = [f for f in ("m", "n", "k", "dtype", "layout", "target", "spec", "tflops", "baseline_tflops")
               if f not in row]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    dtype, layout, target, spec = row["dtype"], row["layout"], row["target"], row["spec"]
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be three of row/col joined by commas, got {layout!r}")
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("spec must be the kernel's .l2 text")
    gate = row.get("gate", "none")
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    m_lo = m_hi = worst = None
    m, n, k = _whole(row["m"], "m"), _whole(row["n"], "n"), _whole(row["k"], "k")
    n_range, k_range = row.get("n_range"), row.get("k_range")
    if (n_range is None) != (k_range is None) or (n_range is not None and row.get("m_range") is None):
        raise ValueError("a cell has all three of m_range, n_range and k_range")
    near = row.get("near", False)
    if near not in (True, False) or (near and n_range is None):
        raise ValueError(f"near must be true or false, and true only on a cell, got {near!r}")
    n_lo = n_hi = k_lo = k_hi = None
    if n_range is not None:
        n_lo, n_hi = _span(n_range, n, "n")
        k_lo, k_hi = _span(k_range, k, "k")
    if row.get("m_range") is not None:
        m_lo, m_hi = _span(row["m_range"], m, "m")
        if row.get("range_min_speedup") is not None:
            worst = _rate(row["range_min_speedup"], "range_min_speedup")
            if worst <= 1.0:
                raise ValueError(f"range_min_speedup {worst} is no win: a range serves only where it won")
    return TunedEntry(m=m, n=n, k=k, batch=_whole(row.get("batch", 1), "batch"), dtype=dtype, layout=layout,
                      target=target, spec_text=spec, tflops=_rate(row["tflops"], "tflops"),
                      baseline_tflops=_rate(row["baseline_tflops"], "baseline_tflops"), m_lo=m_lo, m_hi=m_hi,
                      range_min_speedup=worst, gate=gate, n_lo=n_lo, n_hi=n_hi, k_lo=k_lo, k_hi=k_hi, near=near,
                      recorded_speedup=_rate(row["speedup"], "speedup") if row.get("speedup") is not None else None)


def _span(rng, value: int, axis: str) -> Tuple[int, int]:
    """An entry's [lo, hi] along one axis, holding the entry's own `value`; ValueError naming the field."""
    if not isinstance(rng, list) or len(rng) != 2:
        raise ValueError(f"{axis}_range must be [lo, hi], got {rng!r}")
    lo, hi = _whole(rng[0], f"{axis}_range[0]"), _whole(rng[1], f"{axis}_range[1]")
    if not lo <= value <= hi:
        raise ValueError(f"{axis}_range {rng} does not contain the entry's {axis}={value}")
    return lo, hi


class ServedMs:
    """The token counts M some entry serves for one (N, K): its exact Ms and its token ranges (a cell's M range
    among them)."""
    __slots__ = ("exact", "spans")

    def __init__(self, exact: frozenset, spans: Tuple[Tuple[int, int], ...]):
        self.exact, self.spans = exact, spans

    def __contains__(self, m) -> bool:
        if m in self.exact:
            return True
        for lo, hi in self.spans:   # a loop, not any(): this runs on every call of a served (N, K)
            if lo <= m <= hi:
                return True
        return False


def _joined(spans) -> List[Tuple[int, int]]:
    """Closed spans sorted, overlapping or adjacent ones joined."""
    runs: List[List[int]] = []
    for lo, hi in sorted(spans):
        if runs and lo <= runs[-1][1] + 1:
            runs[-1][1] = max(runs[-1][1], hi)
        else:
            runs.append([lo, hi])
    return [(lo, hi) for lo, hi in runs]


def _ms_holder(exact: frozenset, spans: Tuple[Tuple[int, int], ...]):
    """What holds these Ms, with C membership tests where it can: the frozenset itself where there is no range, a
    `range` for one run of Ms and no exact one, else a ServedMs of the runs (overlapping or adjacent spans joined)."""
    runs = _joined(spans)
    if not runs:
        return exact
    if len(runs) == 1 and not exact:
        return range(runs[0][0], runs[0][1] + 1)
    return ServedMs(exact, tuple(runs))


def served_spans(ms) -> List[Tuple[int, int]]:
    """The Ms a holder of `_ms_holder` (a frozenset, a `range` of step 1 or a ServedMs) holds, as sorted closed
    spans: what the C++ call table's first test keeps (l2c.native_call)."""
    if isinstance(ms, range):
        return [(ms.start, ms.stop - 1)] if len(ms) else []
    if isinstance(ms, ServedMs):
        return _joined([(m, m) for m in ms.exact] + list(ms.spans))
    return _joined((m, m) for m in ms)


_NO_M = frozenset()
MAX_REMEMBERED_NK = 1 << 16


class ServedShapes(dict):
    """(N, K) -> the Ms some entry serves there (a frozenset, a range or a ServedMs; empty where none), keyed (K, N)
    when `transposed` (b's shape in `a @ b`). Each (N, K) is worked out the first time it is asked for (`d[nk]`):
    its exact entries' Ms, its token ranges and the M ranges of the cells whose box holds it; then remembered, so a
    call costs one dict lookup and one membership test."""

    def __init__(self, exact_ms: Dict[Tuple[int, int], frozenset], spans: Dict[Tuple[int, int], list],
                 cells: List["TunedEntry"], transposed: bool = False):
        super().__init__()
        self.exact_ms, self.spans, self.cells, self.transposed = exact_ms, spans, cells, transposed

    def __missing__(self, key):
        if len(key) != 2:
            return _NO_M
        n, k = (key[1], key[0]) if self.transposed else key
        spans = self.spans.get((n, k), []) + [(e.m_lo, e.m_hi) for e in self.cells if e.holds_nk(n, k)]
        ms = _ms_holder(self.exact_ms.get((n, k), _NO_M), tuple(spans))
        if len(self) < MAX_REMEMBERED_NK:
            self[key] = ms
        return ms


class _NoShapes(ServedShapes):
    """Where nothing serves: every (N, K) holds no M, and none is remembered (one object shared by every
    dispatcher; under torch.compile a key added to it would change a guarded length and recompile)."""

    def __missing__(self, key):
        return _NO_M


NO_SHAPES = _NoShapes({}, {}, [])
NO_LAYOUTS = (NO_SHAPES, NO_SHAPES)   # the same for `a @ b` of either layout of b


class TunedTable:
    """The served entries of one architecture's table, indexed by the dispatch rule (module docstring). The gated
    entries of each gate are a table of their own (`gated`), so that their (N, K) never meets a plain call's.
    `serve_all` serves every entry whatever its figures: a table made in memory to measure a kernel through the
    dispatcher (`l2c bench serving:FILE`), never one read from a file."""

    def __init__(self, entries: List[TunedEntry], arch: str = "sm_90", source: str = "<memory>", skipped: int = 0,
                 first_skipped: str = "", gate: str = "none", serve_all: bool = False, gpu: Optional[str] = None):
        self.arch = arch
        self.gpu = gpu                  # the GPU its entries were measured on (its file's "gpu"), if it says
        self.source = source
        self.skipped = skipped          # malformed rows left out when the table was read
        self.first_skipped = first_skipped   # the first of them and what is wrong with it
        self.gate = gate                # the problem this table's entries were measured on
        self.exact: Dict[Tuple, TunedEntry] = {}
        self.ranges: Dict[Tuple, List[TunedEntry]] = {}
        self.cells: Dict[Tuple, List[TunedEntry]] = {}   # (dtype, layout, batch) -> cells
        gated: Dict[str, List[TunedEntry]] = {}
        for e in entries:
            if e.gate != gate:
                if gate == "none":
                    gated.setdefault(e.gate, []).append(e)
                continue
            if e.speedup <= 1.0 and not serve_all:   # measured no faster than torch: never served
                continue
            if e.serves_cell:
                self.cells.setdefault((e.dtype, e.layout, e.batch), []).append(e)
                continue
            key = (e.dtype, e.layout, e.n, e.k, e.batch)
            if e.serves_range:
                self.ranges.setdefault(key, []).append(e)
                continue
            best = self.exact.get(key + (e.m,))
            if best is None or e.speedup > best.speedup:
                self.exact[key + (e.m,)] = e
        for group in list(self.ranges.values()) + list(self.cells.values()):
            # corner cells before neighbourhood cells, then the best worst case, then the narrowest
            group.sort(key=lambda e: (e.near, -(e.range_min_speedup or e.speedup), e.m_hi - e.m_lo))
        self._served: Dict[Tuple, ServedShapes] = {}
        self.gated: Dict[str, "TunedTable"] = {g: TunedTable(group, arch, source, gate=g, serve_all=serve_all)
                                               for g, group in gated.items()}

    @classmethod
    def load(cls, path) -> "TunedTable":
        return load_table(path)

    def lookup(self, dtype: str, layout: str, m: int, n: int, k: int, batch: int = 1,
               gate: str = "none") -> Optional[TunedEntry]:
        """The entry that serves this call under the dispatch rule, or None (torch serves it). A gated call (`gate`,
        N the output's columns) is looked up among the entries measured on that gated problem."""
        if gate != self.gate:
            sub = self.gated.get(gate)
            return sub.lookup(dtype, layout, m, n, k, batch, gate) if sub is not None else None
        key = (dtype, layout, n, k, batch)
        hit = self.exact.get(key + (m,))
        if hit is not None:
            return hit
        for e in self.ranges.get(key, ()):
            if e.m_lo <= m <= e.m_hi:
                return e
        for e in self.cells.get((dtype, layout, batch), ()):
            if e.holds(m, n, k):
                return e
        return None

    def may_serve(self, m: int, n: int, k: int, gate: str = "none", dtype: Optional[str] = None,
                  layout: Optional[str] = None) -> bool:
        """Whether any entry serves M for this (N, K) (of this gated problem; of this dtype and layouts where given):
        False means torch."""
        if gate != self.gate:
            sub = self.gated.get(gate)
            return sub is not None and sub.may_serve(m, n, k, gate, dtype, layout)
        return m in self.served_shapes(dtype, layout)[n, k]

    def served_shapes(self, dtype: Optional[str] = None, layout: Optional[str] = None,
                      transposed: bool = False) -> ServedShapes:
        """(N, K) -> the Ms the entries of this dtype and layouts serve there (None: any), keyed (K, N) when
        `transposed`: the dispatcher's first test holds these objects (made once each)."""
        key = (dtype, layout, transposed)
        if key not in self._served:
            def ours(e):
                return dtype in (None, e.dtype) and layout in (None, e.layout)
            exact_ms: Dict[Tuple[int, int], set] = {}
            for e in self.exact.values():
                if ours(e):
                    exact_ms.setdefault((e.n, e.k), set()).add(e.m)
            spans: Dict[Tuple[int, int], list] = {}
            for group in self.ranges.values():
                for e in group:
                    if ours(e):
                        spans.setdefault((e.n, e.k), []).append((e.m_lo, e.m_hi))
            cells = [e for group in self.cells.values() for e in group if ours(e)]
            self._served[key] = ServedShapes({nk: frozenset(ms) for nk, ms in exact_ms.items()}, spans, cells,
                                             transposed)
        return self._served[key]

    def __len__(self) -> int:
        return len(self.exact)

    @classmethod
    def serving(cls, spec_text: str, target: str, dtype: str, layout: str, arch: str = "sm_90") -> "TunedTable":
        """A table whose one cell serves `spec_text` at every shape of this dtype and layouts: what a table entry of
        that kernel would serve, so that `l2c bench serving:FILE` measures it through the dispatcher (the C++ served
        call included). Its figures are no measurement, hence `serve_all`."""
        top = 2**31 - 1
        entry = TunedEntry(m=1, n=1, k=1, batch=1, dtype=dtype, layout=layout, target=target, spec_text=spec_text,
                           tflops=0.0, baseline_tflops=0.0, m_lo=1, m_hi=top, n_lo=1, n_hi=top, k_lo=1, k_hi=top)
        return cls([entry], arch=arch, source="<serving>", serve_all=True)


def served_spec(entry: TunedEntry, m: int, has_bias: bool, activation: str, residual: bool = False) -> KernelSpec:
    """The spec the dispatcher builds to serve `entry` at a call with M = `m` and this epilogue: the entry's spec,
    generic in M unless it is fixed at exactly `m`, with the call's bias (per column, as nn.Linear's), activation,
    the entry's gated epilogue and, with `residual`, the residual added as the C input (beta=1) fused
    (`KernelSpec.with_epilogue`: a direct store becomes a TMA store where a bias or activation is fused). The
    prebuilt pack builds the same specs, so that what it holds is what calls ask for. Raises L2Error for a spec
    that does not parse or whose layouts are not the entry's."""
    spec = parse_one(entry.spec_text, file="<tuned table>")
    layouts = f"{spec.layout_a},{spec.layout_b},{spec.layout_c}"
    if layouts != entry.layout:   # the call's operands are the entry's layouts; its output is row-major
        raise L2Error(f"the entry serves layout {entry.layout} but its spec's layout is {layouts}",
                      file="<tuned table>", knob="layout")
    if spec.problem_m != m:
        spec = spec.replace(problem_m=ANY)
    # what torch.matmul computes, whatever the entry's own spec scales or stores: alpha 1, C only as the residual,
    # the operands' type out
    return spec.replace(epilogue_alpha=1.0, epilogue_beta=1.0 if residual else 0.0, types_c=spec.types_a,
                        epilogue_gate=entry.gate).with_epilogue("col" if has_bias else "none", activation)


def served_ms(entry: TunedEntry) -> List[int]:
    """Call Ms that between them give every distinct spec `served_spec` makes for the Ms `entry` serves: its own M
    for an exact entry; for a range, both ends (the kernel generic in M wherever M differs from the spec's fixed
    M) and the spec's fixed M if the range holds it."""
    if not entry.serves_range:
        return [entry.m]
    ms = {entry.m_lo, entry.m_hi}
    fixed = parse_one(entry.spec_text, file="<tuned table>").problem_m
    if fixed != ANY and entry.m_lo <= fixed <= entry.m_hi:
        ms.add(fixed)
    return sorted(ms)


def served_entries(table: TunedTable) -> List[TunedEntry]:
    """Every entry of `table` that can serve a call (those the lookup can return): exact ones first, then token
    ranges and cells, then the gated entries."""
    entries = list(table.exact.values())
    for group in list(table.ranges.values()) + list(table.cells.values()):
        entries += group
    for sub in table.gated.values():
        entries += served_entries(sub)
    return entries


# The calls a table entry's kernel is prepared for ahead of use: (has bias, activation). Bias is per column, as
# nn.Linear's; an activation is fused only where the caller asks for it.
PLAIN_EPILOGUES: Tuple[Tuple[bool, str], ...] = ((False, "none"), (True, "none"))


@dataclass(frozen=True)
class ServedKernel:
    """A kernel the dispatcher builds for one table entry and call epilogue, at a shape it serves."""
    spec_text: str
    target: str
    m: int
    n: int
    k: int
    label: str           # which entry and call, for messages


def evidence_ms(entry: TunedEntry) -> List[int]:
    """The token counts at which to measure what an entry serves: its M; for a range its ends and its middle."""
    if not entry.serves_range:
        return [entry.m]
    return sorted({entry.m_lo, (entry.m_lo + entry.m_hi) // 2, entry.m_hi})


def served_problem_shapes(table: "TunedTable", dtype: str, layout: str) -> List[Tuple[int, int, int, int]]:
    """(M, N, K, batch) of every plain (ungated) call `table` serves in this dtype and layouts, at `evidence_ms`:
    what `l2c bench dispatch:TABLE --shapes served` measures, the evidence `l2c table --protocol kernel,call`
    makes a table from. Neighbourhood cells are left out: their evidence is the points `l2c table --near` reads,
    and rows at their boxes' corners would cut the corner cells' boxes."""
    shapes = {(m, e.n, e.k, e.batch) for e in served_entries(table) if e.gate == "none" and e.dtype == dtype
              and e.layout == layout and not e.near for m in evidence_ms(e)}   # a neighbourhood cell's: its points
    return sorted(shapes)


def served_kernels(table: "TunedTable", epilogues=PLAIN_EPILOGUES) -> Tuple[List[ServedKernel], List[str]]:
    """Every distinct kernel the dispatcher builds for `table`'s entries with these call epilogues (each at one M
    it serves), and a message for each entry whose spec does not parse (the dispatcher sends its calls to torch;
    the other entries' kernels are still listed)."""
    kernels: Dict[Tuple[str, str], ServedKernel] = {}
    unusable: List[str] = []
    for entry in served_entries(table):
        try:
            for m in served_ms(entry):
                for has_bias, activation in epilogues:
                    text = served_spec(entry, m, has_bias, activation).to_l2()
                    label = (f"{entry.dtype} {entry.layout} {m}x{entry.n}x{entry.k} bias="
                             f"{'col' if has_bias else 'none'} activation={activation}")
                    kernels.setdefault((text, entry.target),
                                       ServedKernel(text, entry.target, m, entry.n, entry.k, label))
        except L2Error as err:
            unusable.append(f"the entry {entry.dtype} {entry.layout} {entry.m}x{entry.n}x{entry.k}: {err}")
    return list(kernels.values()), unusable


def read_table_data(path) -> dict:
    """A tuned table's JSON object as written (an object with an 'entries' list); TableError for a file that is not
    one. `load_table` builds the table from it; `l2c table --into` and `l2c bench TABLE.json` read it as it is."""
    path = Path(path)
    try:
        if not path.is_file():
            raise TableError(f"{path}: not a file")
        if path.stat().st_size > MAX_TABLE_BYTES:
            raise TableError(f"{path}: larger than {MAX_TABLE_BYTES >> 20} MiB; not a tuned table")
        data = json.loads(path.read_bytes().decode("utf-8"))
    except TableError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise TableError(f"{path}: cannot read tuned table: {type(err).__name__}: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise TableError(f"{path}: not a tuned table (an object with an 'entries' list; see docs/CONTRACTS.md)")
    return data


def load_table(path) -> TunedTable:
    """Read a tuned table; TableError for a file that is not one. Malformed entries are skipped and counted."""
    return table_from_data(read_table_data(path), path)


def table_from_data(data: dict, path) -> TunedTable:
    """The table `read_table_data` read from `path`."""
    arch = data.get("arch", "sm_90")
    if not isinstance(arch, str) or arch not in ARCHS:   # it names files (the pack's); only a known architecture may
        raise TableError(f"{path}: 'arch' must be one of {', '.join(sorted(ARCHS))}, got {arch!r}")
    entries, skipped, first = [], 0, ""
    for i, row in enumerate(data["entries"]):
        try:
            entries.append(entry_from_row(row))
        except (ValueError, TypeError) as err:
            skipped += 1
            first = first or f"entries[{i}]: {err}"
    gpu = data.get("gpu")
    return TunedTable(entries, arch=arch, source=str(path), skipped=skipped, first_skipped=first,
                      gpu=gpu if isinstance(gpu, str) else None)
