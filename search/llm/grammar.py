"""The proposal grammar: grammar/l2.lark's own text transformed into one problem's decoding grammar, and the
values of each knob that can validate for that problem (the package docstring says how and why)."""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ...errors import L2ValidationError
from ...grammar import grammar_text
from ...ir import KernelSpec
from ...knobs import AUTO, KNOBS, KNOBS_BY_FIELD, TARGETS, Knob
from ...validate import validate
from ..space import NEW_KERNEL_STORE, PARAMS_BY_NAME, Problem

# Knobs the proposer pins to the problem (the searcher does not choose them).
PINNED_SECTIONS = ("target", "problem", "types", "layout")


class InfeasibleProblem(ValueError):
    """No spec for this problem validates on the target (e.g. unaligned extents for CUTLASS TMA)."""


_RULE = re.compile(r"^([a-z_][a-z0-9_]*)\s*:\s*(.+)$")


def _rules(text: str) -> Dict[str, str]:
    rules = {}
    for line in text.splitlines():
        m = _RULE.match(line.strip())
        if m and not line.lstrip().startswith("//"):
            rules[m.group(1)] = m.group(2).strip()
    return rules


@dataclass(frozen=True)
class _KnobRule:
    knob: Knob
    key: str                  # the key literal the file spells ("m"); "" for one-value statements
    literals: Tuple[str, ...]  # the quoted values the file allows
    has_int: bool             # the file allows INT here


@functools.lru_cache(maxsize=4)
def file_structure(text: str) -> List[Tuple[str, str, List[_KnobRule]]]:
    """[(section, keyword, knob rules)] in the file's statement order, read from the grammar text."""
    rules = _rules(text)
    if "statement" not in rules:
        raise ValueError("grammar has no `statement` rule; is grammar/l2.lark current?")
    out = []
    for stmt in (s.strip() for s in rules["statement"].split("|")):
        section = stmt[: -len("_stmt")]
        body = rules[stmt]
        keyword = re.match(r'^"([^"]+)"', body).group(1)
        item = re.match(r'^"[^"]+"\s+(\w+)_item\+$', body)
        if item:
            fields = [f.strip() for f in rules[f"{section}_item"].split("|")]
            knob_rules = []
            for f in fields:
                m = re.match(r'^"([^"]+)"\s+"="\s+(.+)$', rules[f])
                knob_rules.append(_KnobRule(KNOBS_BY_FIELD[f], m.group(1), tuple(re.findall(r'"([^"]*)"', m.group(2))),
                                            bool(re.search(r"\bINT\b", m.group(2)))))
        else:
            expr = body[len(keyword) + 2:]
            knob_rules = [_KnobRule(KNOBS_BY_FIELD[section], "", tuple(re.findall(r'"([^"]*)"', expr)),
                                    bool(re.search(r"\bINT\b", expr)))]
        out.append((section, keyword, knob_rules))
    return out


def pinned_values(problem: Problem, target: str) -> Dict[str, object]:
    """The knobs the problem fixes; a gated problem's gate too, and for CUTLASS the store its gated GEMM needs (the
    tuner's store for new kernels, rule gated-gemm)."""
    pins = dict(target=target, problem_m=problem.m, problem_n=problem.n, problem_k=problem.k,
                problem_batch=problem.batch, types_a=problem.dtype, types_b=problem.dtype, types_c=problem.dtype,
                types_acc="f32", layout_a=problem.layout_a, layout_b=problem.layout_b, layout_c=problem.layout_c)
    if problem.gated:
        pins["epilogue_gate"] = problem.gate
        if target == "cutlass":
            pins["epilogue_store"] = NEW_KERNEL_STORE
    return pins


def outside_grammar(spec: KernelSpec, pins: Dict[str, object], legal: Dict[str, Tuple[object, ...]]) -> Optional[str]:
    """Why `spec` is not a sentence of the proposal grammar made from `pins` and `legal` (`proposal_grammar`), or
    None: a pinned knob at another value (another problem, dtype or layout), a searched one at a value the grammar
    does not offer, or one the grammar leaves out not at its default (an epilogue the problem did not ask for). A
    server is sent the grammar but need not obey it; what it returns is checked against the same terms."""
    default = KernelSpec(name=spec.name)
    for knob in KNOBS:
        value = getattr(spec, knob.field)
        if knob.field in pins:
            wanted: Tuple[object, ...] = (pins[knob.field],)
        elif knob.field in legal:
            wanted = legal[knob.field]
        else:
            wanted = (getattr(default, knob.field),)
        if value not in wanted:
            expected = "one of " + ", ".join(map(str, wanted)) if len(wanted) > 1 else str(wanted[0])
            return f"{knob.key}={value}, the grammar allows {expected}"
    return None


def _value_of(knob: Knob, spelled: str) -> object:
    if knob.kind in ("int", "auto_int", "dim") and spelled not in (AUTO, "any"):
        return int(spelled)
    return spelled


def _ok(spec: KernelSpec, target: str, arch: str) -> bool:
    try:
        validate(spec, target, arch)
        return True
    except L2ValidationError:
        return False


def _searched_domain(kr: _KnobRule) -> List[object]:
    """Values the file allows that are also points of the search space."""
    knob = kr.knob
    space = PARAMS_BY_NAME.get(knob.field)
    if kr.has_int:   # the file says INT: the search space (or the knob's range) gives the values
        values = list(space.choices) if space else list(range(knob.lo or 1, (knob.hi or knob.lo or 1) + 1))
        values = [v for v in values if (knob.lo is None or v >= knob.lo) and (knob.hi is None or v <= knob.hi)]
    else:
        values = [_value_of(knob, s) for s in kr.literals]
    if space:
        values = [v for v in values if v in space.choices]
    return values


@functools.lru_cache(maxsize=256)
def legal_values(problem: Problem, target: str) -> Dict[str, Tuple[object, ...]]:
    """For each searchable knob the target reads: the values with a validating witness for `problem`.

    A value is kept when the problem's default spec with that value validates, or does so with one other
    knob changed. This never keeps an impossible value; it may drop one whose every witness changes
    three or more knobs (none do in today's rules).
    """
    structure = file_structure(grammar_text())
    base = KernelSpec(name="probe", **pinned_values(problem, target))
    try:
        validate(base, target, problem.arch)
    except L2ValidationError as err:
        raise InfeasibleProblem(f"no spec for {problem.key()} can validate on {target}: {err.message}") from None
    domains = {kr.knob.field: _searched_domain(kr) for _, _, krs in structure for kr in krs
               if target in kr.knob.searched_for}
    legal: Dict[str, List[object]] = {}
    for f, values in domains.items():
        keep = []
        for v in values:
            one = base.replace(**{f: v})
            if _ok(one, target, problem.arch) or any(
                    _ok(one.replace(**{g: w}), target, problem.arch)
                    for g, ws in domains.items() if g != f for w in ws):
                keep.append(v)
        legal[f] = tuple(keep)
    return legal


def _lit(s: str) -> str:
    return json.dumps(s)   # a Lark/llguidance string literal ("\n" escaped)


def _ordered_nonempty(items: List[str]) -> str:
    """At least one of `items`, each at most once, in order: (a b? c? | b c? | c)."""
    alts = [" ".join([items[i]] + [f"{x}?" for x in items[i + 1:]]) for i in range(len(items))]
    return "(" + " | ".join(alts) + ")"


def proposal_grammar(problem: Problem, target: str, name: str = "proposal") -> str:
    """The decoding grammar for one proposal: grammar/l2.lark's text transformed (see module docstring)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name == "kernel":
        raise ValueError(f"bad kernel name {name!r}")
    pins = pinned_values(problem, target)
    legal = legal_values(problem, target)
    rules: List[str] = []
    stmts: List[str] = []
    for section, keyword, krs in file_structure(grammar_text()):
        kept = []
        for kr in krs:
            knob = kr.knob
            if knob.field in pins:
                value = str(pins[knob.field])
                if value not in kr.literals and not (kr.has_int and value.isdigit()):
                    raise InfeasibleProblem(f"{knob.key}={value} is not in the language of l2.lark")
                values = [value]
            elif knob.field in legal:
                values = [str(v) for v in legal[knob.field]]
            else:
                continue     # a knob the target does not read, or one the searcher leaves at its default
            alts = "(" + " | ".join(_lit(v) for v in values) + ")"
            key = _lit(" " + kr.key + "=") if kr.key else _lit(" ")
            rules.append(f"{knob.field}: {key} {alts}")
            kept.append(knob.field)
        if not kept:
            continue
        if section in PINNED_SECTIONS:
            body = " ".join(kept)
            stmts.append(f"{section}_stmt")
        elif any(f in pins for f in kept):   # a pinned knob here (a gated problem's gate): the statement and it, always
            body = " ".join(f if f in pins else f"{f}?" for f in kept)
            stmts.append(f"{section}_stmt")
        else:
            body = _ordered_nonempty(kept)
            stmts.append(f"{section}_stmt?")
        rules.append(f"{section}_stmt: {_lit('  ' + keyword)} {body} {_lit(chr(10))}")
    head = [
        f"// Derived from grammar/l2.lark by l2c.search.llm.proposal_grammar for {problem.key()} on {target}:",
        "// one kernel, pinned problem, statements and knobs in the file's order and at most once each.",
        "start: kernel",
        f"kernel: {_lit('kernel ' + name + ' {' + chr(10))} {' '.join(stmts)} {_lit('}')}",
    ]
    return "\n".join(head + rules) + "\n"
