"""Back end: an OpenAI-compatible server (vLLM), the proposal grammar sent as structured output; its outputs are
checked on the client (check.py)."""
from __future__ import annotations

import http.client
import json
import logging
import os
import time
import urllib.error
import urllib.request
from typing import List, Optional

from ... import settings
from .backend import Checker, Sample

log = logging.getLogger("l2c.search.llm")


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
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the server is an http:// or https:// URL, got {url!r}")
        self.url = _endpoint(url)
        self.model = model
        self.name = model
        self.api_key = api_key if api_key is not None else (
            settings.value("L2C_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY"))
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
            except http.client.HTTPException as err:   # not HTTP, or cut short: urllib passes these through
                last = f"{type(err).__name__}: {err}"
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
