"""Checking a finished text with the real parser and validator: on the client for a server's outputs, and at
the closing brace in the local back end, where the culprit's offset tells decoding where to backtrack."""
from __future__ import annotations

from typing import Optional, Tuple

from ...errors import L2SyntaxError, L2ValidationError
from ...ir import KernelSpec
from ...parser import parse_one
from ...validate import validate


def _offset(text: str, line: Optional[int], col: Optional[int]) -> Optional[int]:
    if not line:
        return None
    lines = text.split("\n")
    if line > len(lines):
        return None
    return sum(len(x) + 1 for x in lines[: line - 1]) + max((col or 1) - 1, 0)


def check_text(text: str, target: str, arch: str) -> Tuple[Optional[KernelSpec], Optional[str], Optional[int]]:
    """(spec, None, None) when `text` is one kernel that validates; else (None, reason, culprit offset)."""
    try:
        spec = parse_one(text, file="<llm>")
    except L2SyntaxError as err:
        return None, f"parse: {err.render()}", _offset(text, err.line, err.col)
    try:
        validate(spec, target, arch)
    except L2ValidationError as err:
        return None, f"validate: {err.render()}", _offset(text, err.line, err.col)
    return spec, None, None
