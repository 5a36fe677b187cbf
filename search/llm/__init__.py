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

Modules: grammar (the derived grammar, legal values), prompt (what the model reads), check (parse and validate
a finished text), backend (the back-end seam), hf and server (the two back ends), proposer (the proposer and
history), config (which back end is configured). Every name callers use is exported here.
"""
from .backend import Backend, Checker, Sample
from .check import check_text
from .config import NOT_CONFIGURED, backend_from_config
from .grammar import PINNED_SECTIONS, InfeasibleProblem, legal_values, proposal_grammar
from .hf import HFBackend
from .prompt import Hardware, HistoryItem, build_messages, messages_as_text, render_for_prompt
from .proposer import Dropped, LLMProposer, Proposal, history_from_jsonl
from .server import OpenAIBackend, ServerError

__all__ = ["Backend", "Checker", "Dropped", "HFBackend", "Hardware", "HistoryItem", "InfeasibleProblem",
           "LLMProposer", "NOT_CONFIGURED", "OpenAIBackend", "PINNED_SECTIONS", "Proposal", "Sample", "ServerError",
           "backend_from_config", "build_messages", "check_text", "history_from_jsonl", "legal_values",
           "messages_as_text", "proposal_grammar", "render_for_prompt"]
