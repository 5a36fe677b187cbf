#!/usr/bin/env python
"""The entries of a tuned table whose spec has given knob values, with one knob changed: a paired A/B input for
`l2c bench` (each shape measured with both variants of the same kernel, side by side with torch.matmul).

    python scripts/table_variant.py TABLE --where launch_loads=tma --set launch_loads=tma_device -o OUT.json
    python scripts/table_variant.py TABLE --where launch_loads=tma -o OUT.json          (the A side: unchanged)
    python scripts/table_variant.py TABLE --where target=cutlass --where epilogue_bias=none \
        --max-gflop 1 --per-spec 3 --set epilogue_store=direct -o OUT.json

An entry is kept where its target and spec match every --where (FIELD=VALUE; `target` is the entry's target), under
--max-gflop, and among the first --per-spec of its spec (its kept entries in order of size, spread from the smallest
to the largest), so that the A and B sides of one selection hold the same shapes. Each changed spec is validated
again (an entry the change makes invalid is an error, not dropped) and named by its configuration
(l2c.ir.config_name). The entries keep the source entry's measured figures, which belong to the unchanged spec: the
table records `variant_of` and `changed`, and is a benchmark input, not a table to ship.

    python scripts/table_variant.py TABLE --whole --where target=cutlass --where launch_family=gemm \
        --set epilogue_store=staged -o OUT.json --specs-out CHANGED.l2

`--whole` keeps every entry of the table (exact, ranges and cells, with its other fields) and changes the spec of
each one matching every --where: the table as the dispatcher would serve it with the twins, for `l2c.matmul` through
both tables side by side (`l2c bench dispatch:TABLE dispatch:OUT.json`). An entry whose changed spec does not
validate keeps its spec and is listed under `kept` with the rule it broke; --specs-out then lists the changed specs
only (the others are built already).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from l2c.ir import config_name, knob  # noqa: E402
from l2c.parser import parse_one  # noqa: E402
from l2c.validate import validate  # noqa: E402


def _assignment(text: str) -> Tuple[str, str]:
    field, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE, got {text!r}")
    try:
        knob(field)
    except KeyError:
        raise argparse.ArgumentTypeError(f"{field!r} is no knob field (e.g. launch_swap, epilogue_bias)") from None
    return field, value


def _typed(field: str, value: str):
    """VALUE as the knob's kind holds it (ints for int knobs, `auto` kept as text)."""
    kind = knob(field).kind
    if kind == "float":
        return float(value)
    if kind in ("int", "dim", "auto_int") and value not in ("auto", "any"):
        return int(value)
    return value


def _matches(entry: dict, spec, where: Sequence[Tuple[str, str]]) -> bool:
    """Whether the entry's target (field `target`) and spec hold every FIELD=VALUE, compared as the knob's kind."""
    return all(entry.get("target", spec.target) == value if field == "target"
               else getattr(spec, field) == _typed(field, value) for field, value in where)


def _spread(count: int, keep: Optional[int]) -> List[int]:
    """`keep` indices of range(count) from the first to the last, evenly spaced (all of them without `keep`)."""
    if keep is None or count <= keep:
        return list(range(count))
    if keep == 1:
        return [0]
    return sorted({round(i * (count - 1) / (keep - 1)) for i in range(keep)})


def _twin(spec, change: Tuple[str, str], entry: dict):
    """`spec` with FIELD set to VALUE, named by its configuration and validated for the entry's target."""
    field, value = change
    twin = spec.replace(**{field: _typed(field, value)})
    twin = twin.replace(name=config_name(twin))
    validate(twin, entry.get("target", twin.target))
    return twin


def variant(table: dict, where: Sequence[Tuple[str, str]], change: Optional[Tuple[str, str]],
            max_gflop: Optional[float] = None, per_spec: Optional[int] = None) -> dict:
    by_spec: Dict[str, List[Tuple[int, int, dict, object]]] = {}   # spec text -> (flops, index, entry, spec)
    for i, entry in enumerate(table["entries"]):
        spec = parse_one(entry["spec"], f"entries[{i}]")
        flops = 2 * entry["m"] * entry["n"] * entry["k"] * entry.get("batch", 1)
        if _matches(entry, spec, where) and (max_gflop is None or flops < max_gflop * 1e9):
            by_spec.setdefault(entry["spec"], []).append((flops, i, entry, spec))
    kept = []
    for rows in by_spec.values():
        rows.sort(key=lambda row: row[:2])
        kept += [rows[j] for j in _spread(len(rows), per_spec)]
    entries = []
    for _, i, entry, spec in sorted(kept, key=lambda row: row[1]):
        if change is not None:
            entry = dict(entry, spec=_twin(spec, change, entry).to_l2())
        entries.append(entry)
    out = {k: v for k, v in table.items() if k not in ("entries", "near")}
    out["changed"] = list(change) if change else None
    out["entries"] = entries
    return out


def whole_variant(table: dict, where: Sequence[Tuple[str, str]], change: Tuple[str, str]) -> dict:
    """Every entry of `table`, the spec of each one matching `where` changed (see the module's `--whole`)."""
    from l2c.errors import L2ValidationError
    entries, kept, changed = [], [], 0
    for i, entry in enumerate(table["entries"]):
        spec = parse_one(entry["spec"], f"entries[{i}]")
        if _matches(entry, spec, where):
            try:
                entry = dict(entry, spec=_twin(spec, change, entry).to_l2())
                changed += 1
            except L2ValidationError as err:
                kept.append({"entry": i, "rule": err.rule})
        entries.append(entry)
    out = {k: v for k, v in table.items() if k != "entries"}
    out.update(changed=list(change), changed_entries=changed, kept=kept, entries=entries)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("table")
    p.add_argument("--where", type=_assignment, action="append", required=True,
                   help="keep entries whose spec has FIELD=VALUE (repeatable: all must hold)")
    p.add_argument("--set", type=_assignment, help="and change FIELD to VALUE in each kept spec")
    p.add_argument("--max-gflop", type=float, help="keep entries under this many GFLOP")
    p.add_argument("--per-spec", type=int, help="keep at most this many entries per spec, spread over their sizes")
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--specs-out", help="also write the kept entries' distinct specs as one .l2 file (for l2c build)")
    p.add_argument("--whole", action="store_true", help="keep every entry, changing the matching ones (needs --set; "
                                                        "no --max-gflop or --per-spec)")
    args = p.parse_args(argv)
    if args.whole and (args.set is None or args.max_gflop is not None or args.per_spec is not None):
        p.error("--whole needs --set and takes no --max-gflop or --per-spec")
    table = json.loads(Path(args.table).read_text())
    if args.whole:
        out = whole_variant(table, args.where, args.set)
        specs = [e["spec"] for e, old in zip(out["entries"], table["entries"]) if e["spec"] != old["spec"]]
    else:
        out = variant(table, args.where, args.set, args.max_gflop, args.per_spec)
        specs = [e["spec"] for e in out["entries"]]
    out["variant_of"] = {"table": args.table, "where": [list(w) for w in args.where], "max_gflop": args.max_gflop,
                         "per_spec": args.per_spec, "whole": args.whole}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    if args.specs_out:
        Path(args.specs_out).write_text("\n".join(dict.fromkeys(specs)))
    if args.whole:
        print(f"{len(out['entries'])} entries, {out['changed_entries']} changed, {len(out['kept'])} kept -> {args.out}")
    else:
        print(f"{len(out['entries'])} of {len(table['entries'])} entries -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
