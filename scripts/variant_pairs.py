#!/usr/bin/env python
"""Paired A/B figures of a variant table against its source (`scripts/table_variant.py`), from one `l2c bench A.json
B.json` results file: per entry the B kernel's time over the A kernel's at the entry's shape, both measured against
torch in the same run.

    python scripts/variant_pairs.py RESULTS.jsonl --a A.json --b B.json [--out SUMMARY.json]

Per protocol: the entries where both sides verified, the geomean of B's time over A's (below 1: B is faster), how
many B won or lost by 3% (the protocol's spread), and the same by tile schedule, by M and by dtype and layouts; the
entries a side failed; rows left unpaired (no row of the other side) or not of the tables given (another selection's
rows in a reused results file), counted and left out.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from l2c.results_file import read_rows  # noqa: E402

MARGIN = 1.03


def _geomean(values: List[float]):
    return round(math.exp(sum(map(math.log, values)) / len(values)), 4) if values else None


def _summary(ratios: List[float]) -> dict:
    return {"shapes": len(ratios), "b_over_a_time_geomean": _geomean(ratios),
            "b_faster": sum(r <= 1 / MARGIN for r in ratios), "b_slower": sum(r >= MARGIN for r in ratios)}


def _m_bucket(m: int) -> str:
    for top in (4, 16, 64, 256):
        if m <= top:
            return f"<={top}"
    return ">256"


def schedules(table: dict) -> List[str]:
    """The tile schedule each entry of a table runs (its `launch schedule`, `auto` resolved), in entry order."""
    from l2c.parser import parse_one
    from l2c.validate import validate
    return [validate(parse_one(e["spec"]), e["target"]).schedule for e in table["entries"]]


def _entry(row: dict) -> tuple:
    """(entry index, kernel name) of a table candidate's row: its kernel id is `TABLE#INDEX:NAME@TARGET`."""
    index, _, rest = row["kernel"].rsplit("#", 1)[1].partition(":")
    return int(index), rest.rsplit("@", 1)[0]


def _of_table(row: dict, table: dict) -> bool:
    """Whether `row` measured an entry of `table`: its index holds that kernel at that shape."""
    index, name = _entry(row)
    if index >= len(table["entries"]):
        return False
    e = table["entries"][index]
    return (e["spec"].split()[1] == name and (e["m"], e["n"], e["k"], e.get("batch", 1)) ==
            (row["m"], row["n"], row["k"], row.get("batch", 1)))


def pairs(rows, a_source: str, b_source: str, a_table: dict, b_table: dict) -> dict:
    """The summary (module docstring) of `rows`, pairing the row of each entry of `a_table` measured from
    `a_source` with that of the same entry of `b_table` from `b_source` (a variant table keeps its source's entries
    in order)."""
    tables = {a_source: a_table, b_source: b_table}
    sides: Dict[str, Dict[tuple, dict]] = {a_source: {}, b_source: {}}
    foreign = 0
    for r in rows:
        if r.get("type") != "result" or r.get("source") not in sides:
            continue
        if not _of_table(r, tables[r["source"]]):
            foreign += 1
            continue
        sides[r["source"]][(r["protocol"], _entry(r)[0])] = r
    schedule_of = schedules(a_table)
    unpaired = len(set(sides[a_source]) ^ set(sides[b_source]))
    failed: List[dict] = []
    groups: Dict[str, Dict[str, List[float]]] = {}
    for (protocol, index), a in sorted(sides[a_source].items()):
        b = sides[b_source].get((protocol, index))
        if b is None:
            continue
        if a.get("status") != "ok" or b.get("status") != "ok":
            failed.append({"protocol": protocol, "entry": index, "shape": [a["m"], a["n"], a["k"], a.get("batch", 1)],
                           "dtype": a["dtype"], "layout": a["layout"], "a": a.get("status"), "b": b.get("status"),
                           "b_reason": b.get("reason")})
            continue
        ratio = a["speedup"] / b["speedup"]   # B's time over A's: each side's speedup is torch's time over its own
        by_group = groups.setdefault(protocol, {})
        for group in ("all", f"schedule={schedule_of[index]}", f"m{_m_bucket(a['m'])}", f"{a['dtype']} {a['layout']}"):
            by_group.setdefault(group, []).append(ratio)
    out = {protocol: {group: _summary(ratios) for group, ratios in sorted(by_group.items())}
           for protocol, by_group in groups.items()}
    return {"a": a_source, "b": b_source, "margin": MARGIN, "protocols": out, "failed": failed,
            "unpaired_rows": unpaired, "rows_of_other_tables": foreign}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+")
    p.add_argument("--a", required=True, help="the A table as the bench named it")
    p.add_argument("--b", required=True, help="the B table")
    p.add_argument("--out")
    args = p.parse_args(argv)
    summary = pairs([r for path in args.results for r in read_rows(path)], args.a, args.b,
                    json.loads(Path(args.a).read_text()), json.loads(Path(args.b).read_text()))
    text = json.dumps(summary, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
