"""The search space, derived from the knob table, and the problem a search is about.

Every `searchable` knob of `l2c.knobs.KNOBS` is one categorical parameter; the target is a parameter
too, and a knob that only one target reads is sampled only when that target was chosen (Optuna
define-by-run, conditional parameters). Validation is the constraint: `suggest` returns the point and
the validation verdict, and the tuner never builds a point that failed it.

Knobs with an integer range but no `choices` (split-K slices) are searched over the powers of two in
the range: the policy needs a categorical head per knob, and the non-powers add little.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..errors import L2ValidationError
from ..ir import KernelSpec, config_name
from ..knobs import ANY, AUTO, KNOBS, MAX_DIM, TARGETS, Knob
from ..rules import ValidSpec
from ..validate import validate

LAYOUTS = ("row", "col")


@dataclass(frozen=True)
class Problem:
    """One GEMM problem: D[m, n] = A[m, k] @ B[k, n] (batched when batch > 1) in one dtype and layout; with a `gate`
    (`epilogue gate`), the gated projection D[m, n] = act(A @ B[:, :n]) * (A @ B[:, n:]) of a B with 2n columns."""
    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "f16"
    layout_a: str = "row"
    layout_b: str = "row"
    layout_c: str = "row"
    arch: str = "sm_90"
    gate: str = "none"

    @property
    def layout(self) -> str:
        """`layout.a,layout.b,layout.c` as the tuned table spells it."""
        return f"{self.layout_a},{self.layout_b},{self.layout_c}"

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}" + (f"x{self.batch}" if self.batch != 1 else "")

    def key(self) -> str:
        """Stable text identity, used as the store's problem column and in study names: a gated problem's has
        `:gate=G` before the architecture, which stays last (store.arch_of)."""
        gate = f":gate={self.gate}" if self.gated else ""
        return f"{self.shape}:{self.dtype}:{self.layout}{gate}:{self.arch}"

    @classmethod
    def from_key(cls, key: str) -> "Problem":
        shape, dtype, layout, *gated, arch = key.split(":")
        dims = [int(x) for x in shape.split("x")]
        la, lb, lc = layout.split(",")
        gate = gated[0].split("=", 1)[1] if gated else "none"
        return cls(*dims[:3], batch=dims[3] if len(dims) > 3 else 1, dtype=dtype, layout_a=la, layout_b=lb,
                   layout_c=lc, arch=arch, gate=gate)

    @property
    def gated(self) -> bool:
        return self.gate != "none"

    def flops(self) -> float:
        """Multiply-adds x 2: a gated problem's B has 2n columns."""
        return 2.0 * self.m * self.n * self.k * self.batch * (2 if self.gated else 1)

    def as_dict(self) -> Dict[str, object]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    """One categorical search parameter: a knob (or the target) with its values and who reads it."""
    name: str                       # Optuna parameter name == KernelSpec field
    choices: Tuple[object, ...]
    targets: Tuple[str, ...]        # sampled only when the chosen target is one of these


def _choices(knob: Knob) -> Tuple[object, ...]:
    if knob.kind == "enum":
        return tuple(knob.choices)
    if knob.kind == "auto_int":
        return (AUTO,) + tuple(knob.choices)
    if knob.kind == "int" and knob.choices:
        return tuple(knob.search_choices or knob.choices)
    if knob.kind == "int":
        lo, hi = knob.lo or 1, knob.hi or knob.lo or 1
        return tuple(1 << i for i in range(int(math.log2(lo)), int(math.log2(hi)) + 1) if lo <= (1 << i) <= hi)
    raise ValueError(f"knob {knob.key} of kind {knob.kind} cannot be searched")


TARGET_PARAM = "target"
KNOB_PARAMS: Tuple[Param, ...] = tuple(
    Param(k.field, _choices(k), k.searched_for) for k in KNOBS if k.searchable)
PARAMS: Tuple[Param, ...] = (Param(TARGET_PARAM, tuple(TARGETS), tuple(TARGETS)),) + KNOB_PARAMS
PARAMS_BY_NAME = {p.name: p for p in PARAMS}


def params_for(target: str) -> Tuple[Param, ...]:
    """The knob parameters sampled once `target` is chosen."""
    return tuple(p for p in KNOB_PARAMS if target in p.targets)


def check_targets(targets: Sequence[str]) -> Tuple[str, ...]:
    bad = [t for t in targets if t not in TARGETS]
    if bad or not targets:
        raise ValueError(f"unknown target(s) {', '.join(bad) or '(none)'}; expected some of {', '.join(TARGETS)}")
    return tuple(t for t in TARGETS if t in targets)   # canonical order: one study name per set


def suggest_params(trial, targets: Sequence[str]) -> Dict[str, object]:
    """Define-by-run: the target first, then only the knobs that target reads."""
    targets = check_targets(targets)
    params = {TARGET_PARAM: trial.suggest_categorical(TARGET_PARAM, list(targets))}
    for p in params_for(params[TARGET_PARAM]):
        params[p.name] = trial.suggest_categorical(p.name, list(p.choices))
    return params


def point_key(params: Dict[str, object]) -> Tuple:
    """A search point's identity, to find one already in a study or in the pack."""
    return tuple(sorted((k, str(v)) for k, v in params.items()))


def spec_from_params(params: Dict[str, object], problem: Problem, generic: bool = False,
                     name: Optional[str] = None) -> KernelSpec:
    """A KernelSpec for `problem` with the searched knobs from `params` (unset knobs keep their defaults).

    `generic=True` leaves M, N, K open (`any`) so one build serves every shape (compile once, measure
    many); batch stays fixed because it changes the kernel's calling convention. Unless `name` is given,
    the spec is named after its knobs (`config_name`), so equal configurations share one build. A CUTLASS
    point takes the epilogue store `tuner_store` gives it.
    """
    spec = _spec(params, problem, generic, name)
    if spec.target == "cutlass" and spec.launch_family == "gemm":
        spec = spec.replace(epilogue_store=tuner_store(params, problem))
    return spec if name else spec.replace(name=config_name(spec))


def _spec(params: Dict[str, object], problem: Problem, generic: bool, name: Optional[str]) -> KernelSpec:
    target = params.get(TARGET_PARAM, "any")
    values = {p.name: params[p.name] for p in KNOB_PARAMS if p.name in params}
    for key, value in values.items():
        if value not in PARAMS_BY_NAME[key].choices:
            raise ValueError(f"{key}={value!r} is not in the search space {PARAMS_BY_NAME[key].choices}")
    acc = "f32"
    dims = (ANY, ANY, ANY) if generic else (problem.m, problem.n, problem.k)
    spec = KernelSpec(name=name or "_", target=target, problem_m=dims[0], problem_n=dims[1], problem_k=dims[2],
                      problem_batch=problem.batch, types_a=problem.dtype, types_b=problem.dtype,
                      types_c=problem.dtype, types_acc=acc, layout_a=problem.layout_a,
                      layout_b=problem.layout_b, layout_c=problem.layout_c, epilogue_gate=problem.gate, **values)
    return spec


# The store of the CUTLASS kernels the tuner builds: l2c's staged epilogue builds in about half the TMA store's
# time at the same speed (benchmarks/NOTES.md, "The staged epilogue").
NEW_KERNEL_STORE = "staged"


def tuner_store(params: Dict[str, object], problem: Problem) -> str:
    """The epilogue store of a CUTLASS point: the TMA store where the prebuilt pack holds the point built so (it
    then costs no compile), else `NEW_KERNEL_STORE`."""
    return "tma" if point_key(params) in prebuilt_index(problem) else NEW_KERNEL_STORE


def prebuilt_index(problem: Problem) -> Dict[Tuple, Dict[str, object]]:
    """Search points (by `point_key`, in the pack's order) whose CUTLASS kernel, built as the tuner builds it
    (shape-generic, no epilogue, the TMA store), the prebuilt pack of `problem`'s architecture holds byte for byte,
    for problems of its dtype, layout and batch (none for a gated problem: the pack's kernels are plain GEMMs). Read
    once per pack file and problem kind."""
    from ..targets.cutlass.pack import default_pack_path
    if problem.gated:
        return {}
    path = default_pack_path(problem.arch)
    try:
        stat = path.stat()
    except OSError:
        return {}
    kind = Problem(1, 1, 1, problem.batch, problem.dtype, problem.layout_a, problem.layout_b, problem.layout_c,
                   problem.arch)
    return _prebuilt_index(str(path), stat.st_mtime_ns, stat.st_size, kind)


@functools.lru_cache(maxsize=64)
def _prebuilt_index(path: str, mtime_ns: int, size: int, kind: Problem) -> Dict[Tuple, Dict[str, object]]:
    from ..errors import L2Error
    from ..lower import render
    from ..parser import parse_one
    from ..targets.cutlass.pack import PackError, read_pack
    from ..targets.cutlass.toolchain import pack_key
    try:
        entries = read_pack(path).entries
    except PackError:
        return {}
    index: Dict[Tuple, Dict[str, object]] = {}
    for key, entry in sorted(entries.items()):
        try:
            params = params_from_spec(parse_one(entry.spec, file="<pack>"), "cutlass")
            generic = _spec(params, kind, generic=True, name=None).replace(epilogue_store="tma")
            generic = generic.replace(name=config_name(generic))
            if pack_key(render(validate(generic, "cutlass", kind.arch))) == key:
                index.setdefault(point_key(params), params)
        except (L2Error, ValueError):
            continue
    return index


def params_from_spec(spec: KernelSpec, target: Optional[str] = None) -> Dict[str, object]:
    """The search-space point of a spec (e.g. one an LLM wrote): its target and that target's knobs.

    Values outside the searched choices (a split-K of 3) raise ValueError: the point is not in the space.
    """
    target = target or (spec.target if spec.target != "any" else None)
    if target is None:
        raise ValueError("the spec does not name a target; pass one")
    params: Dict[str, object] = {TARGET_PARAM: target}
    for p in params_for(target):
        value = getattr(spec, p.name)
        if value not in p.choices:
            raise ValueError(f"{p.name}={value!r} is outside the search space {p.choices}")
        params[p.name] = value
    return params


def check_point(params: Dict[str, object], problem: Problem) -> Tuple[Optional[ValidSpec], Optional[str]]:
    """Validate a point for its problem (fixed dims: the strictest check). (valid, None) or (None, reason)."""
    spec = spec_from_params(params, problem)
    try:
        return validate(spec, params[TARGET_PARAM], problem.arch), None
    except L2ValidationError as err:
        return None, f"{err.rule}: {err.message}"


# ---------------------------------------------------------------------------------------------------
# Shapes: the named sets and shape files are l2c.shapes' (shared with `l2c bench`)
# ---------------------------------------------------------------------------------------------------

_SHAPE = re.compile(r"^\s*(\d+)x(\d+)x(\d+)(?:x(\d+))?\s*$")


def parse_shape(text: str) -> Tuple[int, int, int, int]:
    """`MxNxK` or `MxNxKxBATCH` -> (m, n, k, batch)."""
    m = _SHAPE.match(text)
    if not m:
        raise ValueError(f"bad shape {text!r}; expected MxNxK, e.g. 4096x4096x4096")
    dims = tuple(int(g) if g else 1 for g in m.groups())
    if min(dims) < 1 or max(dims) > MAX_DIM:   # the kernels take each as a 32-bit int, as `l2c bench` checks
        raise ValueError(f"bad shape {text!r}: dimensions must be from 1 to {MAX_DIM}")
    return dims  # type: ignore[return-value]


def shapes_from_arg(arg: str) -> List[Tuple[int, int, int, int]]:
    """`grid`, `llm`, `square`, a shapes file (see l2c.shapes) or `MxNxK,MxNxK,...` -> (m, n, k, batch)."""
    from ..shapes import SETS, load_shapes
    if arg in SETS or Path(arg).is_file():
        return [(s.m, s.n, s.k, s.batch) for s in load_shapes(arg)]
    return list(dict.fromkeys(parse_shape(s) for s in arg.split(",") if s.strip()))


def problems(shapes: Iterable[Sequence[int]], dtype: str = "f16", layout: str = "row,row,row",
             arch: str = "sm_90", gate: str = "none") -> List[Problem]:
    """The problems of `shapes` (M, N, K[, batch]; N is D's columns, half of B's when gated)."""
    parts = layout.split(",")
    if len(parts) != 3 or any(x not in LAYOUTS for x in parts):
        raise ValueError(f"bad layout {layout!r}; expected three of row/col, e.g. row,col,row")
    la, lb, lc = parts
    out = []
    for dims in shapes:
        m, n, k = dims[:3]
        batch = dims[3] if len(dims) > 3 else 1
        out.append(Problem(m, n, k, batch=batch, dtype=dtype, layout_a=la, layout_b=lb, layout_c=lc, arch=arch,
                           gate=gate))
    return out
