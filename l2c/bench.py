"""`l2c bench`: measure kernels against torch.matmul on a shape set and write one JSON line per result.

Candidates come from `.l2` spec files (every kernel in the file, for each target it validates for), from
tuned tables (docs/CONTRACTS.md; each entry measured on its own shape), `torch` (torch.matmul against
itself: the noise floor of the protocol), or what users call: `dispatch[:TABLE]` (`l2c.matmul` through a
dispatcher with that table, the shipped one by default) and `linear[:TABLE]` (`l2c.nn.Linear`'s path, the
weight being B transposed). Those two are measured after the dispatcher has prepared the call's kernel, as a
warmed-up process meets it, and each row says what served the call (`served_by`). A shape-generic spec (`problem m=any ...`) is built once and
measured on every shape of the set; a spec with fixed dims only on its own shape.

Each (kernel, shape) is verified before it is timed; a failure is recorded, never timed. The results
file starts with an environment row (`"type": "env"`); then one `"type": "result"` row per
shape x kernel x protocol, written and flushed as it completes, so an interrupted run loses nothing and
`resume=True` skips the rows already there.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import lzma
import math
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, TextIO, Tuple

from .shapes import Shape, bucket

CPU_NOTE = ("CPU mode: kernels run in the Triton interpreter and torch on the CPU; these figures exercise the "
            "benchmark machinery only and say nothing about GPU performance")
FAILED = ("invalid", "build_failed", "verify_failed", "error")


class BenchError(Exception):
    """A problem with what `l2c bench` was asked to do (no GPU, nothing to measure, bad table)."""


# --------------------------------------------------------------------------------------------- candidates

@dataclass
class Candidate:
    """One kernel to measure. `shapes` None: shape-generic, measured on the whole set."""
    id: str                                 # stable across runs: the resume key
    source: str
    target: str                             # triton | cutlass | torch
    spec: object = None                     # KernelSpec, None for torch
    valid: object = None                    # ValidSpec
    shapes: Optional[List[Shape]] = None
    failure: Optional[Tuple[str, str]] = None   # (status, reason) when it cannot run at all
    _kernel: object = field(default=None, repr=False)

    def accepts(self, shape: Shape) -> bool:
        """Whether the spec's fixed problem dims (if any) match `shape`; `any` matches everything."""
        if self.spec is None:
            return True
        from .knobs import ANY
        for dim, value in (("m", shape.m), ("n", shape.n), ("k", shape.k), ("batch", shape.batch)):
            fixed = getattr(self.spec, f"problem_{dim}")
            if fixed != ANY and int(fixed) != value:
                return False
        return True

    @property
    def name(self) -> str:
        return self.spec.name if self.spec is not None else "torch.matmul"

    def kernel(self):
        """The built kernel (built on first use, then reused for every shape: compile once, measure many)."""
        if self._kernel is None and self.failure is None:
            from .build import build  # lazily: build pulls in the Triton / nvcc toolchains
            try:
                self._kernel = build(self.valid)
            except Exception as err:  # noqa: BLE001 - a build failure is a failed candidate, not a crash
                self.failure = ("build_failed", f"{type(err).__name__}: {err}")
        return self._kernel


def _spec_candidates(path: str, target: str, arch: str) -> List[Candidate]:
    from .errors import L2Error
    from .parser import parse_file
    from .validate import targets_for, validate

    out = []
    for spec in parse_file(path):
        targets = targets_for(spec) if target == "all" else (target,)
        for t in targets:
            cand = Candidate(id=f"{path}:{spec.name}@{t}", source=path, target=t, spec=spec)
            try:
                cand.valid = validate(spec, t, arch)
            except L2Error as err:
                cand.failure = ("invalid", err.render())
            fixed = spec.fixed_shape
            if fixed is not None:
                batch = 1 if spec.problem_batch == "any" else int(spec.problem_batch)
                cand.shapes = [Shape(*fixed, batch=batch, label="spec")]
            out.append(cand)
    return out


def _table_candidates(path: str, arch: str) -> List[Candidate]:
    from .errors import L2Error
    from .parser import parse_one
    from .validate import validate

    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise BenchError(f"{path}: cannot read tuned table: {err}") from None
    entries = table.get("entries") if isinstance(table, dict) else None
    if not isinstance(entries, list):
        raise BenchError(f"{path}: not a tuned table (no 'entries' list; see docs/CONTRACTS.md)")
    table_arch = table.get("arch", arch)
    out = []
    for i, entry in enumerate(entries):
        where = f"{path}#entries[{i}]"
        try:
            shape = Shape(int(entry["m"]), int(entry["n"]), int(entry["k"]), int(entry.get("batch", 1)),
                          label="table")
            spec_text, target = entry["spec"], entry["target"]
        except (KeyError, TypeError, ValueError) as err:
            raise BenchError(f"{where}: malformed entry ({err!r})") from None
        spec = parse_one(spec_text, file=where)
        cand = Candidate(id=f"{path}#{i}:{spec.name}@{target}", source=path, target=target, spec=spec,
                         shapes=[shape])
        try:
            cand.valid = validate(spec, target, table_arch)
        except L2Error as err:
            cand.failure = ("invalid", err.render())
        out.append(cand)
    return out


class DispatchKernel:
    """`l2c.matmul` (or `l2c.nn.Linear`'s path) with one dispatcher, behind the Kernel call convention so that it
    is verified and timed like any candidate. It allocates its output as users' calls do (`writes_out` False:
    the protocols then let both sides allocate), and `linear` is timed against what torch.nn.Linear runs
    (F.linear), `matmul` against torch.matmul."""
    writes_out = False

    def __init__(self, spec, table_path: Optional[str], via: str, arch: str):
        from types import SimpleNamespace
        from .dispatch import Dispatcher, default_table_path
        from .tuned_table import TableError, load_table
        path = table_path or default_table_path(arch)
        try:
            table = load_table(path) if path is not None else None
        except TableError as err:
            raise BenchError(str(err)) from None
        self.table_path = str(path) if path is not None else None
        self.dispatcher = Dispatcher(table, allow_cpu=True, prepare="background")
        self.valid = SimpleNamespace(spec=spec, name=f"{via}[{self.table_path}]")
        self.via = via
        self.activation = None if spec.epilogue_activation == "none" else spec.epilogue_activation
        self.torch_baseline = via

    def __call__(self, a, b, c=None, bias=None, out=None):
        if self.via == "linear":
            y = self.dispatcher.linear(a, b.t(), bias, self.activation)
        else:
            y = self.dispatcher.matmul(a, b, bias=bias, activation=self.activation)
        if out is not None:
            out.copy_(y)
            return out
        return y

    def prime(self, shape: Shape, device, timeout: float = 900.0) -> str:
        """Call once on this shape, let the dispatcher prepare the kernel it serves, call again; return what
        serves the call from now on (the kernel's name, or `torch`)."""
        import torch
        from .verify import make_inputs
        gen = torch.Generator(device=device.torch_device).manual_seed(0)
        a, b, _, bias, _ = make_inputs(self.valid.spec, shape.m, shape.n, shape.k, 1, device.torch_device, gen)
        self(a, b, bias=bias)
        self.dispatcher.wait(timeout)
        self(a, b, bias=bias)
        kernel = self.dispatcher.resolve(a, b, bias, self.activation or "none")
        return "torch" if kernel is None else kernel.valid.name


def _user_spec(dtype: str, layout: str):
    """The types and layouts a torch or dispatch candidate is measured with (no kernel knobs)."""
    from .ir import KernelSpec
    la, lb, lc = layout.split(",")
    return KernelSpec(name="user_call", types_a=dtype, types_b=dtype, types_c=dtype, layout_a=la, layout_b=lb,
                      layout_c=lc)


def load_candidates(paths: Iterable[str], target: str = "all", arch: str = "sm_90", dtype: str = "f16",
                    layout: str = "row,row,row") -> List[Candidate]:
    """Candidates from `.l2` files, tuned-table `.json` files, `torch`, `dispatch[:TABLE]` and `linear[:TABLE]`
    (those three measured in `dtype` and `layout`)."""
    out: List[Candidate] = []
    for p in paths:
        via = p.split(":", 1)[0]
        if p == "torch":
            spec = None if (dtype, layout) == ("f16", "row,row,row") else _user_spec(dtype, layout)
            out.append(Candidate(id="torch", source="torch", target="torch", spec=spec))
        elif via in ("dispatch", "linear"):
            table = p.split(":", 1)[1] if ":" in p else None
            spec = _user_spec(dtype, layout)
            if via == "linear" and spec.layout_c != "row":
                raise BenchError("linear: nn.Linear writes a row-major output (layout c=row)")
            kernel = DispatchKernel(spec, table, via, arch)
            cand = Candidate(id=f"{via}:{kernel.table_path}", source=kernel.table_path or "no table",
                             target="dispatch", spec=spec, valid=kernel.valid)
            cand._kernel = kernel
            out.append(cand)
        elif p.endswith(".json"):
            out.extend(_table_candidates(p, arch))
        else:
            if not Path(p).exists():
                raise BenchError(f"{p}: no such file")
            out.extend(_spec_candidates(p, target, arch))
    if not out:
        raise BenchError("nothing to measure: give .l2 spec files, tuned-table .json files or `torch`")
    return out


def plan(candidates: List[Candidate], shape_set: Optional[List[Shape]]) -> Tuple[List[Shape], Dict, int]:
    """Shapes in measuring order and, per shape key, the candidates to run there; plus how many fixed-shape
    candidates were left out because their shape is not in the given set."""
    in_set = None if shape_set is None else {s.key for s in shape_set}
    jobs: Dict[Tuple[int, int, int, int], List[Candidate]] = {}
    shapes: Dict[Tuple[int, int, int, int], Shape] = {}
    skipped = 0
    if shape_set is not None:
        for s in shape_set:
            shapes.setdefault(s.key, s)
    for cand in candidates:
        if cand.shapes is None:
            if shape_set is None:
                raise BenchError(f"{cand.id} is shape-generic (problem m/n/k = any): give --shapes")
            targets = [s for s in shape_set if cand.accepts(s)]
        else:
            targets = [s for s in cand.shapes if in_set is None or s.key in in_set]
            skipped += len(cand.shapes) - len(targets)
        for s in targets:
            shapes.setdefault(s.key, s)
            jobs.setdefault(s.key, []).append(cand)
    ordered = [shapes[k] for k in shapes if k in jobs]
    return ordered, jobs, skipped


# --------------------------------------------------------------------------------------------- environment

def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def driver_version() -> Optional[str]:
    """The NVIDIA driver's version (nvidia-smi), or None where there is none."""
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else None


def environment(device, protocols: List[str], command: str, settings: Dict[str, object]) -> Dict[str, object]:
    """The header row every results file carries (BENCHMARKING.md: what to record with every result)."""
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        triton_version = None
    row: Dict[str, object] = {
        "type": "env", "device": device.kind, "gpu": device.name,
        "driver": driver_version() if device.kind == "cuda" else None,
        "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton_version,
        "cutlass": _version("nvidia-cutlass"), "python": platform.python_version(),
        "protocols": protocols, "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(), "cwd": os.getcwd(), "settings": settings,
        # how l2c built the Triton kernels measured here (the spec texts do not say)
        "build_settings": {name: os.environ[name] for name in sorted(os.environ) if name.startswith("L2C_TRITON_")},
    }
    if device.kind == "cuda":
        props = torch.cuda.get_device_properties(device.torch_device)
        row.update(sm=f"sm_{props.major}{props.minor}", sm_count=props.multi_processor_count,
                   l2_bytes=device.l2_bytes)
    else:
        row["note"] = CPU_NOTE
        row["triton_interpret"] = os.environ.get("TRITON_INTERPRET")
    return row


# --------------------------------------------------------------------------------------------- results file

def row_key(row: Dict[str, object]) -> Tuple:
    return (row["kernel"], row["m"], row["n"], row["k"], row.get("batch", 1), row["protocol"])


def read_rows(path: str | Path, repair: bool = False) -> List[Dict[str, object]]:
    """All complete JSON rows of a results file. A torn last line (a run killed mid-write) is ignored, and
    with `repair` cut off so that appending continues on a clean line. A bad line elsewhere is an error.
    A `.xz` file (a large finished results file, compressed to keep the repository small) is read through lzma."""
    path = Path(path)
    if path.suffix == ".xz":
        if repair:
            raise BenchError(f"{path} is compressed: results are appended to a plain .jsonl (decompress it first)")
        try:
            data = lzma.decompress(path.read_bytes())
        except lzma.LZMAError as err:
            raise BenchError(f"{path}: not an xz file ({err})") from None
    else:
        data = path.read_bytes()
    rows, good_end, pos = [], 0, 0
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        end = pos + len(line) + 1
        if line.strip():
            try:
                rows.append(json.loads(line))
                good_end = min(end, len(data))
            except ValueError:
                if i < len(lines) - 1 and any(x.strip() for x in lines[i + 1:]):
                    raise BenchError(f"{path}:{i + 1}: not a JSON row") from None
                break
        else:
            good_end = min(end, len(data))
        pos = end
    if repair and good_end < len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    if repair and good_end > 0 and not data[:good_end].endswith(b"\n"):
        with open(path, "ab") as f:
            f.write(b"\n")
    return rows


class ResultsWriter:
    """Appends JSON rows, each written whole and flushed at once."""

    def __init__(self, path: Path, resume: bool):
        self.path = path
        self.done: Set[Tuple] = set()
        if path.suffix == ".xz":
            raise BenchError(f"{path}: results are written to a plain .jsonl (compress it with xz when it is done)")
        if path.exists() and path.stat().st_size > 0:
            if not resume:
                raise BenchError(f"{path} already exists: pass --resume to continue it, or choose another -o")
            self.done = {row_key(r) for r in read_rows(path, repair=True) if r.get("type") == "result"}
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f: TextIO = open(path, "a")

    def write(self, row: Dict[str, object]) -> None:
        self.f.write(json.dumps(row, allow_nan=True) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


# --------------------------------------------------------------------------------------------- progress

class Progress:
    """Shapes done, elapsed and ETA on stderr, at most every `every` seconds. The ETA weighs each shape
    by a fixed cost plus its FLOPs (large shapes take longer), which is only an estimate."""

    def __init__(self, shapes: List[Shape], out: TextIO = sys.stderr, every: float = 2.0):
        self.weights = {s.key: 1.0 + s.flops / 2e12 for s in shapes}
        self.total_w = sum(self.weights.values())
        self.total, self.done, self.done_w = len(shapes), 0, 0.0
        self.out, self.every = out, every
        self.start = time.monotonic()
        self.last = -math.inf

    def step(self, shape: Shape, force: bool = False) -> None:
        self.done += 1
        self.done_w += self.weights[shape.key]
        now = time.monotonic()
        if force or now - self.last >= self.every or self.done == self.total:
            self.last = now
            elapsed = now - self.start
            frac = self.done_w / self.total_w if self.total_w else 1.0
            eta = elapsed * (1 - frac) / frac if frac > 0 else float("nan")
            print(f"l2c bench: {self.done}/{self.total} shapes ({100 * self.done / self.total:.0f}%), "
                  f"elapsed {_hms(elapsed)}, ETA {_hms(eta)} (last {shape})", file=self.out, flush=True)


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


# --------------------------------------------------------------------------------------------- running

@dataclass
class Settings:
    protocols: List[str]
    reps: int = 10
    iters: int = 20
    warmup: int = 3
    rate: float = 100.0
    seed: int = 0
    graphs: bool = True
    rotate: bool = True
    warmup_s: float = 0.0
    roofline: bool = False    # cold operands (each call reads them from HBM) and each row's fraction of roofline

    def as_dict(self) -> Dict[str, object]:
        return dict(self.__dict__)


def _base_row(cand: Candidate, shape: Shape, protocol: str, device) -> Dict[str, object]:
    spec = cand.spec
    row = {
        "type": "result", "kernel": cand.id, "name": cand.name, "source": cand.source, "target": cand.target,
        "m": shape.m, "n": shape.n, "k": shape.k, "batch": shape.batch, "shape_label": shape.label,
        "flops": shape.flops, "bucket": bucket(shape.flops), "protocol": protocol, "device": device.kind,
        "dtype": spec.types_a if spec is not None else "f16",
        "layout": f"{spec.layout_a},{spec.layout_b},{spec.layout_c}" if spec is not None else "row,row,row",
    }
    if spec is not None and spec.epilogue_gate != "none":   # a gated problem: B has 2N columns, twice the FLOPs
        row.update(gate=spec.epilogue_gate, flops=2 * shape.flops, bucket=bucket(2 * shape.flops))
    if spec is not None and cand.target in ("triton", "cutlass") and not str(cand.source).endswith((".l2", ".json")):
        row["spec"] = spec.to_l2()    # a generated candidate: no file holds its text (l2c table reads it here)
    return row


def _problem(cand: Candidate, shape: Shape):
    from .measure import Problem
    if cand.spec is None:
        return Problem(shape.m, shape.n, shape.k, shape.batch)
    return Problem.from_spec(cand.spec, shape.m, shape.n, shape.k, shape.batch)


def _verify(cand: Candidate, shape: Shape, device, seed: int) -> Tuple[Optional[str], Dict[str, object]]:
    """(failure status or None, fields for the row). Any exception while verifying is a failure."""
    if cand.target == "torch":
        return None, {"verified": "baseline"}
    kernel = cand.kernel()
    if cand.failure is not None:
        return cand.failure[0], {"reason": cand.failure[1]}
    served = {}
    if hasattr(kernel, "prime"):
        served = {"served_by": kernel.prime(shape, device)}
    from .verify import verify
    try:
        res = verify(kernel, shape.m, shape.n, shape.k, batch=shape.batch, device=device.torch_device.type,
                     seed=seed)
    except Exception as err:  # noqa: BLE001 - e.g. a CUTLASS kernel refusing an unaligned shape
        return "verify_failed", {"reason": f"{type(err).__name__}: {err}"}
    fields = {"rel_error": _num(getattr(res, "rel_error", None)), "tolerance": _num(getattr(res, "tolerance", None)),
              **served}
    if not res.ok:
        fields["reason"] = getattr(res, "reason", "") or "verification failed"
        return "verify_failed", fields
    fields["verified"] = True
    return None, fields


def _num(x):
    """A float for JSON, None when missing or not finite (the row's `reason` says why)."""
    return float(x) if x is not None and math.isfinite(float(x)) else None


def run_bench(candidates: List[Candidate], shapes: List[Shape], jobs: Dict, device, settings: Settings,
              writer: ResultsWriter, progress: Optional[Progress] = None, log: TextIO = sys.stderr,
              ceilings=None) -> int:
    """Measure every planned (shape, candidate, protocol) not yet in the file; return rows written. With
    `ceilings` (measure.Ceilings of this run), `kernel` rows carry their fraction of roofline."""
    from .measure import TorchLinear, TorchMatmul, measure, roofline_fields

    written = 0
    for shape in shapes:
        worked = False
        for cand in jobs[shape.key]:
            todo = pending(cand, shape, settings.protocols, writer.done)
            if not todo:
                continue
            worked = True
            if cand.failure is not None:
                status, extra = cand.failure[0], {"reason": cand.failure[1]}
            else:
                status, extra = _verify(cand, shape, device, settings.seed)
            problem = _problem(cand, shape)
            baseline = (TorchLinear if getattr(cand._kernel, "torch_baseline", "") == "linear" else TorchMatmul)(problem)
            fn = baseline if cand.target == "torch" else cand.kernel()
            for protocol in todo:
                row = _base_row(cand, shape, protocol, device)
                row.update(extra)
                if status is None:
                    try:
                        timing = measure(protocol, fn, baseline, problem, device, reps=settings.reps,
                                         iters=settings.iters, warmup=settings.warmup, rate=settings.rate,
                                         seed=settings.seed, graphs=settings.graphs, rotate=settings.rotate,
                                         cold=settings.roofline)
                        row.update(status="ok", **timing.as_row())
                        if ceilings is not None and protocol == "kernel":
                            row.update(roofline_fields(problem, timing, ceilings))
                    except Exception as err:  # noqa: BLE001 - recorded; a long run goes on
                        if type(err).__name__ == "OutOfMemoryError":
                            _empty_cache(device)
                        row.update(status="error", reason=f"{type(err).__name__}: {err}")
                        print(f"l2c bench: {cand.id} on {shape} ({protocol}): {row['reason']}", file=log)
                else:
                    row["status"] = status
                writer.write(row)
                writer.done.add(row_key(row))
                written += 1
        if progress is not None and worked:
            progress.step(shape)
    return written


def pending(cand: Candidate, shape: Shape, protocols: List[str], done: Set[Tuple]) -> List[str]:
    """The protocols of (candidate, shape) that have no row yet."""
    return [p for p in protocols if (cand.id, shape.m, shape.n, shape.k, shape.batch, p) not in done]


def remaining_shapes(shapes: List[Shape], jobs: Dict, protocols: List[str], done: Set[Tuple]) -> List[Shape]:
    return [s for s in shapes if any(pending(c, s, protocols, done) for c in jobs[s.key])]


def _empty_cache(device) -> None:
    if device.kind == "cuda":
        import torch
        torch.cuda.empty_cache()


def command_line(argv: Optional[List[str]] = None) -> str:
    argv = list(sys.argv if argv is None else argv)
    if argv and os.path.basename(argv[0]) in ("l2c", "__main__.py", "cli.py"):
        argv[0] = "l2c"
    return shlex.join(argv)
