#!/usr/bin/env python
"""The entries of a tuned table whose spec has one knob value, with that knob changed: a paired A/B input for
`l2c bench` (each shape measured with both variants of the same kernel, side by side with torch.matmul).

    python scripts/table_variant.py TABLE --where launch_loads=tma --set launch_loads=tma_device -o OUT.json
    python scripts/table_variant.py TABLE --where launch_loads=tma -o OUT.json          (the A side: unchanged)

Each changed spec is validated again (an entry the change makes invalid is an error, not dropped) and named by
its configuration (l2c.ir.config_name). The entries keep the source entry's measured figures, which belong to
the unchanged spec: the table records `variant_of` and `changed`, and is a benchmark input, not a table to ship.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from l2c.ir import config_name, knob  # noqa: E402
from l2c.parser import parse_one  # noqa: E402
from l2c.validate import validate  # noqa: E402


def _assignment(text: str):
    field, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE, got {text!r}")
    knob(field)   # raises for an unknown knob field
    return field, value


def _value(spec, field):
    return str(getattr(spec, field))


def _typed(field: str, value: str):
    """VALUE as the knob's kind holds it (ints for int knobs, `auto` kept as text)."""
    kind = knob(field).kind
    if kind == "float":
        return float(value)
    if kind in ("int", "dim", "auto_int") and value not in ("auto", "any"):
        return int(value)
    return value


def variant(table: dict, where, change) -> dict:
    entries = []
    for i, entry in enumerate(table["entries"]):
        spec = parse_one(entry["spec"], f"entries[{i}]")
        if _value(spec, where[0]) != where[1]:
            continue
        if change is not None:
            field, value = change
            spec = spec.replace(**{field: _typed(field, value)})
            spec = spec.replace(name=config_name(spec))
            validate(spec, entry.get("target", spec.target))
            entry = dict(entry, spec=spec.to_l2())
        entries.append(entry)
    out = {k: v for k, v in table.items() if k != "entries"}
    out["changed"] = list(change) if change else None
    out["entries"] = entries
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("table")
    p.add_argument("--where", type=_assignment, required=True, help="keep entries whose spec has FIELD=VALUE")
    p.add_argument("--set", type=_assignment, help="and change FIELD to VALUE in each kept spec")
    p.add_argument("-o", "--out", required=True)
    args = p.parse_args(argv)
    table = json.loads(Path(args.table).read_text())
    out = variant(table, args.where, args.set)
    out["variant_of"] = {"table": args.table, "field": args.where[0], "value": args.where[1]}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(out['entries'])} of {len(table['entries'])} entries -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
