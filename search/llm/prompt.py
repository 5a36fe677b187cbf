"""What the model reads: the task, the searched knobs and their legal values, the hardware, the problem and the
best, worst and failed specs measured so far (contrastive context), each rendered as the grammar lays it out."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ...grammar import grammar_text
from ...ir import KernelSpec
from ...knobs import KNOBS
from ...arch import ARCHS
from ..space import Problem
from .grammar import file_structure, legal_values, pinned_values

HistoryItem = Tuple[KernelSpec, Optional[float], Optional[float]]   # (spec, TFLOP/s or None, baseline TFLOP/s)


@dataclass(frozen=True)
class Hardware:
    """Facts the model is told about the GPU (H200 SXM by default)."""
    name: str = "NVIDIA H200 SXM (sm_90)"
    sm_count: int = ARCHS["sm_90"].sm_count
    smem_per_block_kb: int = ARCHS["sm_90"].smem_per_block // 1024
    l2_mb: int = ARCHS["sm_90"].l2_bytes // 2**20
    peak_fp16_tflops: float = ARCHS["sm_90"].peak_flops["f16"] / 1e12
    cublas_4096_tflops: float = 700.0

    def describe(self) -> str:
        return (f"GPU: {self.name}. {self.sm_count} SMs; {self.smem_per_block_kb} KB shared memory per block; "
                f"{self.l2_mb} MB L2; peak dense fp16/bf16 tensor-core throughput ~{self.peak_fp16_tflops:g} "
                f"TFLOP/s; cuBLAS reaches ~{self.cublas_4096_tflops:g} TFLOP/s at 4096x4096x4096 fp16.")


def render_for_prompt(spec: KernelSpec, problem: Problem, target: str) -> str:
    """A spec in the proposal grammar's layout (pinned statements plus the target's searched knobs)."""
    pins = pinned_values(problem, target)
    lines = [f"kernel {spec.name} {{"]
    for section, keyword, krs in file_structure(grammar_text()):
        parts = []
        for kr in krs:
            k = kr.knob
            if k.field in pins or target in k.searched_for:
                v = pins.get(k.field, getattr(spec, k.field))
                parts.append(f" {kr.key}={v}" if kr.key else f" {v}")
        if parts:
            lines.append(f"  {keyword}{''.join(parts)}")
    return "\n".join(lines) + "\n}"


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
