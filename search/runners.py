"""The Runner seam: `evaluate(spec, problem) -> Outcome`, the only way the search learns how good a spec is.

- `GPURunner`: build (l2c.build), then l2c.evaluate's pipeline (the one `l2c bench` runs: verify, then time
  against torch.matmul in the chosen protocol) on the current CUDA device. Builds are cached per spec text: a shape-generic spec is
  built once and measured on every shape it is tried on (compile once, measure many).
- `InterpreterRunner`: the same pipeline on CPU with TRITON_INTERPRET=1 and the CPU timing device of
  l2c.measure — real kernels on tiny shapes, for tests of the machinery; its "speedups" mean nothing.
- `ModelRunner`: the analytic cost MODEL (search/costmodel.py), for the CPU sample-efficiency harness.
- `FunctionRunner`: any `f(params, problem) -> speedup`, for planted-structure tests.

Every runner subclasses `Runner`; the search calls only what `Runner` declares. Runners receive specs that
already passed validation; they never see an invalid point.
"""
from __future__ import annotations

import abc
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from ..ir import KernelSpec
from ..validate import validate
from .space import Problem


@dataclass
class Outcome:
    status: str                        # ok | build_failed | verify_failed
    speedup: Optional[float] = None    # baseline time / candidate time; None unless ok
    tflops: Optional[float] = None
    baseline_tflops: Optional[float] = None
    reason: str = ""
    seconds: float = 0.0               # wall time spent evaluating, building included
    build_seconds: float = 0.0         # of which building (or loading) the kernel: the rest is verify and measure


class Runner(abc.ABC):
    """What the search evaluates with. A subclass sets `gpu` and `protocol` and implements `evaluate`; the hooks
    have defaults that suit a runner with no builds of its own and no GPU context to lose."""

    gpu: str            # what the figures were measured on (store / study key)
    protocol: str
    uses_compile_pool: bool = False   # builds may go ahead to a CPU process pool (search/compile_pool.py)

    @abc.abstractmethod
    def evaluate(self, spec: KernelSpec, problem: Problem) -> Outcome:
        """The outcome of `spec` on `problem`; never raises for a bad candidate."""

    def note_build_failure(self, spec: KernelSpec, reason: str) -> None:
        """A compile-pool build of `spec` failed with `reason`."""

    def poisoned(self) -> Optional[str]:
        """Why this process can evaluate nothing more (a kernel broke its GPU context), or None."""
        return None


# CUDA errors after which the process's context is unusable: every later launch fails too.
STICKY_CUDA_ERRORS = ("illegal memory access", "unspecified launch failure", "misaligned address",
                      "illegal instruction", "device-side assert", "CUDA error: an illegal")


class RunnerPoisoned(RuntimeError):
    """A kernel broke the GPU context of this process; its outcome is recorded, the worker must restart."""


class PipelineRunner(Runner):
    """build -> verify -> measure through the l2c modules; GPURunner and InterpreterRunner configure it."""

    def __init__(self, protocol: str, device: str, gpu: str, verify_seed: Optional[int] = None):
        self.protocol = protocol
        self.device = device
        self.gpu = gpu
        self.verify_seed = verify_seed                   # None: fresh random inputs every check
        self.builds = 0                                  # build() calls made (tests count them)
        self._kernels: Dict[Tuple[str, str], object] = {}   # (spec text, target) -> Kernel | failure text
        self._poisoned: Optional[str] = None

    def _kernel(self, spec: KernelSpec, problem: Problem):
        key = (spec.to_l2(), spec.target)
        if key not in self._kernels:
            from ..build import build
            from ..errors import BuildError
            self.builds += 1
            try:
                self._kernels[key] = build(validate(spec, spec.target, problem.arch))
            except BuildError as err:
                self._kernels[key] = f"build: {err}"
            except Exception as err:
                self._kernels[key] = f"build: {type(err).__name__}: {err}"
        return self._kernels[key]

    def note_build_failure(self, spec: KernelSpec, reason: str) -> None:
        """A compile-pool build failed: remember it so the spec is not built again here."""
        self._kernels[(spec.to_l2(), spec.target)] = reason

    def poisoned(self) -> Optional[str]:
        return self._poisoned

    def evaluate(self, spec: KernelSpec, problem: Problem) -> Outcome:
        outcome = self._evaluate(spec, problem)
        if self.device == "cuda" and outcome.status != "ok" and any(e in outcome.reason for e in STICKY_CUDA_ERRORS):
            self._poisoned = outcome.reason
        return outcome

    def _evaluate(self, spec: KernelSpec, problem: Problem) -> Outcome:
        t0 = time.perf_counter()
        kernel = self._kernel(spec, problem)
        built = time.perf_counter() - t0   # timed apart, so a tune shows whether it is compiler-bound
        if isinstance(kernel, str):
            return Outcome("build_failed", reason=kernel, seconds=built, build_seconds=built)
        from .. import devices, measure
        from ..evaluate import evaluate
        mp = measure.Problem.from_spec(kernel.valid.spec, problem.m, problem.n, problem.k, problem.batch)
        result = evaluate(kernel, measure.TorchMatmul(mp), mp, [self.protocol], devices.get_device(self.device),
                          seed=self.verify_seed, **self.measure_options)
        seconds = time.perf_counter() - t0
        if result.status is not None:
            return Outcome(result.status, reason=f"verify: {result.reason}", seconds=seconds, build_seconds=built)
        if self.protocol in result.errors:   # the store records verdicts: a run that cannot time it fails it
            return Outcome("verify_failed", reason=f"measure: {result.errors[self.protocol]}", seconds=seconds,
                           build_seconds=built)
        timing = result.timings[self.protocol]
        return Outcome("ok", speedup=timing.speedup, tflops=timing.candidate_tflops,
                       baseline_tflops=timing.baseline_tflops, seconds=seconds, build_seconds=built)

    measure_options: Dict[str, object] = {}   # measure.measure's keywords (tests shorten the protocols)


class GPURunner(PipelineRunner):
    uses_compile_pool = True

    def __init__(self, protocol: str = "kernel"):
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU is visible to this process")
        super().__init__(protocol, device="cuda", gpu=torch.cuda.get_device_name())


class InterpreterRunner(PipelineRunner):
    """Real Triton kernels under the interpreter on CPU; only sensible for tiny shapes."""

    def __init__(self, protocol: str = "kernel"):
        os.environ.setdefault("TRITON_INTERPRET", "1")
        super().__init__(protocol, device="cpu", gpu="cpu-interpreter")
        self.measure_options = {"reps": 2, "iters": 2, "warmup": 1, "graphs": False, "rotate": False}


class ModelRunner(Runner):
    """Outcomes from the analytic cost model (labelled `model`; never a measurement)."""

    def __init__(self, protocol: str = "kernel", sigma: float = 0.02, seed: int = 0):
        self.protocol, self.sigma, self.seed = protocol, sigma, seed
        self.gpu = "model-H200"

    def evaluate(self, spec: KernelSpec, problem: Problem) -> Outcome:
        from . import costmodel
        concrete = spec.replace(problem_m=problem.m, problem_n=problem.n, problem_k=problem.k)
        v = validate(concrete, spec.target, problem.arch)
        t = costmodel.model_time(v, problem) * costmodel.noise(spec.to_l2(), problem, self.sigma, self.seed)
        base = costmodel.baseline_time(problem)
        return Outcome("ok", speedup=base / t, tflops=problem.flops() / t / 1e12,
                       baseline_tflops=problem.flops() / base / 1e12)


class FunctionRunner(Runner):
    """Outcomes from a reward function of the search point, e.g. a planted structure in a test."""

    def __init__(self, fn: Callable[[Dict[str, object], Problem], float], gpu: str = "function",
                 protocol: str = "kernel"):
        self.fn, self.gpu, self.protocol = fn, gpu, protocol

    def evaluate(self, spec: KernelSpec, problem: Problem) -> Outcome:
        from .space import params_from_spec
        s = float(self.fn(params_from_spec(spec), problem))
        if s <= 0:
            return Outcome("verify_failed", reason="reward function says this point fails")
        return Outcome("ok", speedup=s)


def make_runner(kind: str, protocol: str = "kernel") -> Runner:
    if kind == "gpu":
        return GPURunner(protocol)
    if kind == "interpreter":
        return InterpreterRunner(protocol)
    if kind == "model":
        return ModelRunner(protocol)
    raise ValueError(f"unknown runner {kind!r}; expected gpu, interpreter or model")
