"""Text -> KernelSpec: parse with grammar/l2.lark, then build the typed IR with range checks.

Every failure is an `L2SyntaxError` carrying file:line:col and what was expected; no Lark exception
escapes this module.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Dict, List, Tuple, Union

from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternStr

from .errors import L2SyntaxError
from .grammar import lark_parser
from .ir import KernelSpec, Origin
from .knobs import ANY, AUTO, KNOBS, KNOBS_BY_FIELD, Knob, knobs_in

_SINGLE_VALUE_SECTIONS = {k.section: k for k in KNOBS if not k.name}


def _describe_terminal(name: str) -> str:
    try:
        term = lark_parser().get_terminal(name)
    except KeyError:
        return name
    if isinstance(term.pattern, PatternStr):
        return f'"{term.pattern.value}"'
    return {"NAME": "a name", "INT": "a whole number", "NUMBER": "a number"}.get(name, name)


def _expected(names) -> str:
    described = sorted({_describe_terminal(n) for n in names if not n.startswith("$")})
    if not described:
        return "end of input"
    if len(described) == 1:
        return described[0]
    return "one of " + ", ".join(described)


def _split_number(tok: Token, text: str) -> int:
    """Where a number the lexer split starts (0 if it did not): a knob whose values include 1 reads `m=100` as the
    value `1` and a stray `00`; the error belongs to the whole number, against the values expected there."""
    pos = getattr(tok, "start_pos", None)
    if not pos or not str(tok)[:1].isdigit() or not text[pos - 1].isdigit():
        return 0
    while pos > 0 and text[pos - 1].isdigit():
        pos -= 1
    if pos > 0 and (text[pos - 1].isalnum() or text[pos - 1] in "_."):
        return 0  # the digits end a name or a number such as `f16` or `1.5`, not a number of their own
    return pos


def _accepted_after(prefix: str):
    """The terminals the grammar accepts after `prefix` (None where the prefix itself does not parse)."""
    try:
        interactive = lark_parser().parse_interactive(prefix)
        interactive.exhaust_lexer()
        return interactive.accepts()
    except LarkError:
        return None


def _end_position(text: str) -> Tuple[int, int]:
    """Line and column just after the last thing written (trailing whitespace, which the grammar ignores, left
    out), counting lines as Lark does: by "\\n" alone, not by every break str.splitlines() knows (form feed,
    U+2028, ...), so the position is one an editor finds in the file."""
    body = text.rstrip(" \t\f\r\n")
    return body.count("\n") + 1, len(body) - body.rfind("\n")


def _syntax_error(err: UnexpectedInput, text: str, file: str) -> L2SyntaxError:
    line, col = getattr(err, "line", None), getattr(err, "column", None)
    if isinstance(err, UnexpectedCharacters):
        bad = text[err.pos_in_stream] if err.pos_in_stream < len(text) else "end of input"
        msg = f"unexpected character {bad!r}; expected {_expected(err.allowed or ())}"
    elif isinstance(err, UnexpectedEOF):
        line, col = _end_position(text)
        msg = f"unexpected end of file; expected {_expected(err.expected)}"
    elif isinstance(err, UnexpectedToken) and _split_number(err.token, text) \
            and _accepted_after(text[:_split_number(err.token, text)]) is not None:
        start = _split_number(err.token, text)
        end = start
        while end < len(text) and text[end].isdigit():
            end += 1
        line, col = text.count("\n", 0, start) + 1, start - text.rfind("\n", 0, start)
        msg = f"unexpected {text[start:end]!r}; expected {_expected(_accepted_after(text[:start]))}"
    elif isinstance(err, UnexpectedToken):
        tok = err.token
        shown = "end of file" if tok.type == "$END" else repr(str(tok))
        if tok.type == "$END":
            line, col = _end_position(text)
        msg = f"unexpected {shown}; expected {_expected(err.expected)}"
    else:
        msg = str(err).splitlines()[0]
    if line is None or line < 1:
        line, col = 1, 1
    return L2SyntaxError(msg, file=file, line=line, col=col)


def _value(knob: Knob, tok: Token, file: str) -> object:
    raw = str(tok)
    where = dict(file=file, line=tok.line, col=tok.column, knob=knob.key)
    if knob.kind == "enum":
        return raw
    if knob.kind == "float":
        try:
            value = float(raw)
        except ValueError:  # pragma: no cover - the grammar only admits numbers
            raise L2SyntaxError(f"{raw!r} is not a number", **where)
        if value != value or value in (float("inf"), float("-inf")):
            raise L2SyntaxError(f"{raw!r} is not a finite number", rule="finite", **where)
        if value == 0.0 and any(c in "123456789" for c in raw.lower().split("e")[0]):
            raise L2SyntaxError(f"{raw!r} is too small to be told from 0", rule="finite", **where)
        return value
    if knob.kind in ("dim", "auto_int") and raw in (ANY, AUTO):
        return raw
    digits = raw.lstrip("0") or "0"
    if knob.hi is not None and len(digits) > len(str(knob.hi)):
        # too long to be in range; never handed to int(), which refuses strings of over 4300 digits
        shown = digits if len(digits) <= 24 else f"{digits[:12]}...({len(digits)} digits)"
        raise L2SyntaxError(f"{shown} is above the maximum {knob.hi}{_why_max(knob)}", rule="range", **where)
    value = int(digits)
    if knob.choices and value not in knob.choices:
        raise L2SyntaxError(f"{value} is not allowed; expected one of {', '.join(map(str, knob.choices))}",
                            rule="range", **where)
    if knob.lo is not None and value < knob.lo:
        raise L2SyntaxError(f"{value} is below the minimum {knob.lo}", rule="range", **where)
    if knob.hi is not None and value > knob.hi:
        raise L2SyntaxError(f"{value} is above the maximum {knob.hi}{_why_max(knob)}", rule="range", **where)
    return value


def _why_max(knob: Knob) -> str:
    return " (kernels take problem sizes as 32-bit integers)" if knob.kind == "dim" else ""


def _value_token(tree: Tree) -> Token:
    """The last token of a knob subtree is its value (`m = 128` -> `128`)."""
    tokens = list(tree.scan_values(lambda v: isinstance(v, Token)))
    return tokens[-1]


def _build_kernel(tree: Tree, file: str) -> KernelSpec:
    name_tok = next(t for t in tree.children if isinstance(t, Token) and t.type == "NAME")
    values: Dict[str, object] = {}
    positions: List[Tuple[str, int, int]] = []
    for stmt in tree.find_data("statement"):
        section_tree = stmt.children[0]
        section = section_tree.data[: -len("_stmt")]
        if section in _SINGLE_VALUE_SECTIONS:
            knob_trees = [(_SINGLE_VALUE_SECTIONS[section], section_tree)]
        else:
            knob_trees = [(KNOBS_BY_FIELD[item.children[0].data], item.children[0])
                          for item in section_tree.children if isinstance(item, Tree)]
        for knob, sub in knob_trees:
            tok = _value_token(sub)
            if knob.field in values:
                line, col = next((ln, c) for f, ln, c in positions if f == knob.field)
                raise L2SyntaxError(f"{knob.key} is set twice (first at line {line}, col {col})",
                                    file=file, line=tok.line, col=tok.column, knob=knob.key, rule="unique")
            values[knob.field] = _value(knob, tok, file)
            positions.append((knob.field, tok.line, tok.column))
    origin = Origin(file=file, line=name_tok.line, col=name_tok.column, positions=tuple(positions))
    return KernelSpec(name=str(name_tok), origin=origin, **values)


def parse(text: str, file: str = "<spec>") -> List[KernelSpec]:
    """Parse `.l2` text into kernel specs (not yet validated for any target)."""
    try:
        tree = lark_parser().parse(text)
    except UnexpectedInput as err:
        raise _syntax_error(err, text, file) from None
    except LarkError as err:  # pragma: no cover - defensive: any other parser failure is still ours
        raise L2SyntaxError(str(err).splitlines()[0], file=file, line=1, col=1) from None
    specs = [_build_kernel(k, file) for k in tree.find_data("kernel")]
    seen: Dict[str, KernelSpec] = {}
    for spec in specs:
        if spec.name in seen:
            raise L2SyntaxError(f"kernel name {spec.name!r} is used twice in one file", file=file,
                                line=spec.origin.line, col=spec.origin.col, rule="unique")
        seen[spec.name] = spec
    return specs


def parse_one(text: str, file: str = "<spec>") -> KernelSpec:
    specs = parse(text, file)
    if len(specs) != 1:
        raise L2SyntaxError(f"expected exactly one kernel, found {len(specs)}", file=file, line=1, col=1)
    return specs[0]


MAX_SPEC_BYTES = 1 << 20   # 1 MiB: hundreds of kernels; the parser takes seconds per MiB, so larger is a mistake


def parse_file(path: Union[str, Path]) -> List[KernelSpec]:
    """Parse a `.l2` file: a regular file of at most MAX_SPEC_BYTES, in UTF-8 (a UTF-8 byte-order mark is
    allowed). A FIFO or a device is refused before it is opened, since reading one can block or never end."""
    path = Path(path)
    return parse(read_spec_text(path), file=str(path))


def read_spec_text(path: Path) -> str:
    where = dict(file=str(path))
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a FIFO, socket or device)"
            raise L2SyntaxError(f"cannot read file: it is {kind}", **where)
        if info.st_size > MAX_SPEC_BYTES:
            raise L2SyntaxError(f"file of {info.st_size} bytes is over the {MAX_SPEC_BYTES}-byte limit of a spec file",
                                rule="file-size", **where)
        with open(path, "rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)   # the file may have grown since stat
    except OSError as err:
        raise L2SyntaxError(f"cannot read file: {err.strerror or err}", **where) from None
    if len(data) > MAX_SPEC_BYTES:
        raise L2SyntaxError(f"file is over the {MAX_SPEC_BYTES}-byte limit of a spec file", rule="file-size", **where)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise _decode_error(data, err, str(path)) from None


def _decode_error(data: bytes, err: UnicodeDecodeError, file: str) -> L2SyntaxError:
    """The position of the first byte that is not UTF-8, as line:col (col counts characters, as Lark does)."""
    start = err.start
    line_start = data.rfind(b"\n", 0, start) + 1
    line = data.count(b"\n", 0, start) + 1
    col = len(data[line_start:start].decode("utf-8", "replace")) + 1
    hint = ""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in data[:200]:
        hint = " (it looks like UTF-16: save the file as UTF-8)"
    return L2SyntaxError(f"byte 0x{data[start]:02x} is not UTF-8; spec files are UTF-8 text{hint}",
                         file=file, line=line, col=col, rule="utf-8")
