"""Which back end is configured: command-line flags first, then the environment; and what to say when none is."""
from __future__ import annotations

from typing import Optional

from ... import settings
from .hf import HFBackend
from .server import OpenAIBackend


def backend_from_config(model_dir: Optional[str] = None, server: Optional[str] = None,
                        model: Optional[str] = None, **server_kwargs):
    """The configured back end (flags first, then L2C_LLM_MODEL_DIR / L2C_LLM_URL + L2C_LLM_MODEL), or None."""
    model_dir = model_dir or settings.value("L2C_LLM_MODEL_DIR")
    server = server or settings.value("L2C_LLM_URL")
    model = model or settings.value("L2C_LLM_MODEL")
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
