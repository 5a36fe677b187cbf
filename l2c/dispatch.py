"""Drop-in use of tuned kernels from PyTorch: `l2c.matmul` serves a tuned kernel where a measurement says it
beats torch for the call's shape, and torch everywhere else.

For a call the dispatcher:
1. goes straight to torch unless l2c could serve it at all: an (M, N, K) some entry serves
   (`TunedTable.may_serve`), 2-D, no fused activation while autograd records; then CUDA tensors, f16/bf16 and
   layouts a kernel reads;
2. asks the table (`l2c.tuned_table`: the dispatch rule) for the entry that serves exactly this call;
3. specialises the entry's spec for the requested epilogue (bias per column, activation); a kernel that loads
   without a compiler (build cache or prebuilt pack) and that l2c's checker verifies in milliseconds
   (`l2c.checker`: plain epilogues, problems up to 2^34 multiply-adds) is verified on the calling thread and serves
   this very call; any other is handed to the `Preparer`, which builds and verifies it in a background process,
   torch serving the calls meanwhile;
4. once the kernel is ready, builds it in this process (a cache hit) and serves it, and records that it passed
   verification at this shape (`l2c.verified`): a later process on the same GPU, driver and l2c version serves
   it from its first call where loading it runs no compiler. Inside a CUDA-graph capture only kernels that
   already ran eagerly for this signature serve; everything else runs torch.

Two more epilogues go the same way: a residual added to the product (`residual=`: the entry's spec with beta=1 and
the residual as its C input), and the gated MLP projection (`gated_matmul`, `gated_linear`: act(gate) * up over
the concatenated gate and up weights), which only an entry measured on that gated problem serves
(`TunedTable.lookup(..., gate=)`; online choice does not tune it).

A table that cannot be read is warned about once and the dispatcher runs torch. The resolution of a call
signature is cached, so the steady-state call path is one dict lookup plus the kernel launch, and a call
whose shape no entry serves costs one set lookup on top of torch.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import threading
import weakref
from importlib import resources
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.autograd import forward_ad as _forward_ad

from . import background, native_call, settings, targets
from .epilogue import (activate, check_activation, check_gate, torch_gated, torch_gated_linear, torch_matmul,
                       torch_residual)
from .errors import BuildError, L2Error, LaunchError, SignatureDeclined
from .kernel import call_signature
from .parser import parse_one
from .prepare import FAILED, QUEUED, READY, Job, Preparer
from .tuned_table import (MAX_REMEMBERED_NK, NO_LAYOUTS, NO_SHAPES, TableError, TunedEntry, TunedTable, load_table,
                          served_spans, served_spec)

log = logging.getLogger("l2c.dispatch")

_TORCH_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
PREPARE_MODES = ("background", "inline")

__all__ = ["Dispatcher", "TunedEntry", "TunedTable", "default_dispatcher", "set_tuned_table", "precompile"]


def gpu_slug(gpu: str) -> str:
    """The file-name form of a GPU's name (`torch.cuda.get_device_name`): "NVIDIA H100 80GB HBM3" ->
    "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")


def shipped_table_path(arch: str, gpu: Optional[str] = None) -> Optional[Path]:
    """The table shipped for `arch` measured on `gpu` (l2c/tuned/<arch>.<gpu slug>.json), else the arch's own
    (l2c/tuned/<arch>.json, measured on the GPU its `gpu` field names), if any: each GPU gets the table of its own
    measurements where one ships, since sm_90 GPUs differ in SM count, bandwidth and cuBLAS's kernels."""
    tuned = Path(str(resources.files("l2c") / "tuned"))
    for name in ([f"{arch}.{gpu_slug(gpu)}.json"] if gpu else []) + [f"{arch}.json"]:
        if (tuned / name).exists():
            return tuned / name
    return None


def default_table_path(arch: str, gpu: Optional[str] = None) -> Optional[Path]:
    """`L2C_TUNED_TABLE` if set, else the table shipped for `arch` and `gpu` (shipped_table_path)."""
    env = settings.value("L2C_TUNED_TABLE")
    if env:
        return Path(env)
    return shipped_table_path(arch, gpu)


def tune_mode() -> str:
    """`L2C_TUNE`: `off` (default: serve only what the table measured) or `online` (time candidates for shapes the
    table does not cover, once per GPU, driver and l2c version; l2c.online)."""
    mode = settings.value("L2C_TUNE") or "off"
    if mode not in ("off", "online"):
        raise ValueError(f"L2C_TUNE={mode!r}: expected off or online")
    return mode


def prepare_mode() -> str:
    """`L2C_PREPARE`: `background` (default; no call waits for a compiler) or `inline` (build and verify on the
    calling thread, in this process: the first call of a signature waits, for scripts that want no fallback)."""
    mode = settings.value("L2C_PREPARE") or "background"
    if mode not in PREPARE_MODES:
        raise ValueError(f"L2C_PREPARE={mode!r}: expected one of {', '.join(PREPARE_MODES)}")
    return mode


def _layout_of(t: torch.Tensor) -> Optional[str]:
    if t.stride(-1) == 1 and t.stride(-2) >= max(1, t.shape[-1]):
        return "row"
    if t.stride(-2) == 1 and t.stride(-1) >= max(1, t.shape[-2]):
        return "col"
    return None


def b_map_index(b) -> int:
    """Which of `served_kn`'s pair holds the Ms served for this `a @ b`'s B: 0 where B is row-major (`_layout_of`:
    contiguous, or a column slice of a wider row-major matrix), 1 for any other B (the signature decides)."""
    return 0 if b.dim() == 2 and b.stride(1) == 1 and b.stride(0) >= max(1, b.shape[1]) else 1


def _needs_grad(a, b, bias) -> bool:
    return torch.is_grad_enabled() and (a.requires_grad or b.requires_grad
                                        or (bias is not None and bias.requires_grad))


# whether any autocast region is open (one C call; asking per device type costs a Device object per call)
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: True)
# the innermost torch.func transform (vmap, grad, jvp) under way, or None
_functorch_transform = getattr(torch._C._functorch, "peek_interpreter_stack", None) or (lambda: None)


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
# the thread's included dispatch keys when no mode watches torch's ops (with and without inference mode's
# ADInplaceOrView): a Python dispatch mode, a torch.func transform or torch.jit.trace adds its own
_included_keys = torch._C._dispatch_tls_local_include_set
_UNWATCHED = frozenset({torch._C.DispatchKeySet(torch._C.DispatchKey.BackendSelect).raw_repr(),
                        torch._C.DispatchKeySet(torch._C.DispatchKey.BackendSelect).add(
                            torch._C.DispatchKey.ADInplaceOrView).raw_repr()})


def mode_watching() -> bool:
    """Whether a mode watches torch's ops on this thread (as the C++ call table's `no_mode_watching`): FakeTensorMode
    or another dispatch mode, a torch.func transform, torch.jit.trace. Their calls are torch's: a launch would be
    invisible to them, and their tensors may have no memory to launch on. A torch function mode is not one of them
    (`with torch.device(...)` is such a mode): it sees the call to l2c, not torch's ops."""
    return _included_keys().raw_repr() not in _UNWATCHED


def autocast_recasts(a, *others) -> bool:
    """Whether a `torch.autocast` region open for a's device type runs matmuls in another dtype than a's or than one
    of `others` (b, the bias, a residual; None skipped): torch casts them, and the result must have torch's dtype."""
    if not _any_autocast():
        return False
    device = a.device.type
    if not torch.is_autocast_enabled(device):
        return False
    dtype = torch.get_autocast_dtype(device)
    return a.dtype != dtype or any(t is not None and t.dtype != dtype for t in others)


def _torch_serves(a, *tensors) -> bool:
    """Calls no tuned kernel may serve, as the C++ call table's `records_grad`, `autocast_recasts`, `own_memory` and
    `no_mode_watching` send them here: inside a torch.func transform (vmap's batched tensors and grad's wrappers have
    no memory of their own to launch on) or under another mode watching torch's ops (`mode_watching`), a forward-mode
    AD tangent on an operand (dual tensors inside `forward_ad.dual_level()`: the
    kernels have no forward derivative), or a `torch.autocast` region whose dtype for a's device is not every
    operand's (torch casts, and the result must have torch's dtype)."""
    if _functorch_transform() is not None or mode_watching():
        return True
    if any(t is not None and type(t) not in _PLAIN_TENSORS for t in (a, *tensors)):
        return True   # a subclass: a wrapper (DTensor) has no memory to launch on, and torch's op honours the type
    if autocast_recasts(a, *tensors):
        return True
    return _forward_ad._current_level >= 0 and any(
        t is not None and _forward_ad.unpack_dual(t).tangent is not None for t in (a, *tensors))


_launch_failures: set = set()


def _launch_failed(err: LaunchError) -> None:
    """A verified kernel's launch failed (a CUDA error, no image for this GPU): torch serves the call; said once per
    message, since every later call of the signature may fail alike."""
    if str(err) not in _launch_failures:
        _launch_failures.add(str(err))
        log.warning("l2c: a tuned kernel failed to launch; torch serves the call: %s", err)


def _out_needs_torch(out, a) -> bool:
    """An `out=` torch must judge: one that requires grad (torch refuses it), that overlaps itself (a stride 0 across
    more than one element: torch refuses it), that is on another device, or an inference tensor outside inference
    mode (torch refuses to update it in place)."""
    return (out.requires_grad and torch.is_grad_enabled()) or out.device != a.device or \
        any(stride == 0 and size > 1 for stride, size in zip(out.stride(), out.shape)) or \
        (out.is_inference() and not torch.is_inference_mode_enabled())


def _graph_needs_torch(activation, out, a, b, bias) -> bool:
    """A fused activation (or `out=`) has no backward here: where autograd records, torch serves the call."""
    return (activation != "none" or out is not None) and _needs_grad(a, b, bias)


@functools.lru_cache(maxsize=None)
def _validate_text(spec_text: str, target: str, arch: str):
    from .validate import validate
    return validate(parse_one(spec_text), target, arch)


def _validated(job: Job):
    """The ValidSpec of a job's kernel, parsed and validated once per process (L2Error if it does not validate)."""
    return _validate_text(job.spec_text, job.target, job.arch)


_LAST_M = 1 << 62


class _OnlineMs:
    """What a dispatcher that tunes online may serve at one (N, K): every M but those online tuning decided torch
    serves (plain calls: no bias, no activation)."""
    __slots__ = ("torch_ms",)

    def __init__(self):
        self.torch_ms: set = set()

    def __contains__(self, m) -> bool:
        return m not in self.torch_ms

    def spans(self) -> List[Tuple[int, int]]:
        """The Ms held, as the C++ call table's closed spans: the gaps between the Ms decided torch."""
        out, lo = [], 0
        for m in sorted(self.torch_ms):
            if lo <= m - 1:
                out.append((lo, m - 1))
            lo = m + 1
        return out + [(lo, _LAST_M)]


class _OnlineShapes(dict):
    """Maps each (N, K) (or (K, N)) to its _OnlineMs: the `served_nk` / `served_kn` of a dispatcher that tunes
    online. Past MAX_REMEMBERED_NK keys a new one is not kept (every M may be served there, as before a decision)."""

    def __missing__(self, key):
        ms = _OnlineMs()
        if len(self) < MAX_REMEMBERED_NK:
            self[key] = ms
        return ms


def _first_test_resolvers(served_kn, served_nk):
    """The two functions the C++ call table asks the first time it meets a key (l2c.native_call): the spans of M
    served for `a @ b` at b's (K, N), dtype and layout, and for nn.Linear's layout at the weight's (N, K). They hold
    the dispatcher's maps, not the dispatcher: the table the dispatcher holds must not hold it back."""
    def spans(ms):
        return ms.spans() if isinstance(ms, _OnlineMs) else served_spans(ms)

    def resolve_matmul(a, b):
        return spans(served_kn.get(a.dtype, NO_LAYOUTS)[b_map_index(b)][b.shape])

    def resolve_linear(x, weight):
        return spans(served_nk.get(x.dtype, NO_SHAPES)[weight.shape])

    return resolve_matmul, resolve_linear


class Dispatcher:
    """Resolves calls to tuned kernels; one per process (see `default_dispatcher`)."""

    def __init__(self, table: Optional[TunedTable], allow_cpu: bool = False, prepare: Optional[str] = None,
                 online: Optional[bool] = None, candidates: Optional[TunedTable] = None):
        # allow_cpu: serve CPU tensors too (Triton interpreter, TRITON_INTERPRET=1) — for tests only.
        # candidates: the table whose kernels online choice times (default `table`): a table measured on another GPU
        # serves nothing here, but its kernels are worth timing on this one (`table_for_arch`)
        self.table = table
        self.candidates = table if candidates is None else candidates
        self.online = tune_mode() == "online" if online is None else online
        self.decisions = None
        # what this process's online tuning timed per decided signature (spec text -> speedup): `l2c bench` records
        # it as evidence; kept in memory, since the persisted decisions need only the winner
        self.online_timings: Dict[str, Dict[str, float]] = {}
        self.tune_targets: Tuple[str, ...] = ()
        if self.online:
            from .devices import gpu_identity
            from .online import Decisions, decision_settings, tuned_targets
            self.tune_targets = tuned_targets()   # a malformed L2C_TUNE_TARGETS is the caller's to hear of
            try:
                self.decisions = Decisions(*gpu_identity(), **decision_settings(self.candidates))
            except OSError as err:   # a cache folder that cannot be made: never the caller's call's failure
                log.warning("l2c: online choice off: its decisions cannot be kept (%s: %s)", type(err).__name__, err)
                self.online = False
        # no table for this GPU and no online choice: every call is torch's, which the entry points call at once
        self.serves_nothing = table is None and not self.online
        # per torch dtype, the Ms the entries serve at each (N, K) (`d[nk]` is never missing: an empty set where
        # nothing serves): served_nk keyed by a weight's shape, nn.Linear's layouts (`linear`, l2c.nn.Linear);
        # served_kn a pair keyed by b's (K, N) for `a @ b` (l2c.ops.matmul), (b row-major, b column-major). A plain
        # call whose M is not there is torch's after a few dict lookups; online tuning may serve any shape but
        # those it decided torch serves
        self.served_nk: Dict[torch.dtype, object] = {}
        self.served_kn: Dict[torch.dtype, Tuple[object, object]] = {}
        for torch_dtype, name in _TORCH_DTYPES.items():
            if self.online:
                self.served_nk[torch_dtype] = _OnlineShapes()
                self.served_kn[torch_dtype] = (_OnlineShapes(), _OnlineShapes())
            elif table is not None:
                self.served_nk[torch_dtype] = table.served_shapes(name, "row,col,row")
                self.served_kn[torch_dtype] = tuple(table.served_shapes(name, layout, transposed=True)
                                                    for layout in ("row,row,row", "row,col,row"))
        self.allow_cpu = allow_cpu
        self.prepare = prepare or prepare_mode()
        self.preparer = Preparer()
        self._by_call: Dict[Tuple, Optional[Callable]] = {}
        self._failed_signatures: set = set()   # signatures whose preparation raised: torch serves them (`resolve`)
        self._inline_verified: set = set()      # L2C_PREPARE=inline: the jobs (kernel and shape) verified here
        self._kernels: Dict[Tuple, Optional[Callable]] = {}
        # the job of each signature being prepared: a call made while the worker prepares it asks only for its state
        # (deriving the job parses and renders the entry's spec: about 2.5 ms a call on the H200's host)
        self._jobs: Dict[Tuple, Optional[Job]] = {}
        self._ran: set = set()          # (call signature, kernel) pairs that ran eagerly: may serve in a capture
        self._declined: set = set()     # (call signature, kernel) pairs the kernel declined (SignatureDeclined)
        # (call signature, activation argument) -> the kernel that served such a plain call eagerly (no out=, no
        # autograd): the steady-state path, one lookup and the launch (`_served_call`)
        self._served: Dict[Tuple, Callable] = {}
        # the C++ call table (l2c.native_call): the first test, torch's fallback and the served CUTLASS plans in one
        # C++ call, attached once the extension is loaded; the served signatures met before that, registered at
        # their next Python-path call
        self.native = None
        self._unregistered: set = set()
        self._verified = None           # this GPU's VerifiedKernels, read at the first job (l2c.verified)
        self._to_worker: set = set()    # keys of the jobs l2c's checker declined: the worker prepares them
        self._lock = threading.Lock()
        _DISPATCHERS.add(self)
        self.counts = {"tuned": 0, "fallback": 0}   # the Python path's calls (`stats` adds the C++ table's)
        if native_call.enabled() and (table is not None or self.online):
            if torch.cuda.is_available():
                native_call.start_build()
            native_call.when_loaded(self._attach_native)

    @property
    def stats(self) -> Dict[str, int]:
        """Calls served by a tuned kernel and calls sent to torch so far, by either path (Python or C++)."""
        served, fallbacks = self.native.counts() if self.native is not None else (0, 0)
        return {"tuned": self.counts["tuned"] + served, "fallback": self.counts["fallback"] + fallbacks}

    def _attach_native(self) -> None:
        """Take eager calls through the C++ call table from now on (its extension is loaded)."""
        with self._lock:
            if self.native is None:
                self.native = native_call.new_table(*_first_test_resolvers(self.served_kn, self.served_nk))

    # ---- resolution

    def _signature(self, a, b, bias, activation, gate="none", residual=None) -> Optional[Tuple]:
        """(dtype, layouts, M, N, K, bias?, activation, device) of a call a kernel could serve, followed by (gate,
        residual?) for a gated call or one with a residual; N is the output's columns (half of a gated call's B).
        None when no kernel reads such operands."""
        if a.dim() != 2 or b.dim() != 2:
            return None
        if not (a.is_cuda and b.is_cuda) and not self.allow_cpu:
            return None
        dtype = _TORCH_DTYPES.get(a.dtype)
        if dtype is None or b.dtype != a.dtype or a.device != b.device:
            return None
        if bias is not None and (bias.dim() != 1 or bias.dtype != a.dtype or not bias.is_contiguous()
                                 or bias.device != a.device):
            return None
        la, lb = _layout_of(a), _layout_of(b)
        if la is None or lb is None:
            return None
        m, k = a.shape
        n = b.shape[1]
        if gate != "none":
            if n % 2:
                return None
            n //= 2
        if residual is not None and (tuple(residual.shape) != (m, n) or residual.dtype != a.dtype
                                     or residual.device != a.device or _layout_of(residual) != "row"):
            return None
        sig = (dtype, f"{la},{lb},row", m, n, k, bias is not None, activation, a.device.type)
        return sig if gate == "none" and residual is None else sig + (gate, residual is not None)

    def _job(self, entry: TunedEntry, sig: Tuple) -> Optional[Job]:
        """The kernel to prepare for `sig`: the entry's spec with the call's epilogue, generic in M unless exact."""
        _, _, m, n, k, has_bias, activation, device = sig[:8]
        _, residual = sig[8:] or ("none", False)
        try:
            spec = served_spec(entry, m, has_bias, activation, residual=residual)
        except L2Error as err:
            log.warning("bad tuned-table entry %s: %s", entry, err)
            return None
        return Job(spec.to_l2(), entry.target, self.table.arch, m, n, k, device)

    def _kernel(self, job: Job) -> Optional[Callable]:
        """The built kernel of a prepared job (a build-cache hit), or None when it cannot be built here."""
        key = (job.spec_text, job.target, job.arch)
        if key not in self._kernels:
            from .build import build
            try:
                self._kernels[key] = build(_validated(job))
            except (L2Error, BuildError) as err:
                log.warning("tuned kernel unusable, falling back to torch: %s", err)
                self._kernels[key] = None
        return self._kernels[key]

    def _verified_kernels(self):
        if self._verified is None:
            from .devices import gpu_identity
            from .verified import VerifiedKernels
            self._verified = VerifiedKernels(*gpu_identity())
        return self._verified

    def _verified_before(self, job: Job) -> bool:
        """Whether an earlier process verified `job`'s kernel at its shape on this GPU, driver and l2c version, and
        building it here runs no compiler: then it serves from this call on, with no worker."""
        if not self._verified_kernels().holds(job):
            return False
        try:
            return targets.get(job.target).built(_validated(job))
        except L2Error:
            return False

    def _resolve_signature(self, sig: Tuple) -> Tuple[Optional[Callable], bool]:
        """(kernel or None, final): final False means "not yet" (being prepared): ask again on a later call."""
        dtype, layout, m, n, k = sig[:5]
        gate, residual = sig[8:] or ("none", False)
        if sig in self._jobs:
            job = self._jobs[sig]
        else:
            entry = self.table.lookup(dtype, layout, m, n, k, gate=gate) if self.table is not None else None
            if entry is None:
                online = self.online and gate == "none" and not residual
                return self._resolve_online(sig) if online else (None, True)
            job = self._jobs[sig] = self._job(entry, sig)
        return self._prepared(job)

    def _prepared(self, job: Optional[Job]) -> Tuple[Optional[Callable], bool]:
        """A kernel to serve at one call shape: built here where an earlier verification at the shape holds and no
        compiler runs, else verified on the calling thread by l2c's checker or prepared by the worker (the
        dispatcher's steps 3 and 4 in the module docstring)."""
        if job is None:
            return None, True
        if self._verified_before(job):
            return self._kernel(job), True
        if self.prepare == "inline":
            key = (job.spec_text, job.target, job.arch)
            if job.device == "cuda" and torch.cuda.is_current_stream_capturing():
                return None, False   # nothing is built or verified inside a capture (a verification synchronizes,
                                     # which ends the capture): a later eager call prepares it
            if key not in self._kernels:   # built and verified here, on the calling thread
                from .prepare import prepare_one
                ok, reason, kernel = prepare_one(job)
                if ok:
                    self._verified_kernels().record(job)
                    self._inline_verified.add(job.key)
                else:
                    log.warning("tuned kernel not served (torch runs this call): %s", reason)
                self._kernels[key] = kernel   # a build that failed: None; one that failed at this shape only is
                if not ok:                    # verified again at each other shape, as the worker would
                    return None, True
            kernel = self._kernels[key]
            if kernel is not None and job.key not in self._inline_verified:   # built, but not verified at this shape
                from .verify import verify
                result = verify(kernel, job.m, job.n, job.k, device=job.device)
                if not result.ok:
                    log.warning("tuned kernel not served at %dx%dx%d (torch runs it): verification failed: %s",
                                job.m, job.n, job.k, result.reason)
                    return None, True
                self._verified_kernels().record(job)
                self._inline_verified.add(job.key)
            return kernel, True
        if job.key not in self._to_worker:   # asked once: what the checker declined stays the worker's
            checked = self._check_here(job)
            if checked is not None:
                return checked
            self._to_worker.add(job.key)
        state = self.preparer.request(job)
        if state == READY:
            kernel = self._kernel(job)
            if kernel is not None:
                self._verified_kernels().record(job)
            return kernel, True
        return None, state == FAILED

    def _check_here(self, job: Job) -> Optional[Tuple[Optional[Callable], bool]]:
        """A kernel that loads without a compiler and that l2c's checker verifies at this shape in milliseconds
        (`l2c.checker`) is verified on the calling thread, and serves from this call on; the worker, whose start
        costs seconds, is not asked. None when the worker has to prepare it (not checkable here, or the checker
        cannot run); (None, True) when it failed."""
        if job.device != "cuda" or job.candidates or torch.cuda.is_current_stream_capturing():
            return None
        from . import checker
        try:
            valid = _validated(job)
        except L2Error:
            return None
        if not checker.checkable(valid.spec, job.m, job.n, job.k) or not targets.get(job.target).built(valid):
            return None
        if not checker.prepare(compile_if_needed=False):
            return None
        kernel = self._kernel(job)
        if kernel is None:
            return None, True
        background.mark(f"{valid.name} loaded")   # a first call's steps, beside the start-up's
        try:
            result = checker.verify(kernel, job.m, job.n, job.k)
        except (checker.CheckerUnavailable, RuntimeError) as err:   # torch reports a failed allocation so
            log.debug("checking %s on the calling thread failed (%s); the worker checks it", valid.name, err)
            return None
        if not result.ok:
            log.warning("tuned kernel not served (torch runs this call): %s at %dx%dx%d: verification failed: %s",
                        valid.name, job.m, job.n, job.k, result.reason)
            return None, True
        self._verified_kernels().record(job)
        background.mark(f"{valid.name} checked")
        return kernel, True

    def _resolve_online(self, sig: Tuple) -> Tuple[Optional[Callable], bool]:
        """A shape the table does not cover: the persisted decision, or an online-tuning job for the worker."""
        from .online import candidate_specs
        dtype, layout, m, n, k, has_bias, activation, device = sig[:8]
        if not (m and n and k):   # an empty product: nothing to tune, torch returns it
            return None, True
        key = self.decisions.signature(dtype, layout, m, n, k, has_bias, activation)
        decided, spec_text = self.decisions.get(key)
        if decided and spec_text is not None and not self.decisions.fits(spec_text, dtype, layout, has_bias,
                                                                         activation):
            decided = False   # a record that does not compute these calls (edited, copied): tuned again
        if decided and spec_text is None:
            self._decided_torch(dtype, layout, m, n, k, has_bias, activation)
            return None, True
        if decided:
            job = self._decided_job(spec_text, m, n, k, device)
            if job.target in self.tune_targets:
                # served as a table entry's kernel is: built on this thread only where that runs no compiler
                self._jobs[sig] = job
                return self._prepared(job)
            # chosen among targets this process does not time (L2C_TUNE_TARGETS): timed again below
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return None, False      # never tuned inside a capture; a later eager call may tune
        job = self._jobs.get(("online",) + sig)
        if job is None:   # the candidates are asked for once (the policy ranks them), not on every call meanwhile
            candidates = candidate_specs(dtype, layout, m, n, k, self.candidates, self.tune_targets)
            if not candidates:   # no kernel of the timed targets to try: torch's in this process, from the first test
                self._decided_torch(dtype, layout, m, n, k, has_bias, activation)
                return None, True
            job = Job("", "triton", "sm_90", m, n, k, device, tuple(candidates), has_bias, activation)
            self._jobs[("online",) + sig] = job
        state = self.preparer.request(job)
        if state == QUEUED:
            return None, False
        if state != READY:   # the worker failed on the job (it died, ran out of time or memory): no decision to keep,
            return None, True   # torch serves in this process and a later one tunes again
        reply = self.preparer.reply(job)
        if reply.get("spec") is None and not reply.get("timed"):   # nothing could be timed (every candidate
            # skipped or failed): no evidence that torch is faster, so nothing persisted; torch in this process
            self._decided_torch(dtype, layout, m, n, k, has_bias, activation)
            return None, True
        self.decisions.record(key, reply.get("spec"), reply.get("speedup"))
        self.online_timings[key] = dict(reply.get("timings") or {})
        if reply.get("spec") is not None:   # the worker verified the winner at this shape on this GPU
            self._verified_kernels().record(self._decided_job(reply["spec"], m, n, k, device))
        return self._resolve_online(sig)

    @staticmethod
    def _decided_job(spec_text: str, m: int, n: int, k: int, device: str) -> Job:
        """The job of an online decision's kernel (its spec holds the call's epilogue) at one call shape."""
        return Job(spec_text, parse_one(spec_text, file="<online decision>").target, "sm_90", m, n, k, device)

    def _decided_torch(self, dtype: str, layout: str, m: int, n: int, k: int, has_bias: bool,
                       activation: str) -> None:
        """Online tuning decided that torch serves calls of this shape: where they are plain (no bias, no
        activation), the first test sends them to torch from now on, without the Python path (the C++ table asks its
        resolvers again); its maps hold no epilogue, so other calls keep the Python path."""
        if has_bias or activation != "none":
            return
        from .verify import TORCH_DTYPES   # imported on a decision, not at the dispatcher's import
        torch_dtype = TORCH_DTYPES.get(dtype)
        if torch_dtype not in _TORCH_DTYPES:   # no map for it (f32): its calls never reach the first test
            return
        holders = {"row,row,row": [self.served_kn[torch_dtype][0][(k, n)]],
                   "row,col,row": [self.served_kn[torch_dtype][1][(k, n)], self.served_nk[torch_dtype][(n, k)]]}
        added = [ms for ms in holders.get(layout, ()) if m not in ms.torch_ms]
        for ms in added:
            ms.torch_ms.add(m)
        if added and self.native is not None:   # each later signature of a known decision changes nothing
            self.native.forget_first_tests()

    def resolve(self, a, b, bias, activation, tensors=None, gate="none", residual=None) -> Optional[Callable]:
        """The tuned kernel that serves this call, or None (torch serves it)."""
        if tensors is None:
            tensors = call_signature(a, b, bias)
        call_key = None if tensors is None else (tensors, activation)
        if call_key is not None and (gate != "none" or residual is not None):
            call_key += (gate, None if residual is None else
                         (residual.shape, residual.stride(), residual.dtype, residual.get_device()))
        kernel = self._by_call.get(call_key, False)
        if kernel is not False:
            return kernel
        sig = None if self.table is None and not self.online else \
            self._signature(a, b, bias, activation, gate, residual)
        final = True
        kernel = None
        if sig is not None and sig in self._failed_signatures:
            sig = None
        if sig is not None:
            with self._lock:
                try:
                    kernel, final = self._resolve_signature(sig)
                except Exception as err:  # noqa: BLE001 - preparing a kernel never fails the user's call
                    # (a cache that cannot be written, a stale persisted decision, a verification out of memory)
                    log.warning("l2c: torch serves %s from now on: preparing its kernel failed (%s: %s)",
                                sig[:5], type(err).__name__, err)
                    self._failed_signatures.add(sig)
                    kernel, final = None, True
            background.first_call_resolved()
        if final and call_key is not None:
            self._by_call[call_key] = kernel
        return kernel

    # ---- calls

    def _run_tuned(self, kernel, a, b, bias, out, tensors, grad=False, c=None):
        """The tuned kernel's result, or None when there is none or it declines this call (a ValueError, e.g. a
        misaligned pointer: this call only) and the caller falls back; counts which path served the call.
        With `grad` the call records an autograd node whose backward runs the dispatcher's GEMMs; `c` is the C input
        of a kernel that adds a residual."""
        if kernel is not None and (_torch_serves(a, b, bias, c) or (tensors, id(kernel)) in self._declined):
            kernel = None        # a torch.func transform, a forward-mode tangent, autocast to another dtype, or a
            # signature the kernel declined before (its strides): torch's at once, without the kernel's checks
        if kernel is not None:
            if (tensors, id(kernel)) not in self._ran and a.is_cuda and torch.cuda.is_current_stream_capturing():
                kernel = None    # its first launch may allocate or set attributes: not inside a capture
            else:
                try:
                    if grad:
                        result = _TunedMatmul.apply(a, b, bias, kernel, tensors, self)
                    elif c is not None:
                        result = kernel(a, b, c=c, bias=bias, out=out)
                    elif out is None and tensors is not None:
                        result = kernel.call_planned(tensors, a, b, bias)
                    else:
                        result = kernel(a, b, bias=bias, out=out)
                        if out is not None:   # written in place: autograd must see the new version, as torch's does
                            torch.autograd.graph.increment_version(out)
                    self._ran.add((tensors, id(kernel)))
                    self.counts["tuned"] += 1
                    return result
                except SignatureDeclined as err:
                    if out is None and c is None:   # what it declined is in the signature, not in out= or c
                        self._declined.add((tensors, id(kernel)))
                    log.debug("tuned kernel declined the call's signature (%s); falling back", err)
                except (ValueError, torch.OutOfMemoryError) as err:   # no memory for its workspace: torch may need none
                    log.debug("tuned kernel declined the call (%s); falling back", err)
                except LaunchError as err:
                    _launch_failed(err)
        self.counts["fallback"] += 1
        return None

    def may_serve(self, m: int, n: int, k: int, gate: str = "none") -> bool:
        """Whether any kernel may serve this shape (of this gated problem): False sends the call to torch before
        any lookup."""
        return (self.online and gate == "none") or (self.table is not None and self.table.may_serve(m, n, k, gate))

    def _served_call(self, a, b, bias, activation, tensors):
        """The result of the kernel that served this signature eagerly before (no checks left to make but the
        kernel's own per-call ones, in its bound launcher), or None: not served before, or the kernel declined
        this call."""
        key = (tensors, activation)
        launch = self._served.get(key)
        if launch is None or _torch_serves(a, b, bias):
            return None
        try:
            y = launch(a, b, bias)
        except (ValueError, torch.OutOfMemoryError) as err:   # this call only (a misaligned pointer, no memory for
            # a workspace): the full path decides
            log.debug("tuned kernel declined the call (%s)", err)
            return None
        except LaunchError as err:
            _launch_failed(err)
            return None
        if y is not None:
            self.counts["tuned"] += 1
            if self._unregistered and key in self._unregistered:   # empty once registered: no hashing then
                self._register_native(key, launch, a, b, bias)
        return y

    def _remember_served(self, key, kernel, a, b, bias) -> None:
        """After `kernel` served a plain eager call (a, b, bias) of signature key[0]: later such calls go to its
        plan in the C++ table, else straight to its plan (`Kernel.launcher`), else to its planned call."""
        tensors = key[0]
        launch = kernel.launcher(tensors) if hasattr(kernel, "launcher") else None
        if launch is None:
            def launch(a, b, bias):
                return kernel.call_planned(tensors, a, b, bias)
        self._served[key] = launch
        self._register_native(key, launch, a, b, bias)

    def _register_native(self, key, launch, a, b, bias) -> None:
        """Put a CUTLASS plan that served `key` into the C++ table (when the extension is loaded; until then the
        key waits in `_unregistered` for its next served call)."""
        plan = getattr(launch, "native_plan", None)
        code = native_call.activation_code(key[1])
        if plan is None or code < 0 or not native_call.enabled():
            return
        if self.native is None:   # being built (attached when loaded): register at this key's next call
            if native_call.failure() is None:
                native_call.start_build()
                self._unregistered.add(key)
            else:
                self._unregistered.clear()
            return
        struct, address, template, transposed, device = plan
        self.native.add(a, b, bias, code, struct, address, template, transposed, device)
        self._unregistered.discard(key)

    def matmul(self, a, b, bias=None, activation=None, out=None, residual=None):
        if residual is not None:
            return self._addmm(a, b, bias, activation, out, residual)
        if a.ndim != 2 or b.ndim != 2 or not self.may_serve(a.shape[0], b.shape[1], a.shape[1]):
            self.counts["fallback"] += 1   # an M no entry serves (its (N, K) has entries): torch, before any signature
            if bias is None and activation is None:
                return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)
            return torch_matmul(a, b, bias, check_activation(activation), out)
        grad = _needs_grad(a, b, bias)
        plain = out is None and not grad
        tensors = call_signature(a, b, bias)
        if plain:   # served before for this signature: the launch and nothing else
            y = self._served_call(a, b, bias, activation, tensors)
            if y is not None:
                return y
        asked = activation
        activation = check_activation(activation)
        if _graph_needs_torch(activation, out, a, b, bias) or (out is not None and _out_needs_torch(out, a)):
            self.counts["fallback"] += 1
            return torch_matmul(a, b, bias, activation, out)
        kernel = self.resolve(a, b, bias, activation, tensors)
        result = self._run_tuned(kernel, a, b, bias, out, tensors, grad)
        if result is None:
            return torch_matmul(a, b, bias, activation, out)
        if plain and tensors is not None:
            self._remember_served((tensors, asked), kernel, a, b, bias)
        return result

    def _addmm(self, a, b, bias, activation, out, residual):
        """residual + a @ b (+ bias): the served kernel adds the residual as its C input (beta=1), torch in addmm."""
        if check_activation(activation) != "none" or out is not None:
            raise ValueError("residual= adds the residual to the product: it takes no activation and no out=")
        if a.ndim != 2 or b.ndim != 2 or not self.may_serve(a.shape[0], b.shape[1], a.shape[1]) \
                or _needs_grad(a, b, bias) or (torch.is_grad_enabled() and residual.requires_grad):
            self.counts["fallback"] += 1
            return torch_residual(a, b, bias, residual)
        tensors = call_signature(a, b, bias)
        kernel = self.resolve(a, b, bias, "none", tensors, residual=residual)
        result = self._run_tuned(kernel, a, b, bias, None, tensors, c=residual)
        return result if result is not None else torch_residual(a, b, bias, residual)

    def gated_matmul(self, a, b, gate, bias=None):
        """act(a @ b[:, :N] + bias[:N]) * (a @ b[:, N:] + bias[N:]) for b (K, 2N), the gate's columns then the up
        projection's: a kernel measured on this gated problem where the table holds one, else torch (`torch_gated`:
        the two GEMMs apart, then act(g) * u). Autograd recording runs torch."""
        gate = check_gate(gate)
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] % 2 or _needs_grad(a, b, bias) \
                or not self.may_serve(a.shape[0], b.shape[1] // 2, a.shape[1], gate):
            self.counts["fallback"] += 1
            return torch_gated(a, b, bias, gate)
        tensors = call_signature(a, b, bias)
        y = self._run_tuned(self.resolve(a, b, bias, "none", tensors, gate=gate), a, b, bias, None, tensors)
        return y if y is not None else torch_gated(a, b, bias, gate)

    def gated_linear(self, x, weight, gate, bias=None):
        """`gated_matmul` for `l2c.nn.GatedMLP` in eager mode: x (..., K), weight (2N, K) the gate's rows then the
        up projection's (as nn.Linear holds them), any leading dimensions. Unserved, this is F.linear over each
        half, then act(g) * u (`torch_gated_linear`)."""
        gate = check_gate(gate)
        n2, k = weight.shape if weight.ndim == 2 else (0, 0)
        if not (k and x.ndim and n2 % 2 == 0) or _needs_grad(x, weight, bias) \
                or not self.may_serve(x.numel() // k, n2 // 2, k, gate):
            self.counts["fallback"] += 1
            return torch_gated_linear(x, weight, bias, gate)
        x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
        w_t = weight.t()
        tensors = call_signature(x2, w_t, bias)
        y = self._run_tuned(self.resolve(x2, w_t, bias, "none", tensors, gate=gate), x2, w_t, bias, None, tensors)
        if y is None:
            return torch_gated_linear(x, weight, bias, gate)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], n2 // 2)

    def linear(self, x, weight, bias=None, activation=None, residual=None):
        """`activation(x @ weight^T + bias)` (or `residual + x @ weight^T + bias`) for `l2c.nn.Linear` in eager
        mode, any leading dimensions.

        Where no tuned kernel serves the call, this is exactly what `torch.nn.Linear` runs (`F.linear`,
        one cuBLAS call with the bias fused) plus the activation; with a residual, torch.addmm adds it in the GEMM.
        """
        if self.serves_nothing and residual is None:
            return self._torch_linear(x, weight, bias, activation)
        native = self.native
        if native is not None and residual is None:   # the C++ call table: torch's fallback or a served plan
            code = 0 if activation is None else native_call.activation_code(activation)
            y = native.call_linear(x, weight, bias, code)
            if y is not None:
                return y
        if residual is not None:
            n = weight.shape[0]
            y = self._addmm(x.reshape(-1, x.shape[-1]), weight.t(), bias, activation, None, residual.reshape(-1, n))
            return y.reshape(*x.shape[:-1], n)
        if weight.ndim != 2 or not (weight.shape[1] and x.ndim) or \
                x.numel() // weight.shape[1] not in self.served_nk.get(x.dtype, NO_SHAPES)[weight.shape]:
            return self._torch_linear(x, weight, bias, activation)   # no entry for (N, K, M)
        n, k = weight.shape
        grad = _needs_grad(x, weight, bias)
        x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
        w_t = weight.t()
        tensors = call_signature(x2, w_t, bias)
        if not grad:   # served before for this signature: the launch and nothing else
            y = self._served_call(x2, w_t, bias, activation, tensors)
            if y is not None:
                return y if x.dim() == 2 else y.reshape(*x.shape[:-1], n)
        asked, activation = activation, check_activation(activation)
        if _graph_needs_torch(activation, None, x, weight, bias):
            return self._torch_linear(x, weight, bias, activation)
        kernel = self.resolve(x2, w_t, bias, activation, tensors)
        y = self._run_tuned(kernel, x2, w_t, bias, None, tensors, grad)
        if y is None:
            return activate(F.linear(x, weight, bias), activation)
        if not grad and tensors is not None:
            self._remember_served((tensors, asked), kernel, x2, w_t, bias)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], n)

    def _torch_linear(self, x, weight, bias, activation):
        """What torch.nn.Linear runs (F.linear, the bias fused) and then the activation: a fallback."""
        self.counts["fallback"] += 1
        y = F.linear(x, weight, bias)
        return y if activation is None else activate(y, check_activation(activation))

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until every kernel asked for so far is prepared (or failed); False on timeout."""
        return self.preparer.wait(timeout)


class _TunedMatmul(torch.autograd.Function):
    """`a @ b + bias` by a tuned kernel, differentiable: the gradients are GEMMs too, run by the dispatcher (a
    tuned kernel where the table serves their shapes, torch elsewhere)."""

    @staticmethod
    def forward(ctx, a, b, bias, kernel, tensors, dispatcher):
        # each operand only where the other's gradient needs it, as torch's mm saves them (a frozen weight's
        # activations are not kept, and changing them in place before the backward is no error)
        ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b if ctx.needs_input_grad[0] else None)
        ctx.has_bias = bias is not None
        ctx.dispatcher = dispatcher
        return kernel.call_planned(tensors, a, b, bias)

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        mm = ctx.dispatcher.matmul
        grad_a = mm(grad_out, b.mT) if ctx.needs_input_grad[0] else None
        grad_b = mm(a.mT, grad_out) if ctx.needs_input_grad[1] else None
        grad_bias = grad_out.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_a, grad_b, grad_bias, None, None, None


_default: Optional[Dispatcher] = None
_default_lock = threading.Lock()
_DISPATCHERS: "weakref.WeakSet[Dispatcher]" = weakref.WeakSet()


def _in_child() -> None:
    """A child forked from this process keeps every dispatcher and what it served, with new locks (a thread of the
    parent may have held one); its preparer forgets the jobs the parent's thread had not finished (l2c.prepare)."""
    global _default_lock
    _default_lock = threading.Lock()
    for dispatcher in list(_DISPATCHERS):
        dispatcher._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)


def serves_gpu(table: TunedTable, gpu: Optional[str]) -> bool:
    """Whether `table` may serve calls on `gpu` (None: unknown, then yes): it was measured on that GPU, names none,
    or the user named it (L2C_TUNED_TABLE)."""
    return gpu is None or table.gpu in (None, gpu) or bool(settings.value("L2C_TUNED_TABLE"))


class ArchTables(NamedTuple):
    """What the table for an arch gives this GPU: `serving` answers calls (None where the table cannot be read or
    was measured on another GPU); `candidates` is the table whose kernels online choice times (the table itself
    wherever it could be read: its kernels are built for the arch, and online choice measures them on this GPU)."""
    serving: Optional[TunedTable]
    candidates: Optional[TunedTable]


def table_for_arch(arch: str, gpu: Optional[str] = None, online: bool = False, strict: bool = False) -> ArchTables:
    """The table for `arch` (see default_table_path), with one warning when it cannot serve: l2c then runs torch
    rather than fail the caller. A shipped table measured on another GPU than `gpu` (an H100 or H20 is sm_90 as
    the H200 is, with other SM counts, bandwidth and cuBLAS kernels) serves no call, since its wins are that GPU's
    measurements; with `online` choice its kernels are still the candidates timed here. A table shipped for this
    GPU serves it, and online choice times the arch's table's kernels (all the shipped table's kernels: the GPU's
    table holds only those that won its measurements). A table named by L2C_TUNED_TABLE is used as it is.
    `strict`: a table that cannot be read raises TableError (a measurement's error) instead of the warning."""
    path = default_table_path(arch, gpu)
    if path is None:
        return ArchTables(None, None)
    try:
        table = load_table(path)
    except TableError as err:
        if strict:
            raise
        log.warning("l2c: %s; l2c.matmul runs torch", err)
        return ArchTables(None, None)
    if table.skipped:
        log.warning("l2c: %s: %d malformed entr%s skipped (first: %s)", path, table.skipped,
                    "y" if table.skipped == 1 else "ies", table.first_skipped)
    if not serves_gpu(table, gpu):
        if online:
            log.warning("l2c: the tuned table shipped for %s was measured on %s, not this %s: it serves no call; "
                        "online choice times its kernels on this GPU", arch, table.gpu, gpu)
        else:
            log.warning("l2c: the tuned table shipped for %s was measured on %s, not this %s: l2c.matmul runs "
                        "torch (L2C_TUNE=online times its kernels on this GPU; L2C_TUNED_TABLE=%s uses it as it is; "
                        "`l2c tune` or `l2c bench` + `l2c table` make one for this GPU)", arch, table.gpu, gpu, path)
        return ArchTables(None, table)
    general = shipped_table_path(arch) if online and not settings.value("L2C_TUNED_TABLE") else None
    if general is not None and general != path:
        try:
            return ArchTables(table, load_table(general))
        except TableError as err:
            if strict:
                raise
            log.warning("l2c: %s; online choice times the kernels of %s", err, path)
    return ArchTables(table, table)


def default_dispatcher() -> Dispatcher:
    """The process-wide dispatcher, loading the tuned table of the current GPU on first use."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                try:
                    mode = prepare_mode()
                except ValueError as err:
                    log.warning("l2c: %s; using background", err)
                    mode = "background"
                try:
                    settings.overlap()
                except ValueError as err:   # reported once here; every kernel then launches as by default
                    log.warning("l2c: %s; using measured", err)
                try:
                    online = tune_mode() == "online"
                    if online:
                        from .online import eager_margin, margin, tuned_targets
                        tuned_targets(), margin(), eager_margin()   # malformed settings are reported here, once
                except ValueError as err:
                    log.warning("l2c: %s; online tuning off", err)
                    online = False
                tables = ArchTables(None, None)
                if torch.cuda.is_available():
                    major, minor = torch.cuda.get_device_capability()
                    tables = table_for_arch(f"sm_{major}{minor}", torch.cuda.get_device_name(), online)
                _default = Dispatcher(tables.serving, prepare=mode, online=online,
                                      candidates=tables.candidates)
                background.mark("default dispatcher")
    return _default


def set_tuned_table(table: Optional[TunedTable], allow_cpu: bool = False, prepare: Optional[str] = None,
                    online: Optional[bool] = None, candidates: Optional[TunedTable] = None) -> Dispatcher:
    """Use `table` (or none: always torch, unless online tuning) from now on in this process; `candidates`: the
    table whose kernels online choice times, where not `table` (see Dispatcher)."""
    global _default
    settings.overlap()   # a malformed L2C_OVERLAP is refused when asked for explicitly (the default warns)
    dispatcher = Dispatcher(table, allow_cpu=allow_cpu, prepare=prepare, online=online, candidates=candidates)
    with _default_lock:   # after a default being made by the warm start, never before it
        _default = dispatcher
    return dispatcher


def precompile(fn, *args, timeout: Optional[float] = None, **kwargs):
    """Run `fn(*args, **kwargs)` (a model or any callable using l2c) once, wait until every tuned kernel it asked
    for is built and verified, and run it again so each is built in this process: later calls are served tuned
    from the first one. Returns the second call's result."""
    dispatcher = default_dispatcher()
    with torch.no_grad():
        fn(*args, **kwargs)
        if not dispatcher.wait(timeout):
            log.warning("l2c.precompile: kernels still being prepared after %s s", timeout)
        return fn(*args, **kwargs)


def _compile_front_end() -> None:
    """Build the .l2 parser, compile the kernel templates and take one spec through parse, validate and render for
    each target at import: the first call of a tuned signature parses its entry's spec and renders it (for the
    build key) before it can look up a prebuilt kernel, and the one-time costs (the parser, the templates, the
    lexer's regular expressions, compiled at a first parse, and the modules the stages import: 150 ms on a 2-core
    host) would otherwise land on that call."""
    from .grammar import lark_parser
    from .ir import KernelSpec
    from .lower import environment, render
    from .validate import validate
    lark_parser()
    env = environment()
    for name in env.list_templates(filter_func=lambda name: name.endswith(".j2")):
        env.get_template(name)
    spec = parse_one(KernelSpec(name="warm", epilogue_bias="col").to_l2(), file="<import>")
    for target in targets.TARGETS:
        try:
            render(validate(spec, target, "sm_90"))
        except L2Error:   # the warm-up spec not valid for a target: the first call pays that target's imports
            pass
    from . import build, verified  # noqa: F401 - imported here, not on a first call
    background.mark("front end")
    background.start(_start_up, "l2c-start-up")


BUILDERS_AFTER_S = 2.0   # the builders' imports wait this long at most for the first tuned call


def _start_up() -> None:
    """The start-up off the importing thread, in the order a first call of a prebuilt CUTLASS kernel (nearly every
    kernel of the shipped tables) needs it: `_prepare_first_call`; then, once the first tuned call has been resolved
    or BUILDERS_AFTER_S have passed, each target's toolchain and builder (`_query_toolchains`: Triton's import takes
    0.4-0.9 s on the H100's host; a first call served by a Triton kernel before then imports it itself); then, on a
    GPU, the pack's install. Measured on H100 machines (benchmarks/NOTES.md, "#19"): behind the imports, the first
    call waited 150-220 ms for its steps; beside them, up to 60 ms; with the imports running during the first call,
    that call's load took 40-55 ms instead of 31-38."""
    try:
        with background.fork_unsafe():
            _prepare_first_call()
    except Exception as err:  # noqa: BLE001 - a start-up step that fails leaves it to the first call, never a traceback
        log.warning("l2c: start-up stopped (%s: %s); first calls prepare themselves", type(err).__name__, err)
    if not background.after_first_call(BUILDERS_AFTER_S):
        return
    with background.fork_unsafe():   # the builders' imports (Triton's)
        _query_toolchains()
    if torch.cuda.is_available() and not background.exiting():
        try:
            from .targets.cutlass.build import install_pack
            with background.fork_unsafe():
                install_pack()
            background.mark("pack installed")
        except Exception as err:  # noqa: BLE001 - a first call loads its own library from the pack
            log.debug("l2c's pack install stopped: %s", err)


def _prepare_first_call() -> None:
    """What a first call of a prebuilt CUTLASS kernel waits for: CUTLASS's toolchain id (the kernel's build key),
    its call-plan shim (a C compile of about 0.2 s, once per machine) and, on a GPU, `_warm_start`."""
    from .targets.cutlass import shim
    try:
        targets.get("cutlass").toolchain_id()
    except Exception:  # noqa: BLE001 - the build reports it where it matters
        pass
    if background.exiting():
        return
    shim.shim_library()
    background.mark("call-plan shim")
    if torch.cuda.is_available() and not background.exiting():
        _warm_start()


def _query_toolchains() -> None:
    """Each target's toolchain id (nvcc's version: a subprocess of some 20-50 ms), asked once off the calling
    thread so that the first tuned call finds it cached, and each target's builder imported, its large shared
    libraries read ahead first (`background.read_ahead`): done later they land on a first call (380 ms against 40-50
    on the H200 when they followed the warm start). A toolchain that is missing or broken is the build's concern.
    Each step is skipped once the program is ending (l2c.background)."""
    import importlib
    for name in targets.TARGETS:
        if background.exiting():
            return
        try:
            target = targets.get(name)
            libraries = target.native_libraries()
            if libraries:   # read first, so that the import's dlopen does not read them from disk
                background.read_ahead(libraries)
                background.mark(f"{name} libraries read")
            target.toolchain_id()
            importlib.import_module(f"{targets.__name__}.{name}.build")   # the builder a first tuned call loads
        except Exception:  # noqa: BLE001 - the build reports it where it matters
            pass
        background.mark(f"{name} toolchain and builder")


def _warm_start() -> None:
    """On a GPU, what a first tuned call would otherwise do on the caller's thread: the default dispatcher made (its
    table read: 30-70 ms on the H100's host), the GPU's identity read for its verification records and l2c's checker
    loaded (`l2c.checker`: from the pack, else compiled once per machine). Failures are the first call's concern,
    reported there."""
    try:
        dispatcher = default_dispatcher()
        if dispatcher.table is not None:
            dispatcher._verified_kernels()
        background.mark("verification records")
        if background.exiting():   # the program ends: the checker's compile can wait
            return
        from . import checker
        checker.prepare()
        background.mark("checker")
    except Exception as err:  # noqa: BLE001
        log.debug("l2c's warm start stopped: %s", err)


_compile_front_end()
