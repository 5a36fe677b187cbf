"""`l2c check spec.l2`: parse and validate only; print each kernel's resolved knobs or the first error."""
from __future__ import annotations

import sys

from ..knobs import KNOBS
from ..parser import parse_file
from ..validate import RULES, targets_for, validate


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="validate .l2 files without generating code")
    p.add_argument("specs", nargs="*", help=".l2 files")
    p.add_argument("--target", choices=["triton", "cutlass", "all"], default="all")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--rules", action="store_true", help="list the validation rules and exit")
    p.add_argument("--knobs", action="store_true", help="list every knob with its values and default, and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.knobs:
        print(knob_table_markdown())
        return 0
    if args.rules:
        for name, text in RULES.items():
            print(f"{name:24s} {text}")
        return 0
    from ..cli import UsageError
    if not args.specs:
        raise UsageError("no .l2 files given")
    for path in args.specs:
        for spec in parse_file(path):
            targets = targets_for(spec, args.target)
            if not targets:
                print(f"{path}: {spec.name}: skipped (the spec is for {spec.target} only)", file=sys.stderr)
            for target in targets:
                v = validate(spec, target, args.arch)
                extra = f" schedule={v.schedule}" if target == "cutlass" else f" warps={v.warps}"
                print(f"{path}: {spec.name}: ok for {target} on {args.arch} "
                      f"(stages={v.stages}{extra} smem={v.smem_bytes} B)")
    return 0


def _values(knob) -> str:
    if knob.kind == "dim":
        return f"{knob.lo}..{knob.hi}, or any"
    if knob.kind == "float":
        return "number"
    if knob.choices:
        values = ", ".join(map(str, knob.choices))
        return f"auto, {values}" if knob.kind == "auto_int" else values
    return f"{knob.lo}..{knob.hi}"


def knob_table_markdown() -> str:
    """The knob table as Markdown (the README's DSL reference is this output)."""
    rows = ["| knob | values | default | targets | meaning |", "| --- | --- | --- | --- | --- |"]
    for k in KNOBS:
        rows.append(f"| `{k.section + (' ' + k.name + '=' if k.name else '')}` | {_values(k)} | {k.default} | "
                    f"{', '.join(k.targets)} | {k.doc} |")
    return "\n".join(rows)
