"""LLM proposer: derived grammar, constrained local decoding, the OpenAI-compatible client, `l2c propose`.

Everything runs offline on CPU: a tiny randomly initialised GPT-2 and a byte-level BPE tokenizer trained
here on spec text (merged across spaces and `=`, so its tokens straddle grammar terminals) stand in for
a real model. A random model is the hardest case for the constraint: it wanders wherever it is allowed.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from l2c.cli import main as cli_main
from l2c.grammar import grammar_text
from l2c.ir import KernelSpec
from l2c.knobs import KNOBS, TARGETS
from l2c.parser import parse_one
from l2c.search.llm import (LLMProposer, OpenAIBackend, build_messages, check_text, history_from_jsonl,
                            legal_values, proposal_grammar, render_for_prompt, Hardware)
from l2c.search.llm.grammar import outside_grammar, pinned_values
from l2c.search.space import Problem
from l2c.validate import validate
from tests.strategies import valid_specs

NEEDS = "needs the llm extra: pip install -e '.[llm]'"
PROBLEMS = [Problem(4096, 4096, 4096), Problem(512, 1024, 256, dtype="bf16", layout_b="col"),
            Problem(8192, 1024, 8192, batch=2)]


def _problem_pins(p: Problem, target: str) -> dict:
    return dict(target=target, problem_m=p.m, problem_n=p.n, problem_k=p.k, problem_batch=p.batch,
                types_a=p.dtype, types_b=p.dtype, types_c=p.dtype, types_acc="f32",
                layout_a=p.layout_a, layout_b=p.layout_b, layout_c=p.layout_c)


# ---------------------------------------------------------------------------------------------------
# The derived grammar (needs only lark; llguidance checks where installed)
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.key())
def test_llguidance_accepts_file_and_derived_grammars(problem, target):
    llg = pytest.importorskip("llguidance", reason=NEEDS)
    for g in (grammar_text(), proposal_grammar(problem, target)):
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(llg.LLMatcher.grammar_from_lark(g))
        assert not is_error and not messages, messages


@pytest.mark.parametrize("target", TARGETS)
def test_prompt_rendering_is_in_the_derived_language(target):
    """The examples the model is shown are sentences of the grammar it is held to."""
    from lark import Lark
    p = PROBLEMS[1]
    lark = Lark(proposal_grammar(p, target, name="ex"), parser="lalr")
    spec = KernelSpec(name="ex", **_problem_pins(p, target))
    lark.parse(render_for_prompt(spec, p, target))


# valid_specs filters draws by validation, which refuses most of the grown space: not a slow test
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(data=st.data(), target=st.sampled_from(TARGETS), problem=st.sampled_from(PROBLEMS))
def test_pruning_keeps_every_value_of_every_valid_spec(data, target, problem):
    """Witness pruning never removes a value some valid spec for the problem uses."""
    pins = _problem_pins(problem, target)
    del pins["target"]   # valid_specs draws it (`any` or this target)
    spec = data.draw(valid_specs(target, **pins))
    legal = legal_values(problem, target)
    from l2c.search.space import PARAMS_BY_NAME
    for f, values in legal.items():
        v = getattr(spec, f)
        if v in PARAMS_BY_NAME[f].choices:
            assert v in values, (f, v)


def test_cutlass_pruning_drops_single_knob_rejects():
    legal = legal_values(PROBLEMS[0], "cutlass")
    assert 256 not in legal["tile_k"] and 1 not in legal["pipeline_stages"]
    assert 16 in legal["tile_m"]   # witnessed by launch swap=yes (CUTLASS's tile M is then the spec's tile N)
    assert "launch_warps" not in legal   # Triton-only knob
    triton = legal_values(PROBLEMS[0], "triton")
    assert 48 not in triton["tile_n"] and 192 not in triton["tile_m"]   # rule triton-tile-pow2


@pytest.mark.parametrize("target", TARGETS)
def test_a_gated_problem_s_grammar_pins_the_gate_and_prunes_what_it_forbids(target):
    """`l2c tune --gate`: the proposal grammar of a gated problem pins its gate (and, for CUTLASS, the store its gated
    GEMM needs), and its legal values keep only what a gated kernel can take (no Triton split-K, CUTLASS tile n
    48-128); the prompt's examples are sentences of it."""
    from lark import Lark
    p = Problem(512, 14336, 4096, layout_b="col", gate="silu")
    grammar = proposal_grammar(p, target, name="ex")
    assert 'epilogue_gate: " gate=" ("silu")' in grammar.splitlines()
    legal = legal_values(p, target)
    if target == "triton":
        assert legal["split_k_slices"] == (1,)
    else:
        assert set(legal["tile_n"]) <= {48, 64, 96, 128}
        assert 'epilogue_store: " store=" ("staged")' in grammar.splitlines()
    pins = dict(_problem_pins(p, target), epilogue_gate="silu")
    if target == "cutlass":
        pins.update(epilogue_store="staged", tile_n=64)
    Lark(grammar, parser="lalr").parse(render_for_prompt(KernelSpec(name="ex", **pins), p, target))


@pytest.mark.parametrize("target", TARGETS)
def test_a_gated_problem_s_grammar_requires_the_gate_it_pins(target):
    """The epilogue statement was optional, so a sentence without it (a plain GEMM: gate=none) fit the grammar and
    the proposer's check dropped it: half of the grammar's sentences for gated problems. The statement holding a
    pinned knob is required, and every sentence the grammar accepts here passes the proposer's check."""
    from lark import Lark
    from lark.exceptions import LarkError
    p = Problem(512, 14336, 4096, layout_b="col", gate="silu")
    grammar = Lark(proposal_grammar(p, target, name="ex"), parser="lalr")
    pins = dict(_problem_pins(p, target), epilogue_gate="silu")
    if target == "cutlass":
        pins.update(epilogue_store="staged", tile_n=64)
    gated = render_for_prompt(KernelSpec(name="ex", **pins), p, target)
    grammar.parse(gated)
    plain = "\n".join(line for line in gated.splitlines() if not line.strip().startswith("epilogue")) + "\n"
    assert plain != gated
    with pytest.raises(LarkError):
        grammar.parse(plain)
    spec = parse_one(gated)
    assert outside_grammar(spec, pinned_values(p, target), legal_values(p, target)) is None


def test_history_jsonl_filters_other_problems(tmp_path):
    p = PROBLEMS[0]
    spec = KernelSpec(name="h", **_problem_pins(p, "cutlass"))
    lines = [{"problem": p.key(), "spec": spec.to_l2(), "tflops": 650.0, "baseline_tflops": 700.0},
             {"problem": PROBLEMS[1].key(), "spec": spec.to_l2(), "tflops": 1.0},
             {"spec": spec.replace(tile_n=256).to_l2(), "tflops": None}]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    hist = history_from_jsonl(str(path), p, "cutlass")
    assert [h[1] for h in hist] == [650.0, None] and hist[1][0].tile_n == 256
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match="r.jsonl:1"):
        history_from_jsonl(str(path), p)


@pytest.mark.parametrize("extra", [["--timeout", "nan"], ["--timeout", "-1"], ["--retries", "-1"],
                                   ["--temperature", "nan"], ["--m", "0"], ["--batch", "0"], ["--k", str(2 ** 31)],
                                   ["--arch", "sm_xx"]])
def test_propose_option_edges_are_one_line(extra, capsys):
    """NaN or negative timeouts raised from urllib, -1 retries sent no request, a NaN temperature was sent as
    invalid JSON, and M = 0 was pinned in the grammar: each is refused before any request."""
    args = ["propose", "--m", "32", "--n", "32", "--k", "32", "--server", "http://127.0.0.1:1/v1", "--model", "x"]
    assert cli_main(args + extra) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("figures", [{"tflops": "fast", "baseline_tflops": 1}, {"tflops": 5, "baseline_tflops": "x"},
                                     {"tflops": -1.0, "baseline_tflops": 1.0}])
def test_a_history_line_whose_figures_are_not_numbers_is_named(figures, tmp_path, capsys):
    spec = "kernel h {\n  target triton\n  problem m=32 n=32 k=32\n}\n"
    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps({"spec": spec, **figures}) + "\n")
    rc = cli_main(["propose", "--m", "32", "--n", "32", "--k", "32", "--target", "triton", "--server",
                   "http://127.0.0.1:1/v1", "--model", "x", "--retries", "0", "--history", str(history)])
    assert rc == 2 and f"{history}:1: not a result line" in capsys.readouterr().err


@pytest.mark.parametrize("llm", [["--llm-server", "http://127.0.0.1:1/v1"], ["--llm-server", "ftp://x", "--llm-model",
                                                                             "m"], ["--llm-model-dir", "/nonexistent"]])
def test_tune_with_a_bad_llm_configuration_is_one_line(llm, tmp_path, capsys):
    rc = cli_main(["tune", "--runner", "model", "--shapes", "64x64x64", "--trials", "1", "--policy", "off",
                   "--store", str(tmp_path / "s.sqlite"), "--storage", ":memory:", *llm])
    assert rc == 2 and "LLM: " in capsys.readouterr().err


def test_a_model_folder_that_holds_no_model_is_one_line(tmp_path, capsys):
    pytest.importorskip("transformers")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    assert cli_main(["propose", "--m", "32", "--n", "32", "--k", "32", "--model-dir", str(folder)]) == 2
    assert "cannot load a model from it" in capsys.readouterr().err


def test_prompt_is_contrastive():
    p = PROBLEMS[0]
    base = KernelSpec(name="s", **_problem_pins(p, "cutlass"))
    hist = [(base.replace(name=f"s{i}", tile_n=n), t, 700.0) for i, (n, t) in
            enumerate([(64, 300.0), (128, 650.0), (256, 720.0)])] + [(base.replace(name="bad", tile_k=128), None, None)]
    system, user = build_messages(p, "cutlass", hist, Hardware(), n_best=1, n_worst=1)
    assert "132 SMs" in system["content"] and "227 KB" in system["content"] and "tile.m" in system["content"]
    text = user["content"]
    assert text.index("720.0 TFLOP/s (1.03x cuBLAS") < text.index("Worst") < text.index("300.0 TFLOP/s")
    assert "650.0" not in text and "FAILED" in text and "kernel bad" in text


def test_propose_without_llm_says_how_to_configure(monkeypatch, capsys):
    for var in ("L2C_LLM_MODEL_DIR", "L2C_LLM_URL", "L2C_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    assert cli_main(["propose", "--m", "4096", "--n", "4096", "--k", "4096"]) == 2
    err = capsys.readouterr().err
    assert "no LLM is configured" in err and "--model-dir" in err and "L2C_LLM_URL" in err


# ---------------------------------------------------------------------------------------------------
# A tiny local model
# ---------------------------------------------------------------------------------------------------

def _corpus():
    import random
    rng = random.Random(0)
    texts = []
    for p in PROBLEMS:
        for target in TARGETS:
            legal = legal_values(p, target)
            for _ in range(40):
                spec = KernelSpec(name="proposal", **_problem_pins(p, target),
                                  **{f: rng.choice(v) for f, v in legal.items()})
                texts.append(render_for_prompt(spec, p, target))
                texts.append(spec.to_l2())
            system, user = build_messages(p, target, [], Hardware())
            texts += [system["content"], user["content"]]
    return texts


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    tokenizers = pytest.importorskip("tokenizers", reason=NEEDS)
    transformers = pytest.importorskip("transformers", reason=NEEDS)
    pytest.importorskip("llguidance", reason=NEEDS)
    import torch
    from tokenizers import decoders, models, pre_tokenizers, trainers
    tok = tokenizers.Tokenizer(models.BPE())
    # No regex pre-split: merges run across spaces, `=` and newlines, so tokens straddle terminals.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    out = tmp_path_factory.mktemp("tiny-gpt2")
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(fast), n_positions=4096, n_embd=64, n_layer=2, n_head=2,
                                     bos_token_id=fast.eos_token_id, eos_token_id=fast.eos_token_id)
    transformers.GPT2LMHeadModel(config).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def backend(tiny_model_dir):
    import torch
    from l2c.search.llm import HFBackend
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # one-token steps of a tiny model: threads only contend on a shared box
    yield HFBackend(tiny_model_dir, device="cpu")
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def prompt_ids(backend):
    return backend.prompt_ids(build_messages(PROBLEMS[0], "cutlass", [], Hardware()))


def test_tokens_straddle_terminals(backend):
    vocab = backend.tokenizer.get_vocab()
    pieces = [backend.tokenizer.convert_tokens_to_string([t]) for t in vocab]
    assert any("=" in s and s.strip("=").strip() and not s.startswith("=") for s in pieces)
    assert any("\n " in s and s.strip() for s in pieces)


def _checker(target, arch="sm_90"):
    def check(text):
        _, reason, off = check_text(text, target, arch)
        return reason, off
    return check


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 20), temperature=st.sampled_from([0.0, 0.7, 1.0, 2.0]),
       target=st.sampled_from(TARGETS), problem=st.sampled_from(PROBLEMS))
def test_every_finished_constrained_sample_parses_and_validates(backend, prompt_ids, seed, temperature, target,
                                                                problem):
    grammar = proposal_grammar(problem, target, name="p")
    s = backend.sample_ids(prompt_ids, grammar, temperature, seed, check=_checker(target), max_backtracks=64)
    if s.text is None:   # allowed, but only as a counted give-up, never as a wrong spec
        assert s.reason.startswith("unfinished:"), s.reason
        return
    spec = parse_one(s.text)
    validate(spec, target, problem.arch)
    assert (spec.problem_m, spec.problem_n, spec.problem_k, spec.problem_batch) == \
        (problem.m, problem.n, problem.k, problem.batch)
    assert spec.types_a == problem.dtype and spec.layout_b == problem.layout_b and spec.target == target


def test_grammar_alone_parses_but_cross_knob_rules_need_the_check(backend, prompt_ids):
    """Without the end-of-kernel check every sample still parses (the derived language is inside
    l2.lark's), but some break cross-knob rules; with the check, the same seed backtracks and ends valid."""
    grammar = proposal_grammar(PROBLEMS[0], "cutlass", name="p")
    rejected = []
    for seed in range(80):
        s = backend.sample_ids(prompt_ids, grammar, 2.0, seed, check=None)
        assert s.text is not None, s.reason
        spec = parse_one(s.text)
        if check_text(s.text, "cutlass", "sm_90")[0] is None:
            rejected.append(seed)
            if len(rejected) == 3:
                break
    assert rejected, "no sample broke a cross-knob rule; the test lost its teeth"
    for seed in rejected:
        s = backend.sample_ids(prompt_ids, grammar, 2.0, seed, check=_checker("cutlass"))
        assert s.backtracks > 0
        if s.text is not None:
            validate(parse_one(s.text), "cutlass")


def test_local_proposer_end_to_end(backend):
    p = PROBLEMS[0]
    base = KernelSpec(name="m", **_problem_pins(p, "cutlass"))
    history = [(base, 650.0, 700.0), (base.replace(name="m2", tile_n=64), 410.0, 700.0)]
    proposer = LLMProposer(backend, target="cutlass", temperature=1.0, seed=3)
    props = proposer.propose(p, history, 3)
    assert 1 <= len(props) <= 3
    keys = set()
    for prop in props:
        assert prop.source == f"llm:{backend.name}" and prop.target == "cutlass"
        assert parse_one(prop.text) == prop.spec
        validate(prop.spec, "cutlass", p.arch)
        key = tuple(prop.spec.replace(name="x").knob_values().items())
        assert key not in keys
        keys.add(key)
        assert prop.spec.replace(name="m") not in (base, base.replace(tile_n=64))
    assert len(props) == 3 or proposer.dropped


def test_cli_propose_with_model_dir(tiny_model_dir, tmp_path, capsys):
    p = PROBLEMS[0]
    hist = tmp_path / "results.jsonl"
    spec = KernelSpec(name="h", **_problem_pins(p, "triton"))
    hist.write_text(json.dumps({"problem": p.key(), "spec": spec.to_l2(), "tflops": 500.0,
                                "baseline_tflops": 700.0}) + "\n")
    rc = cli_main(["propose", "--m", "4096", "--n", "4096", "--k", "4096", "--target", "triton",
                   "--model-dir", tiny_model_dir, "--history", str(hist), "-n", "2", "--seed", "1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    specs = [parse_one(t) for t in out.split("# ")[1:] for t in [t.split("\n", 1)[1]]]
    assert len(specs) == 2 and all(validate(s, "triton") for s in specs)
    assert "valid proposal(s)" in err


# ---------------------------------------------------------------------------------------------------
# An OpenAI-compatible server on 127.0.0.1, backed by the tiny model with the constraint
# ---------------------------------------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):   # keep pytest output clean
        pass

    def _reply(self, code: int, body: bytes, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.requests.append((self.path, dict(self.headers), body))
            action = srv.script.pop(0) if srv.script else "ok"
        if action == "sleep":   # past the client's timeout; the reply goes nowhere
            time.sleep(srv.sleep_s)
            return self._reply(200, b'{"choices": []}')
        if action == "503":
            return self._reply(503, b'{"error": "overloaded"}')
        if action == "400":
            return self._reply(400, b'{"error": "bad grammar"}')
        if action == "notjson":
            return self._reply(200, b"<html>gateway hiccup</html>", "text/html")
        if action == "nochoices":
            return self._reply(200, json.dumps({"object": "error", "message": "nope"}).encode())
        if action == "nothttp":   # a reply that is not HTTP at all
            self.wfile.write(b"hello there\r\n\r\n")
            self.close_connection = True
            return None
        if action == "cutshort":   # the connection closed before the body it announced
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"choices":')
            self.close_connection = True
            return None
        if action == "offproblem":   # a valid spec, but not one of the grammar's: another problem and epilogue
            text = ("kernel llm0 {\n  target cutlass\n  problem m=4096 n=4096 k=4096 batch=1\n"
                    "  types a=bf16 b=bf16 c=bf16 acc=f32\n  layout a=col b=col c=row\n  tile m=128 n=128 k=64\n"
                    "  epilogue alpha=2.0 activation=relu\n}")
            choices = [{"index": 0, "message": {"role": "assistant", "content": text}}]
            return self._reply(200, json.dumps({"choices": choices}).encode())
        if action == "garbage":
            choices = [{"index": 0, "message": {"role": "assistant", "content": "kernel oops {"}},
                       {"index": 1, "message": {"role": "assistant", "content": None}}]
            return self._reply(200, json.dumps({"choices": choices}).encode())
        grammar = body["structured_outputs"]["grammar"]
        samples = srv.backend.sample(body["messages"], grammar, body.get("n", 1), body["temperature"],
                                     body.get("seed", 0), check=None)   # a server knows only the grammar
        choices = [{"index": i, "message": {"role": "assistant", "content": s.text or ""},
                    "finish_reason": "stop" if s.text else "length"} for i, s in enumerate(samples)]
        self._reply(200, json.dumps({"id": "x", "object": "chat.completion", "model": body["model"],
                                     "choices": choices}).encode())


@pytest.fixture()
def server(backend):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = False   # server_close joins the handler threads
    srv.backend, srv.script, srv.requests, srv.lock, srv.sleep_s = backend, [], [], threading.Lock(), 1.0
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv):
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_server_end_to_end_sends_the_grammar_and_validates(server, monkeypatch):
    monkeypatch.setenv("L2C_LLM_API_KEY", "sekrit")
    p = PROBLEMS[1]
    proposer = LLMProposer(OpenAIBackend(_url(server) + "/v1", "tiny", timeout_s=30, retries=0),
                           target="triton", temperature=1.0, seed=5, max_rounds=2)
    props = proposer.propose(p, [], 3)
    path, headers, body = server.requests[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer sekrit"
    assert body["structured_outputs"]["grammar"] == proposal_grammar(p, "triton", name="llm0")
    assert body["guided_grammar"] == body["structured_outputs"]["grammar"] and body["model"] == "tiny"
    for prop in props:
        validate(prop.spec, "triton", p.arch)
        assert prop.source == "llm:tiny"
    # The server does not check cross-knob rules: whatever it got wrong was dropped with the reason.
    assert len(props) == 3 or all(d.reason.split(":")[0] in ("validate", "duplicate", "reply")
                                  for d in proposer.dropped)


def test_server_5xx_is_retried_with_backoff(server):
    server.script = ["503", "503"]
    backend = OpenAIBackend(_url(server), "tiny", timeout_s=30, retries=3, backoff_s=0.05)
    t0 = time.monotonic()
    samples = backend.sample(build_messages(PROBLEMS[0], "cutlass", [], Hardware()),
                             proposal_grammar(PROBLEMS[0], "cutlass"), 2, 1.0, 0)
    assert time.monotonic() - t0 >= 0.05 + 0.1   # two backoffs, doubling
    assert len(server.requests) == 3 and len(samples) == 2
    assert all(s.text and parse_one(s.text) for s in samples)


def test_server_4xx_is_not_retried_and_down_server_is_a_drop(server):
    server.script = ["400"]
    proposer = LLMProposer(OpenAIBackend(_url(server), "tiny", retries=3, backoff_s=0.01), max_rounds=3)
    assert proposer.propose(PROBLEMS[0], [], 2) == []
    assert len(server.requests) == 1 and proposer.counts["server"] == 1
    assert "HTTP 400" in proposer.dropped[0].reason


def test_server_timeout_is_retried_then_dropped(server):
    server.script = ["sleep", "sleep"]
    server.sleep_s = 1.5
    proposer = LLMProposer(OpenAIBackend(_url(server), "tiny", timeout_s=0.3, retries=1, backoff_s=0.01))
    t0 = time.monotonic()
    assert proposer.propose(PROBLEMS[0], [], 2) == []
    assert time.monotonic() - t0 < 1.5
    assert proposer.counts == {"server": 1} and "timed out" in proposer.dropped[0].reason


def test_malformed_replies_are_dropped_with_reasons(server):
    server.script = ["notjson", "nochoices", "garbage"]
    proposer = LLMProposer(OpenAIBackend(_url(server), "tiny", retries=0), max_rounds=3)
    assert proposer.propose(PROBLEMS[0], [], 1) == []
    reasons = [d.reason for d in proposer.dropped]
    assert reasons[0].startswith("reply: not JSON") and reasons[1].startswith("reply: no choices")
    assert reasons[2].startswith("parse: <llm>:1:") and reasons[3] == "reply: choice 1 has no text"
    assert proposer.dropped[2].text == "kernel oops {"


def test_a_reply_that_is_not_http_or_is_cut_short_is_a_drop(server):
    server.script = ["nothttp", "cutshort"]
    proposer = LLMProposer(OpenAIBackend(_url(server), "tiny", retries=0), max_rounds=1)
    assert proposer.propose(PROBLEMS[0], [], 1) == []
    assert proposer.counts["server"] == 1 and "BadStatusLine" in proposer.dropped[0].reason
    assert proposer.propose(PROBLEMS[0], [], 1) == []
    assert "IncompleteRead" in proposer.dropped[1].reason


def test_a_valid_spec_outside_the_grammar_is_dropped(server):
    """A server need not obey the grammar it is sent: a spec that validates but pins another problem, dtype,
    layout or epilogue computes another function, and must not be taken as a proposal for this one."""
    server.script = ["offproblem"]
    problem = PROBLEMS[0]
    proposer = LLMProposer(OpenAIBackend(_url(server), "tiny", retries=0), target="cutlass", max_rounds=1)
    assert proposer.propose(problem, [], 1) == []
    (dropped,) = proposer.dropped
    assert dropped.reason.startswith("grammar: ") and "the grammar allows" in dropped.reason, dropped.reason
    assert proposer.counts == {"grammar": 1}


def test_cli_propose_against_server(server, capsys):
    rc = cli_main(["propose", "--m", "4096", "--n", "4096", "--k", "4096", "--server", _url(server),
                   "--model", "tiny", "-n", "1", "--retries", "0"])
    out, err = capsys.readouterr()
    assert rc in (0, 1) and "valid proposal(s) from llm:tiny" in err
    if rc == 0:
        validate(parse_one(out.split("\n", 1)[1]), "cutlass")


def test_tune_mixes_llm_proposals_into_the_study(tiny_model_dir, tmp_path):
    """`l2c tune --llm-model-dir`: the model's constrained proposals enter the study as trials tagged `llm`
    and their outcomes land in the store (cost-model runner: the machinery, not a speed claim)."""
    import sqlite3
    import subprocess
    import sys
    store = tmp_path / "r.sqlite"
    done = subprocess.run(
        [sys.executable, "-m", "l2c", "tune", "--runner", "model", "--shapes", "512x512x4096", "--target", "triton",
         "--trials", "4", "--warm-start", "2", "--policy", "off", "--seed", "1", "--store", str(store),
         "--storage", f"journal:{tmp_path / 'studies.journal'}", "--llm-model-dir", tiny_model_dir],
        capture_output=True, text=True, timeout=600, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 LLM proposal(s)" in done.stdout + done.stderr
    rows = sqlite3.connect(store).execute("SELECT source, status FROM results").fetchall()
    assert sum(1 for source, _ in rows if source == "llm") == 2, rows
    assert all(status in ("ok", "build_failed", "verify_failed") for source, status in rows if source == "llm")
