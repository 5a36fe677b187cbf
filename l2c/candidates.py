"""What `l2c bench` measures: candidates from `.l2` files, tuned tables, `torch` and the user-facing entry points
(`dispatch[:TABLE]`, `linear[:TABLE]`), and the plan of which candidate runs on which shape."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from .errors import BenchError
from .shapes import Shape


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
    serves: Optional[str] = None            # `serving:` candidates: the spec text every call is served by
    table_served: Optional[bool] = None     # table entries: False where another entry serves this one's shape
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
    def build_id(self) -> Optional[str]:
        """`l2c.build.build_id` of the kernel (None for torch, the dispatcher and specs that did not validate)."""
        from .rules import ValidSpec
        if not isinstance(self.valid, ValidSpec):
            return None
        from .build import build_id_of
        return build_id_of(self.valid.spec.to_l2(), self.valid.target, self.valid.arch.name) or None

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

    from .tuned_table import TableError, entry_from_row, read_table_data, table_from_data

    try:
        table = read_table_data(path)
        served = table_from_data(table, path)
    except TableError as err:
        raise BenchError(str(err)) from None
    entries = table["entries"]
    table_arch = table.get("arch", arch)
    out = []
    for i, entry in enumerate(entries):
        where = f"{path}#entries[{i}]"
        try:
            as_read = entry_from_row(entry)   # what the dispatcher would refuse to read is no candidate either
            shape = Shape(int(entry["m"]), int(entry["n"]), int(entry["k"]), int(entry.get("batch", 1)),
                          label="table")
            spec_text, target = entry["spec"], entry["target"]
        except (KeyError, TypeError, ValueError) as err:
            raise BenchError(f"{where}: malformed entry ({err!r})") from None
        spec = parse_one(spec_text, file=where)
        # shadowed (False) only where another entry serves its shape; one no entry serves there (measured no
        # faster than torch: the table leaves it out) stays in the table's summary, as measured
        hit = served.lookup(as_read.dtype, as_read.layout, as_read.m, as_read.n, as_read.k, as_read.batch,
                            as_read.gate)
        cand = Candidate(id=f"{path}#{i}:{spec.name}@{target}", source=path, target=target, spec=spec,
                         shapes=[shape], table_served=hit is None or hit == as_read)
        try:
            cand.valid = validate(spec, target, table_arch)
        except L2Error as err:
            cand.failure = ("invalid", err.render())
        out.append(cand)
    return out


def _linear_with(dispatcher, a, b, bias, activation):
    """`l2c.nn.Linear`'s eager path with b = weight^T, as `matmul_with` is `l2c.matmul`'s."""
    return dispatcher.linear(a, b.t(), bias, activation)


class DispatchKernel:
    """`l2c.matmul` (or `l2c.nn.Linear`'s path) with one dispatcher, behind the Kernel call convention so that it
    is verified and timed like any candidate. It allocates its output as users' calls do (`writes_out` False:
    the protocols then let both sides allocate), and `linear` is timed against what torch.nn.Linear runs
    (F.linear), `matmul` against torch.matmul."""
    writes_out = False

    def __init__(self, spec, table_path: Optional[str], via: str, arch: str, table=None):
        from types import SimpleNamespace
        from . import settings
        from .dispatch import Dispatcher, default_table_path, shipped_table_path, table_for_arch, tune_mode
        from .tuned_table import TableError, load_table
        try:
            settings.overlap()   # a measurement under a malformed L2C_OVERLAP would measure the default
            online = tune_mode() == "online"
        except ValueError as err:
            raise BenchError(str(err)) from None
        try:
            if table_path == NO_TABLE:   # nothing serves; online choice times the arch's table's kernels
                general = shipped_table_path(arch)
                candidates = load_table(general) if general is not None else None
                self.table_path = NO_TABLE
            elif table is None and table_path is None:   # the tables l2c.matmul uses on this GPU (table_for_arch)
                gpu = _gpu_name()
                path = default_table_path(arch, gpu)
                table, candidates = table_for_arch(arch, gpu, online, strict=True)
                self.table_path = str(path) if path is not None else None
            else:   # a named table, or one made in memory (`serving:`): its name says what it serves
                table = load_table(table_path) if table is None else table
                self.table_path, candidates = table_path, table
        except TableError as err:
            raise BenchError(str(err)) from None
        self.dispatcher = Dispatcher(table, allow_cpu=True, prepare="background", online=online,
                                     candidates=candidates)
        # what verification reads of a kernel: its spec, name and target (the dispatcher's: whatever serves the call)
        self.valid = SimpleNamespace(spec=spec, name=f"{via}[{self.table_path}]", target="dispatch")
        self.via = via
        self.activation = None if spec.epilogue_activation == "none" else spec.epilogue_activation
        self.torch_baseline = via
        from .ops import matmul_with
        self._run = _linear_with if via == "linear" else matmul_with

    def __call__(self, a, b, c=None, bias=None, out=None):
        # as little Python as the baseline's wrapper: in `call` a microsecond here is a few percent of the figure
        y = self._run(self.dispatcher, a, b, bias, self.activation)
        if out is not None:
            out.copy_(y)
            return out
        return y

    def prime(self, shape: Shape, device, timeout: float = 900.0) -> dict:
        """Call once on this shape, let the dispatcher prepare the kernel it serves, call again (twice: a decision
        made by online tuning is then prepared in its turn); return the fields
        of its rows: what serves the call from now on (`served_by`: the kernel's name, or `torch`) and, where a table
        entry does, that entry's spec and target (`served_spec`, `served_target`: what `l2c table` makes an entry
        of, whatever later becomes of the table file); a kernel online tuning chose is recorded the same way, with
        `served_via: online`; with online tuning on, where no table entry serves, every candidate this process's
        online tuning timed at the shape (`online_timings`: spec text -> device-time speedup)."""
        import torch
        from .verify import make_inputs
        gen = torch.Generator(device=device.torch_device).manual_seed(0)
        a, b, _, bias, _ = make_inputs(self.valid.spec, shape.m, shape.n, shape.k, 1, device.torch_device, gen)
        self(a, b, bias=bias)
        self.dispatcher.wait(timeout)
        if device.torch_device.type == "cuda":   # the steady state users get: the C++ call table built and attached
            from .native_call import build_now
            build_now(timeout)
        self(a, b, bias=bias)
        self.dispatcher.wait(timeout)   # what that call asked for (an online decision's kernel, prepared now)
        self(a, b, bias=bias)
        kernel = self.dispatcher.resolve(a, b, bias, self.activation or "none")
        spec, table = self.valid.spec, self.dispatcher.table
        layout = f"{spec.layout_a},{spec.layout_b},{spec.layout_c}"
        entry = None if table is None else table.lookup(    # None too for a kernel online tuning chose
            spec.types_a, layout, shape.m, shape.n, shape.k, shape.batch)
        timed = {}
        if self.dispatcher.online and entry is None:   # what online tuning timed here: evidence for `--near`
            timed = self.dispatcher.online_timings.get(self.dispatcher.decisions.signature(
                spec.types_a, layout, shape.m, shape.n, shape.k, bias is not None, self.activation or "none"), {})
        if kernel is None:
            return {"served_by": "torch", **({"online_timings": timed} if timed else {})}
        fields = {"served_by": kernel.valid.name, **({"online_timings": timed} if timed else {})}
        if entry is not None:
            fields.update(served_spec=entry.spec_text, served_target=entry.target)
        elif self.dispatcher.online:   # online tuning's choice: its kernel is the entry `l2c table` may make of it
            fields.update(served_spec=kernel.valid.spec.to_l2(), served_target=kernel.valid.target,
                          served_via="online")
        return fields


def _gpu_name() -> Optional[str]:
    import torch
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _user_spec(dtype: str, layout: str):
    """The types and layouts a torch or dispatch candidate is measured with (no kernel knobs)."""
    from .ir import KernelSpec
    la, lb, lc = layout.split(",")
    return KernelSpec(name="user_call", types_a=dtype, types_b=dtype, types_c=dtype, layout_a=la, layout_b=lb,
                      layout_c=lc)


# `dispatch:none`: l2c.matmul with no table serving, online choice's candidates the arch's shipped table: how a
# GPU's own table's points are measured (`L2C_TUNE=online`: each point the best of those kernels timed there, or
# torch), whatever table ships for that GPU already.
NO_TABLE = "none"


def load_candidates(paths: Iterable[str], target: str = "all", arch: str = "sm_90", dtype: str = "f16",
                    layout: str = "row,row,row") -> List[Candidate]:
    """Candidates from `.l2` files, tuned-table `.json` files, `torch`, `dispatch[:TABLE]` and `linear[:TABLE]`
    (those three measured in `dtype` and `layout`; TABLE `none`: no table serves, NO_TABLE)."""
    out: List[Candidate] = []
    for p in paths:
        via = p.split(":", 1)[0]
        if p == "torch":
            from .knobs import ANY
            # torch takes any batch, in every dtype and layout alike
            spec = None if (dtype, layout) == ("f16", "row,row,row") else _user_spec(dtype, layout).replace(
                problem_batch=ANY)
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
        elif via == "serving":
            out.extend(_serving_candidates(p.split(":", 1)[1] if ":" in p else "", target, arch, dtype, layout))
        elif p.endswith(".json"):
            out.extend(_table_candidates(p, arch))
        else:
            if not Path(p).exists():
                raise BenchError(f"{p}: no such file")
            out.extend(_spec_candidates(p, target, arch))
    if not out:
        raise BenchError("nothing to measure: give .l2 spec files, tuned-table .json files or `torch`")
    return out


def _serving_candidates(path: str, target: str, arch: str, dtype: str, layout: str) -> List[Candidate]:
    """`serving:FILE.l2`: `l2c.matmul` serving each shape-generic spec of FILE at every shape (a table of one cell
    that holds everything, `TunedTable.serving`), in the spec's dtype and layouts: what a table entry of that kernel
    would serve, measured through the dispatcher's whole call path. Its rows record the spec (`served_spec`), so
    that `l2c table` makes entries and cells of it."""
    from .tuned_table import TunedTable
    if not path or not Path(path).exists():
        raise BenchError(f"serving:{path}: give an existing .l2 file, e.g. serving:specs.l2")
    out = []
    for cand in _spec_candidates(path, target, arch):
        spec = cand.spec
        if cand.failure is not None or not spec.shape_generic:
            raise BenchError(f"serving:{path}: {spec.name} must be a valid shape-generic spec (problem m/n/k = any)")
        call_layout = f"{spec.layout_a},{spec.layout_b},{spec.layout_c}"
        via = "linear" if (spec.layout_b, spec.layout_c) == ("col", "row") else "dispatch"
        table = TunedTable.serving(spec.to_l2(), cand.target, spec.types_a, call_layout, arch)
        kernel = DispatchKernel(_user_spec(spec.types_a, call_layout), f"serving[{spec.name}]", via, arch, table)
        served = Candidate(id=f"serving:{path}:{spec.name}@{cand.target}", source=path, target="dispatch",
                           spec=kernel.valid.spec, valid=kernel.valid, serves=spec.to_l2())
        served._kernel = kernel
        out.append(served)
    return out


def plan(candidates: List[Candidate], shape_set: Optional[List[Shape]]) -> Tuple[List[Shape], Dict, int, int]:
    """Shapes in measuring order and, per shape key, the candidates to run there; plus how many fixed-shape
    candidates were left out because their shape is not in the given set, and how many (candidate, shape) pairs of
    the set a shape-generic candidate does not take (a batch its spec does not hold)."""
    in_set = None if shape_set is None else {s.key for s in shape_set}
    jobs: Dict[Tuple[int, int, int, int], List[Candidate]] = {}
    shapes: Dict[Tuple[int, int, int, int], Shape] = {}
    skipped = declined = 0
    if shape_set is not None:
        for s in shape_set:
            shapes.setdefault(s.key, s)
    for cand in candidates:
        if cand.shapes is None:
            if shape_set is None:
                raise BenchError(f"{cand.id} is shape-generic (problem m/n/k = any): give --shapes")
            targets = [s for s in shape_set if cand.accepts(s)]
            declined += len(shape_set) - len(targets)
        else:
            targets = [s for s in cand.shapes if in_set is None or s.key in in_set]
            skipped += len(cand.shapes) - len(targets)
        for s in targets:
            shapes.setdefault(s.key, s)
            jobs.setdefault(s.key, []).append(cand)
    ordered = [shapes[k] for k in shapes if k in jobs]
    return ordered, jobs, skipped, declined
