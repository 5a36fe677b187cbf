"""Grammar-constrained LLM proposals of kernel specs.

A language model sees the problem, the hardware facts and the best and worst measured specs (contrastive
context) and writes new specs in the DSL. Every token it emits is constrained by `grammar/l2.lark`: the
grammar used for decoding is *derived from that file's text* (never a second hand-written grammar) by
`proposal_grammar`, which

- makes the start one kernel (the file allows several), with a fixed name;
- pins the knobs the searcher does not choose (target, problem, types, layout) to the problem's values;
- lists the statements in the file's order, each at most once, with each knob at most once (the parser
  rejects a knob set twice; the file's grammar cannot say so, an ordered sequence can);
- keeps only the knobs the target reads, and of each knob only the values that (a) the file spells,
  (b) the search space (`l2c.search.space`) holds, so that a proposal is always an enqueueable trial, and
  (c) have a witness: a spec for this problem with that value that validates (the default spec with the
  value, or with the value and one other knob changed);
- spells whitespace canonically (no `%ignore`), so decoding cannot wander in blank space and the pinned
  part is forced tokens.

Its language is a subset of the file's: every constrained output parses with `l2c.parser`.

Cross-knob rules (shared memory, registers, cluster size, schedules) are not context-free over statements
in any order, so no grammar can express them. The local back end therefore enforces them *at the end of
the kernel*: when the closing brace is sampled, the text is parsed and validated with the real validator;
a rejection names the offending knob (file:line:col), and decoding backtracks to the token that wrote
that knob's value, bans it at that position and resamples (the grammar matcher rolls back with it). This
is a depth-first search over the grammar's token tree, ordered by the model's distribution, so every
sample that finishes parses and validates for the target; a sample that runs out of its backtrack budget
is dropped and counted. Servers (vLLM) get the derived grammar only; their outputs are parsed and
validated on the client and rejects are dropped with the reason.
"""
from __future__ import annotations

import copy
import functools
import inspect
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..errors import L2SyntaxError, L2ValidationError
from ..grammar import grammar_text
from ..ir import KernelSpec
from ..knobs import AUTO, KNOBS, KNOBS_BY_FIELD, TARGETS, Knob
from ..parser import parse_one
from ..validate import ARCHS, validate
from .space import PARAMS_BY_NAME, Problem

log = logging.getLogger(__name__)

# Knobs the proposer pins to the problem (the searcher does not choose them).
PINNED_SECTIONS = ("target", "problem", "types", "layout")


@dataclass(frozen=True)
class Hardware:
    """Facts the model is told about the GPU (H200 SXM by default)."""
    name: str = "NVIDIA H200 SXM (sm_90)"
    sm_count: int = ARCHS["sm_90"].sm_count
    smem_per_block_kb: int = ARCHS["sm_90"].smem_per_block // 1024
    l2_mb: int = 60
    peak_fp16_tflops: float = 989.0
    cublas_4096_tflops: float = 700.0

    def describe(self) -> str:
        return (f"GPU: {self.name}. {self.sm_count} SMs; {self.smem_per_block_kb} KB shared memory per block; "
                f"{self.l2_mb} MB L2; peak dense fp16/bf16 tensor-core throughput ~{self.peak_fp16_tflops:g} "
                f"TFLOP/s; cuBLAS reaches ~{self.cublas_4096_tflops:g} TFLOP/s at 4096x4096x4096 fp16.")


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


@dataclass
class Sample:
    """One raw generation: `text` when the back end finished one, else `reason`."""
    text: Optional[str]
    reason: str = ""
    backtracks: int = 0


class InfeasibleProblem(ValueError):
    """No spec for this problem validates on the target (e.g. unaligned extents for CUTLASS TMA)."""


HistoryItem = Tuple[KernelSpec, Optional[float], Optional[float]]


# ---------------------------------------------------------------------------------------------------
# The proposal grammar, derived from grammar/l2.lark
# ---------------------------------------------------------------------------------------------------

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
def _file_structure(text: str) -> List[Tuple[str, str, List[_KnobRule]]]:
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


def _pins(problem: Problem, target: str) -> Dict[str, object]:
    return dict(target=target, problem_m=problem.m, problem_n=problem.n, problem_k=problem.k,
                problem_batch=problem.batch, types_a=problem.dtype, types_b=problem.dtype, types_c=problem.dtype,
                types_acc="f32", layout_a=problem.layout_a, layout_b=problem.layout_b, layout_c=problem.layout_c)


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
    structure = _file_structure(grammar_text())
    base = KernelSpec(name="probe", **_pins(problem, target))
    try:
        validate(base, target, problem.arch)
    except L2ValidationError as err:
        raise InfeasibleProblem(f"no spec for {problem.key()} can validate on {target}: {err.message}") from None
    domains = {kr.knob.field: _searched_domain(kr) for _, _, krs in structure for kr in krs
               if kr.knob.searchable and target in kr.knob.targets}
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
    pins = _pins(problem, target)
    legal = legal_values(problem, target)
    rules: List[str] = []
    stmts: List[str] = []
    for section, keyword, krs in _file_structure(grammar_text()):
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


def render_for_prompt(spec: KernelSpec, problem: Problem, target: str) -> str:
    """A spec in the proposal grammar's layout (pinned statements plus the target's searched knobs)."""
    pins = _pins(problem, target)
    lines = [f"kernel {spec.name} {{"]
    for section, keyword, krs in _file_structure(grammar_text()):
        parts = []
        for kr in krs:
            k = kr.knob
            if k.field in pins or (k.searchable and target in k.targets):
                v = pins.get(k.field, getattr(spec, k.field))
                parts.append(f" {kr.key}={v}" if kr.key else f" {v}")
        if parts:
            lines.append(f"  {keyword}{''.join(parts)}")
    return "\n".join(lines) + "\n}"


# ---------------------------------------------------------------------------------------------------
# The prompt
# ---------------------------------------------------------------------------------------------------

def _knob_reference(problem: Problem, target: str) -> str:
    legal = legal_values(problem, target)
    lines = []
    for k in KNOBS:
        if k.field in legal:
            values = ", ".join(map(str, legal[k.field]))
            lines.append(f"- {k.key} (default {k.default}; one of {values}): {k.doc}")
    return "\n".join(lines)


def _speed(t: Optional[float], base: Optional[float]) -> str:
    if t is None:
        return "FAILED (did not build, verify or run)"
    s = f"{t:.1f} TFLOP/s"
    return s + (f" ({t / base:.2f}x cuBLAS at {base:.1f})" if base else "")


def build_messages(problem: Problem, target: str, history: Sequence[HistoryItem], hardware: Hardware,
                   n_best: int = 4, n_worst: int = 2) -> List[Dict[str, str]]:
    """Chat messages: the task, the DSL's knobs, the hardware, the problem and contrastive history."""
    system = (
        "You are an expert CUDA GEMM performance engineer. You write kernel specs in l2, a small DSL that "
        f"l2c lowers to {target} kernels. A spec is `kernel NAME {{ ... }}` with one statement per line; a "
        "knob left out takes its default. The searched knobs:\n" + _knob_reference(problem, target) + "\n"
        + hardware.describe())
    measured = [h for h in history if h[1] is not None]
    failed = [h for h in history if h[1] is None]
    measured.sort(key=lambda h: -h[1])
    best = measured[:n_best]
    worst = [h for h in measured[::-1][:n_worst] if h not in best]
    parts = [f"Problem: D[{problem.m}x{problem.n}] = A[{problem.m}x{problem.k}] @ B[{problem.k}x{problem.n}]"
             f"{f', batch {problem.batch}' if problem.batch != 1 else ''}, {problem.dtype} inputs and output, "
             f"fp32 accumulation, layouts A={problem.layout_a} B={problem.layout_b} C={problem.layout_c}, "
             f"target {target}. Useful work: {problem.flops() / 1e9:.1f} GFLOP."]
    for title, items in (("Best measured specs", best), ("Worst measured specs", worst),
                         ("Specs that failed", failed[:n_worst])):
        if items:
            parts.append(title + ":")
            parts += [f"{render_for_prompt(s, problem, target)}\n# {_speed(t, b)}" for s, t, b in items]
    if not history:
        parts.append("Nothing has been measured for this problem yet.")
    parts.append("Write one new spec, different from those above, that you expect to be faster than the best. "
                 "Reply with the spec only.")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def messages_as_text(messages: Sequence[Dict[str, str]]) -> str:
    """Plain prompt for models without a chat template."""
    return "\n\n".join(m["content"] for m in messages) + "\n\n"


# ---------------------------------------------------------------------------------------------------
# Checking a finished text (client side, and the local back end's end-of-kernel check)
# ---------------------------------------------------------------------------------------------------

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


Checker = Callable[[str], Tuple[Optional[str], Optional[int]]]


# ---------------------------------------------------------------------------------------------------
# Back end: a local Hugging Face model, decoding constrained by llguidance
# ---------------------------------------------------------------------------------------------------

class HFBackend:
    """A local model directory (transformers), each token masked by an llguidance matcher."""

    def __init__(self, model_dir: str, device: Optional[str] = None, dtype: Optional[str] = None):
        import torch
        import llguidance
        import llguidance.hf
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch, self.llguidance = torch, llguidance
        self.name = Path(model_dir).name or str(model_dir)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs).to(self.device).eval()
        eos = self.tokenizer.eos_token_id
        self.ll_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer, eos_token=eos if eos is not None else 0)
        self._token_bytes: Dict[int, bytes] = {}
        self._prompt_memo = None
        # transformers 5 renamed forward's `past_key_values` to `cache`
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def _bytes(self, tok: int) -> bytes:
        b = self._token_bytes.get(tok)
        if b is None:
            b = self._token_bytes[tok] = self.ll_tokenizer.decode_bytes([tok])
        return b

    def prompt_ids(self, messages: Sequence[Dict[str, str]]) -> List[int]:
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        else:
            text = messages_as_text(messages)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def sample(self, messages, grammar: str, n: int, temperature: float, seed: int,
               check: Optional[Checker] = None, max_new_tokens: int = 256, max_backtracks: int = 64) -> List[Sample]:
        err = self.llguidance.LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
        if err:
            raise ValueError(f"llguidance rejects the proposal grammar: {err}")
        prompt = self.prompt_ids(messages)
        return [self.sample_ids(prompt, grammar, temperature, seed + i, check, max_new_tokens, max_backtracks)
                for i in range(n)]

    def sample_ids(self, prompt: List[int], grammar: str, temperature: float, seed: int,
                   check: Optional[Checker] = None, max_new_tokens: int = 256, max_backtracks: int = 64) -> Sample:
        """One constrained sample; with `check`, a depth-first search that only finishes on accepted text."""
        import numpy as np
        from transformers import DynamicCache
        torch = self.torch
        context = getattr(self.model.config, "max_position_embeddings", None) or getattr(self.model.config,
                                                                                           "n_positions", None)
        if context and len(prompt) + max_new_tokens > context:   # positions past the model's table: no sample
            return Sample(None, f"prompt of {len(prompt)} tokens + {max_new_tokens} new exceeds the model's "
                                f"context of {context}")
        matcher = self.llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            return Sample(None, f"grammar: {matcher.get_error()}")
        gen = torch.Generator().manual_seed(seed)
        vocab = self.ll_tokenizer.vocab_size
        toks: List[int] = []
        forced: List[bool] = []
        starts: List[int] = []              # byte offset of each generated token in the text
        bans: Dict[int, set] = {}           # prefix length -> tokens banned there (current branch only)
        logits_at: Dict[int, "torch.Tensor"] = {}
        cache, cached = DynamicCache(), 0   # the cache holds (prompt + toks)[:cached]
        memo = self._prompt_memo            # the prompt's cache is computed once and copied per sample
        if memo is not None and memo[0] == tuple(prompt):
            cache, cached, logits_at[0] = copy.deepcopy(memo[1]), len(prompt), memo[2]
        backtracks, last_reason = 0, ""

        def text() -> str:
            return b"".join(self._bytes(t) for t in toks).decode("utf-8", errors="replace")

        def push(t: int, is_forced: bool) -> bool:
            if not matcher.consume_token(t):
                return False
            starts.append(starts[-1] + len(self._bytes(toks[-1])) if toks else 0)
            toks.append(t)
            forced.append(is_forced)
            return True

        def backtrack_to(i: int) -> None:
            """Drop toks[i:], ban toks[i] at prefix i, forget what was learned deeper in the old branch."""
            nonlocal cached
            banned = toks[i]
            matcher.rollback(len(toks) - i)
            del toks[i:], forced[i:], starts[i:]
            for d in (bans, logits_at):
                for key in [key for key in d if key > i]:
                    del d[key]
            bans.setdefault(i, set()).add(banned)
            if cached > len(prompt) + i:
                cache.crop(len(prompt) + i - cached)   # negative: drop that many (transformers 4.x and 5.x)
                cached = len(prompt) + i

        def last_free(before: int) -> Optional[int]:
            return next((j for j in range(min(before, len(toks)) - 1, -1, -1) if not forced[j]), None)

        with torch.no_grad():
            while True:
                if matcher.is_error():
                    return Sample(None, f"grammar: {matcher.get_error()}", backtracks)
                if matcher.is_accepting():       # the closing brace: check the whole kernel
                    reason, off = check(text()) if check else (None, None)
                    if reason is None:
                        return Sample(text(), "", backtracks)
                    last_reason = reason
                    j = None
                    if off is not None:
                        j = next((i for i in range(len(toks) - 1, -1, -1) if starts[i] <= off), None)
                    if j is None or forced[j]:
                        j = last_free(len(toks))
                    backtracks += 1
                    if j is None or backtracks > max_backtracks:
                        return Sample(None, f"unfinished: gave up after {backtracks - 1} backtracks; last {reason}", backtracks)
                    backtrack_to(j)
                    continue
                ff = matcher.compute_ff_tokens()
                if ff:
                    for t in ff:
                        if not push(t, True):
                            return Sample(None, f"grammar: {matcher.get_error()}", backtracks)
                    continue
                if len(toks) >= max_new_tokens:
                    return Sample(None, f"unfinished: no complete kernel within {max_new_tokens} tokens", backtracks)
                L = len(toks)
                if L not in logits_at:
                    seq = prompt + toks
                    ids = torch.tensor([seq[cached:]], device=self.device)
                    out = self.model(input_ids=ids, use_cache=True, **{self._cache_kw: cache})
                    cached = len(seq)            # the cache object grew in place
                    logits_at[L] = out.logits[0, -1].float().cpu()
                    if L == 0:
                        self._prompt_memo = (tuple(prompt), copy.deepcopy(cache), logits_at[0])
                logits = logits_at[L].clone()
                bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
                allowed = torch.zeros(logits.shape[0], dtype=torch.bool)
                m = min(vocab, logits.shape[0])
                allowed[:m] = torch.from_numpy(bits[:m].astype(bool))
                for t in bans.get(L, ()):
                    allowed[t] = False
                if not bool(allowed.any()):      # dead end: every continuation here was tried
                    j = last_free(L)
                    backtracks += 1
                    if j is None or backtracks > max_backtracks:
                        return Sample(None, f"unfinished: gave up after {backtracks - 1} backtracks; last "
                                            f"{last_reason or 'no allowed token'}", backtracks)
                    backtrack_to(j)
                    continue
                logits[~allowed] = float("-inf")
                if temperature <= 0:
                    t = int(torch.argmax(logits))
                else:
                    t = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
                if not push(t, False):
                    return Sample(None, f"grammar: {matcher.get_error()}", backtracks)


# ---------------------------------------------------------------------------------------------------
# Back end: an OpenAI-compatible server (vLLM), the grammar sent as structured output
# ---------------------------------------------------------------------------------------------------

def _endpoint(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    return url + ("/chat/completions" if url.endswith("/v1") else "/v1/chat/completions")


class ServerError(Exception):
    pass


class OpenAIBackend:
    """POST /v1/chat/completions with `structured_outputs.grammar` (and `guided_grammar` for older vLLM)."""

    def __init__(self, url: str, model: str, api_key: Optional[str] = None, timeout_s: float = 120.0,
                 retries: int = 3, backoff_s: float = 1.0, max_tokens: int = 512, guided_grammar: bool = True):
        self.url = _endpoint(url)
        self.model = model
        self.name = model
        self.api_key = api_key if api_key is not None else (
            os.environ.get("L2C_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY"))
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.max_tokens, self.guided_grammar = max_tokens, guided_grammar

    def _post(self, body: dict) -> bytes:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                delay = min(self.backoff_s * 2 ** (attempt - 1), 30.0)
                log.info("LLM server: retry %d/%d in %.1fs after %s", attempt, self.retries, delay, last)
                time.sleep(delay)
            req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return resp.read()
            except urllib.error.HTTPError as err:
                detail = err.read()[:300].decode("utf-8", errors="replace")
                last = f"HTTP {err.code}: {detail}"
                if err.code < 500 and err.code != 429:
                    raise ServerError(last) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
                reason = getattr(err, "reason", err)
                last = f"timed out after {self.timeout_s:g}s" if "timed out" in str(reason) else f"{reason}"
        raise ServerError(f"{last} (after {self.retries + 1} attempts)")

    def sample(self, messages, grammar: str, n: int, temperature: float, seed: int,
               check: Optional[Checker] = None, **_) -> List[Sample]:
        body = {"model": self.model, "messages": list(messages), "n": n, "temperature": temperature,
                "seed": seed, "max_tokens": self.max_tokens, "structured_outputs": {"grammar": grammar}}
        if self.guided_grammar:
            body["guided_grammar"] = grammar
        try:
            raw = self._post(body)
        except ServerError as err:
            return [Sample(None, f"server: {err}")]
        try:
            reply = json.loads(raw)
        except ValueError:
            return [Sample(None, f"reply: not JSON: {raw[:80]!r}")]
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or not choices:
            return [Sample(None, f"reply: no choices: {str(reply)[:120]}")]
        out = []
        for i, ch in enumerate(choices):
            content = None
            if isinstance(ch, dict):
                msg = ch.get("message")
                content = msg.get("content") if isinstance(msg, dict) else ch.get("text")
            if not isinstance(content, str):
                out.append(Sample(None, f"reply: choice {i} has no text"))
            else:
                out.append(Sample(content.strip()))
        return out


# ---------------------------------------------------------------------------------------------------
# The proposer
# ---------------------------------------------------------------------------------------------------

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
                if spec is None:
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


def backend_from_config(model_dir: Optional[str] = None, server: Optional[str] = None,
                        model: Optional[str] = None, **server_kwargs):
    """The configured back end (flags first, then L2C_LLM_MODEL_DIR / L2C_LLM_URL + L2C_LLM_MODEL), or None."""
    model_dir = model_dir or os.environ.get("L2C_LLM_MODEL_DIR")
    server = server or os.environ.get("L2C_LLM_URL")
    model = model or os.environ.get("L2C_LLM_MODEL")
    if model_dir and server:
        raise ValueError("both a model directory and a server are configured; choose one")
    if model_dir:
        return HFBackend(model_dir)
    if server:
        if not model:
            raise ValueError("a server needs a model name (--model or L2C_LLM_MODEL)")
        return OpenAIBackend(server, model, **server_kwargs)
    return None


NOT_CONFIGURED = (
    "no LLM is configured. Point l2c at a local Hugging Face model directory with --model-dir DIR "
    "(or L2C_LLM_MODEL_DIR=DIR; needs `pip install 'l2c[llm]'`), or at an OpenAI-compatible server such as "
    "vLLM with --server URL --model NAME (or L2C_LLM_URL and L2C_LLM_MODEL; API key from L2C_LLM_API_KEY or "
    "OPENAI_API_KEY).")


def history_from_jsonl(path: str, problem: Problem, target: Optional[str] = None) -> List[HistoryItem]:
    """Measured results, one JSON object a line (the store's Result fields: spec, tflops, baseline_tflops,
    optionally problem and target); lines for other problems or targets are skipped."""
    items: List[HistoryItem] = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if row.get("problem") not in (None, problem.key()) or row.get("target") not in (None, target):
                continue
            spec = parse_one(row["spec"], file=f"{path}:{i}")
        except (ValueError, KeyError, TypeError, AttributeError, L2SyntaxError) as err:
            raise ValueError(f"{path}:{i}: not a result line: {err}") from None
        items.append((spec, row.get("tflops"), row.get("baseline_tflops")))
    return items
