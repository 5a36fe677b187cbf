"""Back end: a local Hugging Face model, each token masked by an llguidance matcher of the proposal grammar, and
a depth-first search that backtracks to the knob the validator names until the kernel validates."""
from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .backend import Checker, Sample
from .prompt import messages_as_text


class HFBackend:
    """A local model directory (transformers), each token masked by an llguidance matcher."""

    def __init__(self, model_dir: str, device: Optional[str] = None, dtype: Optional[str] = None):
        if not Path(model_dir).is_dir():   # a hub name would be downloaded: l2c reads only a local model
            raise ValueError(f"{model_dir}: not a local model directory")
        import torch
        import llguidance
        import llguidance.hf
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch, self.llguidance = torch, llguidance
        self.name = Path(model_dir).name or str(model_dir)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
            model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, **kwargs)
        except Exception as err:  # noqa: BLE001 - transformers raises many kinds for a folder that holds no model
            reason = (str(err).strip().splitlines() or [""])[0][:200]
            raise ValueError(f"{model_dir}: cannot load a model from it ({type(err).__name__}: {reason})") from None
        self.model = model.to(self.device).eval()
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
