"""The Triton target's builder: render the module, store it in the cache by content hash, import it.

Triton JIT-compiles on the first call (and caches the binary itself), so "building" here means producing
an importable, syntactically valid module whose `launch` is the kernel. The module lives in a real file
because Triton reads a kernel's source through `inspect`.

The eager call path: Triton's JIT dispatch (binding, specialization key, cache lookup) costs a Python-level
overhead on every launch that, on a slow host, is more than a small kernel takes. A call of a signature
seen before therefore replays the launches of its first, fully checked call straight into the compiled
kernels' launchers — the same `run(...)` Triton's own dispatch ends in (Triton 3.4 to 3.9 call it alike) —
after checking only what can change between such calls (pointers' 16-byte alignment, which Triton specializes
on, and the current device). On by default: on the H200 a planned call costs what torch.matmul's does
(scripts/call_overhead.py, checked by scripts/gpu_check.py; benchmarks/NOTES.md); L2C_TRITON_PLANS=0 turns it off.
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import triton

from ... import settings
from ... import cache
from ...errors import BuildError
from ...kernel import Kernel, call_signature, cuda_accessors, output_template
from ...lower import render
from ...rules import ValidSpec


PLANS = (settings.value("L2C_TRITON_PLANS") or "1") != "0"
_KNOBS = getattr(triton, "knobs", None)   # Triton >= 3.4: where its launch hooks live (a profiler sets them)
try:   # host-side TMA descriptors (`launch loads=tma` kernels take A and B as these)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:   # Triton < 3.4
    TensorDescriptor = None
_get_device, _get_stream = cuda_accessors()


class TritonKernel(Kernel):
    target = "triton"

    def __init__(self, valid: ValidSpec, source: str, module, path):
        super().__init__(valid, source)
        self.module = module
        self.path = path
        self._module_launch = module.launch
        self._plans: Dict[tuple, Optional[_LaunchPlan]] = {}   # call signature -> plan (None: not replayable)
        self.plan_refusals: Dict[tuple, str] = {}               # call signature -> why it has no plan

    def __call__(self, a, b, c=None, bias=None, out=None):
        """Launch on the current stream. A call that allocates its output (`out` and `c` None) on a CUDA
        device replays the plan of the first call of its signature (see the module doc); every other call,
        and any call while a Triton launch hook is set, goes through the module's checked `launch`."""
        if out is not None or c is not None:
            return self._launch(a, b, c, bias, out)
        return self.call_planned(call_signature(a, b, bias), a, b, bias)

    def _launch(self, a, b, c, bias, out):
        """The module's checked launch on a's device: Triton launches on the current device and its stream, so a call
        on another device's tensors runs with that device made current, as torch's own ops do."""
        if getattr(a, "is_cuda", False) and a.get_device() != _get_device():
            with torch.cuda.device(a.device):
                return self._module_launch(a, b, c, bias, out)
        return self._module_launch(a, b, c, bias, out)

    def call_planned(self, key, a, b, bias=None):
        """The allocating call with its call signature `key` already computed (see Kernel.call_planned)."""
        if not PLANS or _KNOBS is None or launch_hook_set() or not getattr(a, "is_cuda", False):
            return self._launch(a, b, None, bias, None)
        plan = self._plans.get(key)
        if plan is not None:
            pbias = bias.data_ptr() if bias is not None else 0
            if not ((a.data_ptr() | b.data_ptr() | pbias) & 15) and _get_device() == plan.device:
                return plan.replay(a, b, bias, _get_stream(plan.device))
        if a.get_device() != _get_device():   # planned and launched with a's device current (see `_launch`)
            with torch.cuda.device(a.device):
                return self.call_planned(key, a, b, bias)
        return self._planning_call(key, a, b, bias)

    def launcher(self, key):
        """The launch plan of signature `key` as one closure (see Kernel.launcher); None without a plan. A launch
        hook set later (a profiler) still sends each call through Triton's launch, as `call_planned` does."""
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            return None
        replay, device, fallback = plan.replay, plan.device, self._launch

        def launch(a, b, bias):
            if launch_hook_set():
                return fallback(a, b, None, bias, None)
            pbias = bias.data_ptr() if bias is not None else 0
            if (a.data_ptr() | b.data_ptr() | pbias) & 15 or _get_device() != device:
                return None
            return replay(a, b, bias, _get_stream(device))
        return launch

    def _planning_call(self, key, a, b, bias):
        """The checked launch of an allocating call, making the plan of its signature for later calls."""
        out, zero, launches = self.module.prepare(a, b, None, bias, None)
        if zero is not None:
            zero.zero_()
        compiled = [kernel[grid](*args, **meta) for kernel, grid, args, meta in launches]
        if key is not None and key not in self._plans and self.spec.split_k_slices > 1:
            self._plans[key] = None   # its workspace is allocated per call (templates/triton/common.j2)
            self.plan_refusals[key] = "split-K takes a workspace of its own per call"
        if key is not None and key not in self._plans:
            try:
                self._plans[key] = _LaunchPlan.make(a, b, bias, out, zero, launches, compiled,
                                                    transposed=self.spec.layout_c == "col",
                                                    setup=getattr(self.module, "_ensure_scratch_allocator", None))
            except _NotReplayable as why:
                self._plans[key] = None
                self.plan_refusals[key] = str(why)
        return out


def launch_hook_set() -> bool:
    """Whether a Triton launch hook (a profiler's) is set: a replayed launch would skip it. Triton >= 3.5 holds
    the hooks in a HookChain that is never None (empty when none is set, so a test against None alone would
    turn plans off for good); older versions hold one callable or None."""
    runtime = _KNOBS.runtime
    return any(hook is not None and bool(getattr(hook, "calls", True))
               for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook))


class _NotReplayable(Exception):
    """Why a checked call's launches cannot be replayed; that signature keeps the JIT path."""


@dataclass(frozen=True)
class _Launch:
    """One replayable launch: Triton's compiled launcher and its arguments, with the call's tensors left as
    slots: `slots` pairs a position in `arguments` with an index into (a, b, bias, out); `descriptor_slots` the
    same for TMA descriptors, replayed as the first call's descriptor over the new call's tensor."""
    run: object
    function: object
    packed_metadata: object
    grid: Tuple[int, int, int]
    arguments: Tuple
    slots: Tuple[Tuple[int, int], ...]
    descriptor_slots: Tuple[Tuple[int, int], ...] = ()


@dataclass(frozen=True)
class _LaunchPlan:
    """The launches of one checked call, with every argument but the call's own tensors fixed."""
    device: int
    out_shape: Tuple[int, ...]      # as allocated (transposed back when `transposed`)
    out_dtype: object
    transposed: bool
    zero: object                     # workspace view cleared before the launches, or None
    launches: Tuple[_Launch, ...]
    out_template: object             # kernel.output_template of the output as allocated: its allocation per call
    setup: object = None             # called before the launches (a `tma_device` module installs its allocator)

    @staticmethod
    def make(a, b, bias, out, zero, launches, compiled, transposed: bool, setup=None) -> "_LaunchPlan":
        """Raises _NotReplayable when a launch cannot be replayed: a pointer Triton specialized as unaligned, or
        a compiled kernel without the launcher interface (another Triton version): those calls keep the JIT path."""
        roles = {id(a): 0, id(b): 1, id(out): 3}
        if bias is not None:
            roles[id(bias)] = 2
        if len(roles) != 3 + (bias is not None):   # a later call's operands need not coincide
            raise _NotReplayable("one tensor passed as two operands")
        replays = []
        for (kernel, grid, args, meta), ck in zip(launches, compiled):
            names = getattr(kernel, "arg_names", None)
            if names is None:
                raise _NotReplayable(f"{type(kernel).__name__} has no arg_names")
            missing = [x for x in ("run", "function", "packed_metadata") if not hasattr(ck, x)]
            if missing:
                raise _NotReplayable(f"the compiled kernel ({type(ck).__name__}) has no {', '.join(missing)}")
            unpassed = [x for x in names[len(args):] if x not in meta]
            if unpassed or any(x in meta for x in names[:len(args)]):
                raise _NotReplayable(f"arguments passed other than by position + constexprs: {unpassed} of {names}")
            arguments, slots, descriptor_slots = [], [], []
            for i, x in enumerate(args):
                if TensorDescriptor is not None and isinstance(x, TensorDescriptor):
                    if id(x.base) not in roles:
                        raise _NotReplayable(f"argument {i} describes a tensor that is not an operand")
                    # the same shape, strides and block over a later call's tensor (same signature)
                    descriptor_slots.append((i, roles[id(x.base)]))
                    x = copy.copy(x)   # checked once, in the first call; hold no reference to its tensor
                    x.base = None
                elif isinstance(x, torch.Tensor):
                    if x.data_ptr() & 15:
                        raise _NotReplayable(f"argument {i} is not 16-byte aligned")
                    if id(x) in roles:   # a slot: hold no reference to this call's tensor
                        slots.append((i, roles[id(x)]))
                        x = None
                arguments.append(x)
            arguments.extend(meta[x] for x in names[len(args):])
            grid = tuple(grid) + (1,) * (3 - len(grid))
            replays.append(_Launch(ck.run, ck.function, ck.packed_metadata, grid, tuple(arguments), tuple(slots),
                                   tuple(descriptor_slots)))
        stored = tuple(out.mT.shape) if transposed else tuple(out.shape)
        return _LaunchPlan(device=a.get_device(), out_shape=stored, out_dtype=out.dtype, transposed=transposed,
                           zero=zero, launches=tuple(replays),
                           out_template=output_template(stored, out.dtype, a.device), setup=setup)

    def replay(self, a, b, bias, stream):
        out = torch.empty_like(self.out_template)
        if self.transposed:
            out = out.transpose(-1, -2)
        tensors = (a, b, bias, out)
        if self.setup is not None:
            self.setup()
        if self.zero is not None:
            self.zero.zero_()
        for launch in self.launches:
            arguments = list(launch.arguments)
            for position, index in launch.slots:
                arguments[position] = tensors[index]
            for position, index in launch.descriptor_slots:
                descriptor = copy.copy(arguments[position])
                descriptor.base = tensors[index]
                arguments[position] = descriptor
            gx, gy, gz = launch.grid
            launch.run(gx, gy, gz, stream, launch.function, launch.packed_metadata, None, None, None, *arguments)
        return out


def load_module(source: str, name: str):
    """Write `source` into the cache (keyed by content and Triton version) and import it; return (module, path).
    A cached file whose content is not `source` (edited or damaged on disk) is rewritten before the import."""
    digest = cache.content_hash(source, "triton", triton.__version__)[:24]
    path = cache.cache_dir("triton") / f"{name}_{digest}.py"
    try:
        compile(source, str(path), "exec")
    except SyntaxError as err:
        raise BuildError(f"generated Triton module for {name} does not compile: {err}") from err
    # The file is imported only with the content its name hashes: one edited or damaged on disk is rewritten. A file
    # already right is read without the lock (writes are atomic renames), so a read-only cache serves its modules.
    if _read_or_none(path) != source:
        with cache.locked(path):
            if _read_or_none(path) != source:
                cache.write_atomic(path, source)
    module_name = f"l2c_triton_{name}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name], path
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise BuildError(f"importing the generated Triton module {path} failed: {type(err).__name__}: {err}") from err
    missing = [f for f in ("launch", "prepare") if not callable(getattr(module, f, None))]
    if missing:
        del sys.modules[module_name]
        raise BuildError(f"the generated Triton module {path} has no {'() or '.join(missing)}()")
    return module, path


def _read_or_none(path) -> Optional[str]:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def build_triton(valid: ValidSpec) -> TritonKernel:
    if valid.target != "triton":
        raise BuildError(f"{valid.name} was validated for {valid.target}, not triton")
    source = render(valid)
    module, path = load_module(source, valid.name)
    return TritonKernel(valid, source, module, path)


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1): nothing to compile ahead then."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_SIGNATURE_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int32: "i32"}


def compile_ahead(kernel: TritonKernel) -> Dict[str, int]:
    """Compile every kernel one call of `kernel` launches with Triton's own compiler for its arch, without a GPU,
    and return each one's cubin size; raise BuildError with the compiler's message if one does not compile.

    The Triton interpreter (the CPU tests) checks what a kernel computes but not what the GPU compiler accepts:
    a loop variable retyped inside a branch runs in the interpreter and does not compile for the GPU. The launches
    come from `prepare` on small CPU tensors of the spec's types and layouts; the compiled variant is the
    unspecialized one (no divisibility hints), which is enough to find what does not compile.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from ...verify import make_inputs
    arch = kernel.valid.arch.name
    if not arch.startswith("sm_") or not arch[3:5].isdigit():
        raise BuildError(f"cannot compile Triton kernels ahead of time for {arch!r}")
    spec = kernel.valid.spec
    dims = [64 if d == "any" else d for d in (spec.problem_m, spec.problem_n, spec.problem_k)]
    batch = 2 if spec.problem_batch == "any" else spec.problem_batch
    a, b, c, bias, _ = make_inputs(spec, *dims, batch, "cpu", torch.Generator().manual_seed(0))
    try:
        _, _, launches = kernel.module.prepare(a, b, c, bias)
    except ValueError as err:
        raise BuildError(f"{kernel.valid.name}: cannot describe a launch to compile ahead: {err}") from err
    sizes = {}
    for jit, grid, args, meta in launches:
        if not isinstance(jit, triton.runtime.JITFunction):
            raise BuildError(f"{kernel.valid.name}: compiling ahead needs Triton's JIT functions "
                             "(unset TRITON_INTERPRET)")
        signature, constexprs = {}, {}
        for name, x in zip(jit.arg_names, args):
            if isinstance(x, torch.Tensor):
                signature[name] = "*" + _SIGNATURE_DTYPES[x.dtype]
            elif TensorDescriptor is not None and isinstance(x, TensorDescriptor):
                signature[name] = f"tensordesc<{_SIGNATURE_DTYPES[x.base.dtype]}{list(x.block_shape)}>"
            elif isinstance(x, float):
                signature[name] = "fp32"
            else:
                signature[name] = "i32" if -2 ** 31 <= x < 2 ** 31 else "i64"
        for name in jit.arg_names[len(args):]:
            signature[name] = "constexpr"
            constexprs[name] = meta[name]
        options = {k: meta[k] for k in ("num_warps", "num_stages") if k in meta}
        try:
            with _this_thread_quiet():   # on a ptxas failure Triton prints the whole PTX; its error says what failed
                compiled = triton.compile(ASTSource(jit, signature, constexprs),
                                          target=GPUTarget("cuda", int(arch[3:5]), 32), options=options)
        except Exception as err:   # Triton's CompilationError and the backends' errors: the message is the point
            raise BuildError(f"{kernel.valid.name}: Triton cannot compile {jit.__name__} for {arch}: "
                             f"{type(err).__name__}: {err}") from err
        shared, limit = compiled.metadata.shared, kernel.valid.arch.smem_per_block
        if shared > limit:   # Triton would refuse every launch (OutOfResources)
            raise BuildError(f"{kernel.valid.name}: {jit.__name__} needs {shared} bytes of shared memory, more than "
                             f"the {limit} a block of {arch} may use")
        sizes[jit.__name__] = len(compiled.asm.get("cubin", b""))
    return sizes


class _QuietThreads:
    """sys.stdout while some thread compiles: what a muted thread writes is dropped, every other thread's passes
    (`l2c build` compiles in threads that print their progress). Where other code swapped sys.stdout meanwhile and
    puts this object back later, it stays, passing everything through."""

    def __init__(self, stream):
        self.stream, self.muted = stream, {}

    def write(self, text):
        if threading.get_ident() in self.muted or self.stream is None:   # (print writes nothing to a None stdout)
            return len(text)
        return self.stream.write(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        if self.stream is not None:
            self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


_quiet_lock = threading.Lock()
# every proxy ever installed, kept alive for the process: CPython's print holds sys.stdout by a borrowed reference
# while it writes, so a proxy freed when sys.stdout is set back could be written to after its release (a crash)
_quiet_proxies: list = []


@contextlib.contextmanager
def _this_thread_quiet():
    me = threading.get_ident()
    with _quiet_lock:
        if not isinstance(sys.stdout, _QuietThreads):
            _quiet_proxies.append(_QuietThreads(sys.stdout))
            sys.stdout = _quiet_proxies[-1]
        quiet = sys.stdout
        quiet.muted[me] = quiet.muted.get(me, 0) + 1
    try:
        yield
    finally:
        with _quiet_lock:
            quiet.muted[me] -= 1
            if not quiet.muted[me]:
                del quiet.muted[me]
            if not quiet.muted and sys.stdout is quiet:
                sys.stdout = quiet.stream
