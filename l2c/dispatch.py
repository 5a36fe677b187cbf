"""Drop-in use of tuned kernels from PyTorch: `l2c.matmul` looks up the tuned table and runs the winner.

The dispatcher sees only the tuned table (docs/CONTRACTS.md). For a call it:
1. decides whether l2c can serve it at all (CUDA tensors, f16/bf16, 2-D, layouts a kernel can read);
2. finds the table entry for the exact (M, N, K) or, for a varying token count M, the entry with the same
   (N, K) and the nearest tuned M at or above it (a shape-generic kernel: M is a run-time argument);
3. specialises the entry's spec for the requested epilogue (bias per column, activation), validates it,
   builds it once and caches the resulting callable per call signature;
4. falls back to torch for everything else. Any build or validation failure is remembered and falls
   back too: the result is always correct, and l2c never chooses a path it knows to be slower.

The resolution for a call signature is cached, so the steady-state call path is one dict lookup plus the
kernel launch.
"""
from __future__ import annotations

import bisect
import json
import logging
import os
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from .build import call_signature
from .errors import BuildError, L2Error
from .knobs import ANY
from .parser import parse_one

log = logging.getLogger("l2c.dispatch")

ACTIVATIONS = ("none", "relu", "gelu", "silu")
_TORCH_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class TunedEntry:
    m: int
    n: int
    k: int
    batch: int
    dtype: str
    layout: str            # "row,col,row": layouts of A, B, C
    target: str
    spec_text: str
    tflops: float
    baseline_tflops: float

    @property
    def speedup(self) -> float:
        return self.tflops / self.baseline_tflops if self.baseline_tflops else 0.0


class TunedTable:
    """The tuned table of one architecture, indexed for exact and nearest-M lookups."""

    def __init__(self, entries: List[TunedEntry], arch: str = "sm_90", source: str = "<memory>"):
        self.arch = arch
        self.source = source
        self.exact: Dict[Tuple, TunedEntry] = {}
        by_nk: Dict[Tuple, List[Tuple[int, TunedEntry]]] = {}
        for e in entries:
            if e.speedup <= 1.0:   # never choose by default a kernel measured slower than cuBLAS
                continue
            key = (e.dtype, e.layout, e.n, e.k, e.batch)
            self.exact[key + (e.m,)] = e
            by_nk.setdefault(key, []).append((e.m, e))
        self.by_nk = {k: sorted(v, key=lambda t: t[0]) for k, v in by_nk.items()}

    @classmethod
    def load(cls, path) -> "TunedTable":
        data = json.loads(Path(path).read_text())
        fields = TunedEntry.__dataclass_fields__
        entries = [TunedEntry(**{("spec_text" if k == "spec" else k): v for k, v in row.items()
                                 if (k if k != "spec" else "spec_text") in fields})
                   for row in data.get("entries", [])]
        return cls(entries, arch=data.get("arch", "sm_90"), source=str(path))

    def lookup(self, dtype: str, layout: str, m: int, n: int, k: int, batch: int = 1) -> Optional[TunedEntry]:
        key = (dtype, layout, n, k, batch)
        hit = self.exact.get(key + (m,))
        if hit is not None:
            return hit
        candidates = self.by_nk.get(key)
        if not candidates:
            return None
        ms = [c[0] for c in candidates]
        i = bisect.bisect_left(ms, m)
        return candidates[min(i, len(candidates) - 1)][1]

    def __len__(self) -> int:
        return len(self.exact)


def default_table_path(arch: str) -> Optional[Path]:
    """`L2C_TUNED_TABLE` if set, else the table shipped for `arch` (l2c/tuned/<arch>.json), if any."""
    env = os.environ.get("L2C_TUNED_TABLE")
    if env:
        return Path(env)
    shipped = Path(str(resources.files("l2c") / "tuned" / f"{arch}.json"))
    return shipped if shipped.exists() else None


def _layout_of(t: torch.Tensor) -> Optional[str]:
    if t.stride(-1) == 1 and t.stride(-2) >= max(1, t.shape[-1]):
        return "row"
    if t.stride(-2) == 1 and t.stride(-1) >= max(1, t.shape[-2]):
        return "col"
    return None


def _fallback(a, b, bias, activation, out):
    y = torch.matmul(a, b)
    y = _activate(y if bias is None else y + bias, activation)
    if out is not None:
        out.copy_(y)
        return out
    return y


class Dispatcher:
    """Resolves calls to tuned kernels; one per process (see `default_dispatcher`)."""

    def __init__(self, table: Optional[TunedTable], allow_cpu: bool = False):
        # allow_cpu: serve CPU tensors too (Triton interpreter, TRITON_INTERPRET=1) — for tests only.
        self.table = table
        self.allow_cpu = allow_cpu
        self._resolved: Dict[Tuple, Optional[Callable]] = {}
        self._by_call: Dict[Tuple, Optional[Callable]] = {}
        self._kernels: Dict[str, Optional[Callable]] = {}
        self._lock = threading.Lock()
        self.stats = {"tuned": 0, "fallback": 0}

    def _signature(self, a, b, bias, activation) -> Optional[Tuple]:
        if self.table is None or a.dim() != 2 or b.dim() != 2:
            return None
        if not (a.is_cuda and b.is_cuda) and not self.allow_cpu:
            return None
        dtype = _TORCH_DTYPES.get(a.dtype)
        if dtype is None or b.dtype != a.dtype or a.device != b.device:
            return None
        if bias is not None and (bias.dim() != 1 or bias.dtype != a.dtype or not bias.is_contiguous()):
            return None
        la, lb = _layout_of(a), _layout_of(b)
        if la is None or lb is None:
            return None
        m, k = a.shape
        n = b.shape[1]
        return (dtype, f"{la},{lb},row", m, n, k, bias is not None, activation, a.device.index)

    def _build(self, entry: TunedEntry, m: int, bias: bool, activation: str) -> Optional[Callable]:
        from .build import build
        from .validate import validate
        try:
            spec = parse_one(entry.spec_text, file="<tuned table>")
            if spec.problem_m != m:
                spec = spec.replace(problem_m=ANY)
            spec = spec.replace(epilogue_bias="col" if bias else "none", epilogue_activation=activation)
            text = spec.to_l2()
            if text not in self._kernels:
                try:
                    self._kernels[text] = build(validate(spec, entry.target, self.table.arch))
                except (L2Error, BuildError) as err:
                    log.warning("tuned kernel for %s unusable, falling back to torch: %s", entry, err)
                    self._kernels[text] = None
            return self._kernels[text]
        except L2Error as err:
            log.warning("bad tuned-table entry %s: %s", entry, err)
            return None

    def resolve(self, a, b, bias, activation, tensors=None) -> Optional[Callable]:
        # Steady state: one dict lookup keyed by what a call's resolution depends on (shapes, strides,
        # dtypes and devices: `tensors`, call_signature(a, b, bias)), before any of the checks in _signature.
        if tensors is None:
            tensors = call_signature(a, b, bias)
        call_key = None if tensors is None else (tensors, activation)
        kernel = self._by_call.get(call_key, False)
        if kernel is not False:
            return kernel
        sig = self._signature(a, b, bias, activation)
        if sig is None:
            kernel = None
        else:
            kernel = self._resolved.get(sig, False)
            if kernel is False:
                with self._lock:
                    dtype, layout, m, n, k, has_bias, act, _ = sig
                    entry = self.table.lookup(dtype, layout, m, n, k)
                    kernel = self._build(entry, m, has_bias, act) if entry is not None else None
                    self._resolved[sig] = kernel
        if call_key is not None:
            self._by_call[call_key] = kernel
        return kernel

    def _run_tuned(self, kernel, a, b, bias, out=None, tensors=None):
        """The tuned kernel's result, or None when there is none or it declines this call (a ValueError, e.g. a
        misaligned pointer: this call only) and the caller falls back; counts which path served the call.
        `tensors` (call_signature(a, b, bias), computed once for the lookup) goes on to the kernel's plans."""
        if kernel is not None:
            try:
                if out is None and tensors is not None:
                    result = kernel.call_planned(tensors, a, b, bias)
                else:
                    result = kernel(a, b, bias=bias, out=out)
                self.stats["tuned"] += 1
                return result
            except ValueError as err:
                log.debug("tuned kernel declined the call (%s); falling back", err)
        self.stats["fallback"] += 1
        return None

    def matmul(self, a, b, bias=None, activation=None, out=None):
        activation = check_activation(activation)
        tensors = call_signature(a, b, bias)
        result = self._run_tuned(self.resolve(a, b, bias, activation, tensors), a, b, bias, out, tensors)
        return result if result is not None else _fallback(a, b, bias, activation, out)

    def linear(self, x, weight, bias=None, activation=None):
        """`activation(x @ weight^T + bias)` for `l2c.nn.Linear` in eager mode, any leading dimensions.

        Where no tuned kernel serves the call, this is exactly what `torch.nn.Linear` runs (`F.linear`,
        one cuBLAS call with the bias fused) plus the activation, so an unserved layer costs only the
        lookup, not a reshaped `torch.matmul` and a separate bias add.
        """
        activation = check_activation(activation)
        x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
        w_t = weight.t()
        tensors = call_signature(x2, w_t, bias)
        y = self._run_tuned(self.resolve(x2, w_t, bias, activation, tensors), x2, w_t, bias, None, tensors)
        if y is None:
            return _activate(F.linear(x, weight, bias), activation)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], weight.shape[0])


def check_activation(activation: Optional[str]) -> str:
    """`activation` as the dispatcher names it ("none" for None); ValueError for one it does not know."""
    activation = activation or "none"
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return activation


def _activate(y, activation):
    if activation == "relu":
        return F.relu(y)
    if activation == "gelu":
        return F.gelu(y)
    if activation == "silu":
        return F.silu(y)
    return y


_default: Optional[Dispatcher] = None


def default_dispatcher() -> Dispatcher:
    """The process-wide dispatcher, loading the tuned table of the current GPU on first use."""
    global _default
    if _default is None:
        table = None
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            path = default_table_path(f"sm_{major}{minor}")
            if path is not None:
                table = TunedTable.load(path)
        _default = Dispatcher(table)
    return _default


def set_tuned_table(table: Optional[TunedTable], allow_cpu: bool = False) -> Dispatcher:
    """Use `table` (or none: always torch) from now on in this process."""
    global _default
    _default = Dispatcher(table, allow_cpu=allow_cpu)
    return _default


# ---- torch custom op: lets torch.compile and CUDA graphs see l2c.matmul as one opaque op ----

@torch.library.custom_op("l2c::matmul", mutates_args=())
def _matmul_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], activation: str) -> torch.Tensor:
    return default_dispatcher().matmul(a, b, bias=bias, activation=activation)


@_matmul_op.register_fake
def _(a, b, bias, activation):
    return a.new_empty((a.shape[0], b.shape[1]))


def matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: Optional[str] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`activation(a @ b + bias)` through the tuned kernel for this shape, or torch when none serves it.

    a: (M, K), b: (K, N), bias: (N,) or None; activation: None | "relu" | "gelu" | "silu".
    Other ranks are handled by torch (3-D inputs are flattened by `l2c.nn.Linear` before they get here).
    """
    if out is not None or a.dim() != 2 or b.dim() != 2 or not torch.compiler.is_compiling():
        # Eager calls skip the custom-op dispatch layer: it costs microseconds per call and only
        # torch.compile (tracing) needs to see l2c.matmul as one opaque op.
        return default_dispatcher().matmul(a, b, bias=bias, activation=activation, out=out)
    return _matmul_op(a, b, bias, activation or "none")
