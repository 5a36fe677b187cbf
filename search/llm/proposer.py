"""The proposer: asks a back end for specs and keeps only parsed, validated ones not measured or proposed before;
what it drops is logged and counted. Also reads a measured history from a JSON-lines file."""
from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

from ...errors import L2SyntaxError
from ...ir import KernelSpec
from ...knobs import TARGETS
from ...parser import parse_one
from ..space import Problem
from .check import check_text
from .grammar import legal_values, outside_grammar, pinned_values, proposal_grammar
from .prompt import Hardware, HistoryItem, build_messages

log = logging.getLogger("l2c.search.llm")


@dataclass(frozen=True)
class Proposal:
    spec: KernelSpec      # parsed and validated for the target
    text: str             # what the model wrote (with the proposal's name)
    source: str           # "llm:<model>"
    target: str


@dataclass(frozen=True)
class Dropped:
    reason: str
    text: Optional[str] = None


def _key(spec: KernelSpec) -> Tuple:
    return tuple(sorted((k, str(v)) for k, v in spec.knob_values().items()))


class LLMProposer:
    """Asks a back end for specs; returns only parsed, validated, new ones. Drops are logged and counted."""

    def __init__(self, backend, target: str = "cutlass", hardware: Optional[Hardware] = None,
                 temperature: float = 0.8, seed: int = 0, n_best: int = 4, n_worst: int = 2,
                 max_rounds: int = 3, max_new_tokens: int = 256, max_backtracks: int = 64):
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}")
        self.backend, self.target = backend, target
        self.hardware = hardware or Hardware()
        self.temperature, self.seed = temperature, seed
        self.n_best, self.n_worst, self.max_rounds = n_best, n_worst, max_rounds
        self.max_new_tokens, self.max_backtracks = max_new_tokens, max_backtracks
        self.source = f"llm:{backend.name}"
        self.dropped: List[Dropped] = []
        self.counts: Counter = Counter()
        self._calls = 0

    def _drop(self, reason: str, text: Optional[str]) -> None:
        self.dropped.append(Dropped(reason, text))
        self.counts[reason.split(":", 1)[0]] += 1
        log.warning("LLM proposal dropped: %s", reason)

    def propose(self, problem: Problem, history: Iterable[HistoryItem], n: int,
                target: Optional[str] = None) -> List[Proposal]:
        target = target or getattr(problem, "target", None) or self.target
        history = list(history)
        call = self._calls
        self._calls += 1
        name = f"llm{call}"
        grammar = proposal_grammar(problem, target, name=name)
        pins, legal = pinned_values(problem, target), legal_values(problem, target)
        messages = build_messages(problem, target, history, self.hardware, self.n_best, self.n_worst)
        seen = {_key(s.replace(name=name)) for s, _, _ in history}
        measured = set(seen)

        def check(text: str):
            _, reason, off = check_text(text, target, problem.arch)
            return reason, off

        out: List[Proposal] = []
        for rnd in range(self.max_rounds):
            if len(out) >= n:
                break
            samples = self.backend.sample(messages, grammar, n - len(out), self.temperature,
                                          self.seed + 1000 * call + 100 * rnd, check=check,
                                          max_new_tokens=self.max_new_tokens, max_backtracks=self.max_backtracks)
            for s in samples:
                if s.text is None:
                    self._drop(s.reason, None)
                    continue
                spec, reason, _ = check_text(s.text, target, problem.arch)
                if spec is not None:   # a server is sent the grammar but need not keep to it
                    outside = outside_grammar(spec, pins, legal)
                    reason = f"grammar: {outside}" if outside else None
                if reason is not None:
                    self._drop(reason, s.text)
                    continue
                key = _key(spec)
                if key in seen:
                    self._drop("duplicate: already measured" if key in measured else
                               "duplicate: proposed earlier in this batch", s.text)
                    continue
                seen.add(key)
                new_name = f"{name}_{len(out)}"
                text = s.text.replace(f"kernel {name} ", f"kernel {new_name} ", 1)
                out.append(Proposal(spec.replace(name=new_name), text, self.source, target))
                if len(out) >= n:
                    break
            if samples and all(s.reason.startswith("server:") for s in samples if s.text is None) \
                    and not any(s.text for s in samples):
                break    # the server is down: another round would only wait again
        return out


def history_from_jsonl(path: str, problem: Problem, target: Optional[str] = None) -> List[HistoryItem]:
    """Measured results, one JSON object a line (the store's Result fields: spec, tflops, baseline_tflops,
    optionally problem and target); lines for other problems or targets are skipped."""
    items: List[HistoryItem] = []
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if row.get("problem") not in (None, problem.key()) or row.get("target") not in (None, target):
                continue
            spec = parse_one(row["spec"], file=f"{path}:{i}")
            for field in ("tflops", "baseline_tflops"):   # the prompt ranks by them and divides one by the other
                value = row.get(field)
                if value is not None and not (type(value) in (int, float) and 0 <= value < math.inf):
                    raise ValueError(f"'{field}' must be a finite number 0 or more, got {value!r}"[:200])
        except (ValueError, KeyError, TypeError, AttributeError, L2SyntaxError) as err:
            raise ValueError(f"{path}:{i}: not a result line: {err}") from None
        items.append((spec, row.get("tflops"), row.get("baseline_tflops")))
    return items
