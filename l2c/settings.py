"""Every L2C_* environment variable l2c reads: its name, what it does, and the one function that reads it.

None of them changes the code a kernel is generated from: what does is a knob, so it is in the spec text and the
build id. They choose where things live, which table serves, and how calls are prepared.
"""
from __future__ import annotations

import os
from typing import Optional

SETTINGS = {
    "L2C_CACHE_DIR": "where built kernels are cached (default: the user cache directory for l2c)",
    "L2C_TUNED_TABLE": "the tuned table l2c.matmul reads (default: the one shipped for this GPU, "
                       "l2c/tuned/<arch>.<gpu>.json, else the architecture's, on the GPU it was measured on)",
    "L2C_TUNE": "`off` (default: serve only what the table measured) or `online` (time candidates for shapes no "
                "table covers, once per GPU, driver and l2c code)",
    "L2C_TUNE_MARGIN": "how much faster than torch an online choice must be to serve (default 1.05)",
    "L2C_TUNE_TARGETS": "the targets whose kernels online choice times (default `cutlass`: kernels the C++ call "
                        "table launches, whose eager call is leaner than torch's; `cutlass,triton` adds Triton "
                        "kernels, launched from Python: for calls replayed from CUDA graphs)",
    "L2C_TUNE_EAGER_MARGIN": "how much faster than torch an online Triton choice must also be in an eager call "
                             "(default 1.0: no slower; its launch is Python's)",
    "L2C_PREPARE": "`background` (default: no call waits for a compiler) or `inline` (the first call of a signature "
                   "builds and verifies its kernel on the calling thread)",
    "L2C_PREPARE_TIMEOUT_S": "seconds the background worker may spend on one kernel (build and verification, or "
                             "an online choice) before it is stopped and torch keeps serving that call (default "
                             "900)",
    "L2C_WARM_START": "`0`: importing l2c into a process that has imported torch does not start preparing the "
                      "tuned path in the background (the table, l2c's checker, the prebuilt kernels installed into "
                      "the build cache)",
    "L2C_PACK": "the prebuilt pack of CUTLASS libraries to install from (default: the one shipped in the package)",
    "L2C_NVCC": "the nvcc to compile CUTLASS kernels with (default: nvcc on PATH, then $CUDA_HOME/bin)",
    "L2C_TRITON_PLANS": "`0` turns off the replayed launch plans of Triton kernels (every call through Triton's JIT "
                        "dispatch)",
    "L2C_NATIVE_CALL": "`0` keeps served CUTLASS calls on the Python path (default: a C++ table, built once per "
                       "machine, replays them)",
    "L2C_OVERLAP": "which CUTLASS-target kernels launch with programmatic dependent launch (a kernel starts while "
                   "the one before it on the stream finishes, and waits for it before touching any operand): "
                   "`measured` (default: the kernels measured faster with it, the tensor-core gemv and the "
                   "basic-schedule GEMMs without parallel split-K; inside a CUDA-graph capture only after l2c's own "
                   "kernel), `measured-any` (the same kernels after any kernel), `all` or `0` (none); another "
                   "value is refused "
                   "by `set_tuned_table` and `l2c bench`, and the default dispatcher warns and keeps `measured`",
    "L2C_LLM_MODEL_DIR": "a local Hugging Face model that proposes specs in l2c tune / l2c propose",
    "L2C_LLM_URL": "an OpenAI-compatible server that proposes specs (with L2C_LLM_MODEL)",
    "L2C_LLM_MODEL": "the model name to ask at L2C_LLM_URL",
    "L2C_LLM_API_KEY": "the key for L2C_LLM_URL, if it wants one (else OPENAI_API_KEY)",
}


def value(name: str) -> Optional[str]:
    """The setting's value, None when unset or empty."""
    if name not in SETTINGS:
        raise KeyError(f"{name} is not an l2c setting")
    return os.environ.get(name) or None


OVERLAP_CHOICES = ("measured", "measured-any", "all", "0")


def overlap() -> str:
    """`L2C_OVERLAP` (default `measured`); another value is refused, naming the accepted ones, where it would
    otherwise fail every CUTLASS kernel's construction and leave each call to torch."""
    choice = value("L2C_OVERLAP") or "measured"
    if choice not in OVERLAP_CHOICES:
        raise ValueError(f"L2C_OVERLAP={choice!r}: expected {', '.join(OVERLAP_CHOICES[:-1])} or "
                         f"{OVERLAP_CHOICES[-1]}")
    return choice
