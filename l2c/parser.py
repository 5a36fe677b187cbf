"""Text -> KernelSpec: parse with grammar/l2.lark, then build the typed IR with range checks.

Every failure is an `L2SyntaxError` carrying file:line:col and what was expected; no Lark exception
escapes this module.
"""
from __future__ import annotations

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
    return pos


def _accepted_after(prefix: str):
    """The terminals the grammar accepts after `prefix`."""
    interactive = lark_parser().parse_interactive(prefix)
    interactive.exhaust_lexer()
    return interactive.accepts()


def _syntax_error(err: UnexpectedInput, text: str, file: str) -> L2SyntaxError:
    line, col = getattr(err, "line", None), getattr(err, "column", None)
    if isinstance(err, UnexpectedCharacters):
        bad = text[err.pos_in_stream] if err.pos_in_stream < len(text) else "end of input"
        msg = f"unexpected character {bad!r}; expected {_expected(err.allowed or ())}"
    elif isinstance(err, UnexpectedEOF):
        lines = text.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
        msg = f"unexpected end of file; expected {_expected(err.expected)}"
    elif isinstance(err, UnexpectedToken) and _split_number(err.token, text):
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
            lines = text.splitlines() or [""]
            line, col = len(lines), len(lines[-1]) + 1
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
        return value
    if knob.kind in ("dim", "auto_int") and raw in (ANY, AUTO):
        return raw
    value = int(raw)
    if knob.choices and value not in knob.choices:
        raise L2SyntaxError(f"{value} is not allowed; expected one of {', '.join(map(str, knob.choices))}",
                            rule="range", **where)
    if knob.lo is not None and value < knob.lo:
        raise L2SyntaxError(f"{value} is below the minimum {knob.lo}", rule="range", **where)
    if knob.hi is not None and value > knob.hi:
        raise L2SyntaxError(f"{value} is above the maximum {knob.hi}", rule="range", **where)
    return value


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


def parse_file(path: Union[str, Path]) -> List[KernelSpec]:
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise L2SyntaxError(f"cannot read file: {err}", file=str(path)) from None
    return parse(text, file=str(path))
