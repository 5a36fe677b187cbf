"""Writes and loads `grammar/l2.lark`, the surface syntax of `.l2` files.

The grammar is generated from the knob table (`l2c.knobs`) so that the two can never disagree: every
statement keyword, knob name and enumerated value of the table is spelled literally in the grammar.
That makes the grammar a tight constraint for grammar-guided LLM decoding. The committed file is the
artifact users and LLM back ends read; `python -m l2c.grammar` rewrites it and a test checks that the
committed copy is current.

The grammar keeps to the subset shared by Lark and llguidance: plain rules, string literals, regex
terminals, `%import common` and `%ignore` only (no `::=`, no terminal priorities).
"""
from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Optional

from lark import Lark

from .knobs import AUTO, KNOBS, SECTIONS, Knob, knobs_in

HEADER = """\
// l2.lark: the l2c kernel-spec language. GENERATED from l2c/knobs.py by `python -m l2c.grammar`;
// do not edit by hand (tests/test_grammar.py checks this file is current).
//
// A file holds one or more kernels:
//
//   kernel hgemm_128x256 {
//     problem  m=4096 n=4096 k=4096
//     types    a=f16 b=f16 c=f16 acc=f32
//     layout   a=row b=col c=row
//     tile     m=128 n=256 k=64
//   }
//
// Statements may come in any order; a knob left out takes its default. `#` starts a comment.
"""


def _literal_alternatives(values) -> str:
    return "(" + " | ".join(f'"{v}"' for v in values) + ")"


def _value_expr(knob: Knob) -> str:
    if knob.kind == "enum":
        return _literal_alternatives(knob.choices)
    if knob.kind == "int":
        return _literal_alternatives(knob.choices) if knob.choices else "INT"
    if knob.kind == "auto_int":
        return _literal_alternatives((AUTO,) + tuple(knob.choices))
    if knob.kind == "dim":
        return '(INT | "any")'
    if knob.kind == "float":
        return "NUMBER"
    raise ValueError(f"unknown knob kind {knob.kind!r}")


def generate_grammar() -> str:
    lines = [HEADER, "start: kernel+", 'kernel: "kernel" NAME "{" statement* "}"',
             "statement: " + " | ".join(f"{s}_stmt" for s in SECTIONS), ""]
    for section in SECTIONS:
        knobs = knobs_in(section)
        if len(knobs) == 1 and not knobs[0].name:
            lines.append(f'{section}_stmt: "{section}" {_value_expr(knobs[0])}')
            continue
        lines.append(f'{section}_stmt: "{section}" {section}_item+')
        lines.append(f"{section}_item: " + " | ".join(k.field for k in knobs))
        for k in knobs:
            lines.append(f'{k.field}: "{k.name}" "=" {_value_expr(k)}')
        lines.append("")
    lines += [
        "NAME: /[A-Za-z_][A-Za-z0-9_]*/",
        "INT: /[0-9]+/",
        "NUMBER: /[+-]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][+-]?[0-9]+)?/",
        "COMMENT: /#[^\\n]*/",
        "",
        "%import common.WS",
        "%ignore WS",
        "%ignore COMMENT",
        "",
    ]
    return "\n".join(lines)


def grammar_path() -> Path:
    """Path of the shipped grammar file (package data `l2c._grammar/l2.lark`)."""
    return Path(str(resources.files("l2c._grammar") / "l2.lark"))


def grammar_text() -> str:
    return grammar_path().read_text()


# keep_all_tokens: enum values are anonymous literals and must survive into the tree.
PARSER_OPTIONS = {"parser": "lalr", "keep_all_tokens": True, "propagate_positions": True}


@functools.lru_cache(maxsize=1)
def lark_parser() -> Lark:
    """The .l2 parser. Building its LALR tables costs 40-50 ms, on the import that warms the dispatcher and in every
    `l2c` command; a copy saved in the user cache (`l2c.cache.cache_dir`, where built kernels live too), named by a
    digest of the grammar, the options and the Lark and Python versions, loads in under 10 ms. A missing, unreadable
    or truncated copy is rebuilt, and a cache that cannot be written is done without."""
    text = grammar_text()
    path = _saved_parser_path(text)
    if path is not None and path.is_file():
        try:
            with open(path, "rb") as f:
                return Lark.load(f)
        except Exception:  # noqa: BLE001 - any damage to the copy: build the parser again
            pass
    parser = Lark(text, **PARSER_OPTIONS)
    if path is not None:
        _save_parser(parser, path)
    return parser


def _saved_parser_path(text: str) -> Optional[Path]:
    import sys

    import lark

    from .cache import cache_dir, content_hash
    try:
        folder = cache_dir("front_end")
    except OSError:
        return None
    key = content_hash(text, repr(sorted(PARSER_OPTIONS.items())), lark.__version__, sys.version)
    return folder / f"l2_parser_{key[:16]}.pickle"


def _save_parser(parser: Lark, path: Path) -> None:
    """Written beside its final name, then renamed: another process never reads half a file."""
    import os
    import tempfile
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            parser.save(f)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


def main() -> None:
    out = Path(__file__).resolve().parent.parent / "grammar" / "l2.lark"
    out.write_text(generate_grammar())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
