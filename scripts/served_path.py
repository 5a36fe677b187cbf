#!/usr/bin/env python
"""Host time of one eager `l2c.matmul` / `l2c.nn.Linear` call against torch's, with the C++ call table and without it
(GPU).

    python scripts/served_path.py OUT.json

Each figure is microseconds per call of 400 back-to-back calls without synchronizing, the best of 7 rounds, the
variants of one group interleaved round by round: on these small shapes that is host time, what the `call` protocol
pays. Groups: a served shape (the CUDA-graphs table's first CUTLASS fp16 `a @ b` entry under 256 MFLOP, behind a
one-entry table prepared inline, served from the first call); a shape no default-table entry serves, through
`l2c.matmul`, `l2c bench`'s two wrappers, `Dispatcher.linear` and `l2c.nn.Linear`. "Python path" is the same call
with the dispatcher's C++ table set aside (`Dispatcher.native = None`).
"""
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import torch
import torch.nn.functional as F
import l2c
from l2c import dispatch, native_call
from l2c.tuned_table import load_table, TunedTable


def per_call(group, n=400, rounds=7):
    """{name: best microseconds per call} of the functions in `group`, interleaved round by round."""
    best = {name: float("inf") for name in group}
    for _ in range(rounds):
        for name, fn in group.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / n)
            torch.cuda.synchronize()
    return {name: round(t * 1e6, 2) for name, t in best.items()}


def detached(dispatcher, fn):
    """`fn` with the dispatcher's C++ table set aside: its Python path."""
    def run():
        table, dispatcher.native = dispatcher.native, None
        try:
            return fn()
        finally:
            dispatcher.native = table
    return run


out = {"native_table": native_call.build_now(timeout=600) or native_call.failure()}
graphs = load_table(ROOT / "l2c" / "tuned" / "sm_90_graphs.json")
e = next(x for x in graphs.exact.values() if x.dtype == "f16" and x.layout == "row,row,row" and x.target == "cutlass"
         and x.m * x.n * x.k <= 256 * 1024 * 1024)
a = torch.randn(e.m, e.k, device="cuda", dtype=torch.float16)
b = torch.randn(e.k, e.n, device="cuda", dtype=torch.float16)
out["served_shape"] = [e.m, e.n, e.k]
d = dispatch.set_tuned_table(TunedTable([e]), prepare="inline")
l2c.matmul(a, b), l2c.matmul(a, b)
out["served_stats_after_two"] = d.stats
out["served"] = per_call({"torch.matmul": lambda: torch.matmul(a, b), "l2c.matmul": lambda: l2c.matmul(a, b),
                          "l2c.matmul, Python path": detached(d, lambda: l2c.matmul(a, b)),
                          "CallTable.call": lambda: d.native.call(a, b, None, 0),
                          "torch.compiler.is_compiling": torch.compiler.is_compiling})
out["served_stats"] = d.stats

from l2c.candidates import load_candidates
from l2c.measure import Problem, TorchLinear, TorchMatmul
default = ROOT / "l2c" / "tuned" / "sm_90.json"
table = load_table(default)
# the unserved shape: the first of these that no entry serves in either layout (the table grows cells over time)
LAYOUTS = ("row,row,row", "row,col,row")
unserved = next(((m, n, k) for m, n, k in ((4, 264, 88), (3, 200, 72), (5, 136, 56), (2, 120, 40), (7, 72, 24))
                 if not any(table.may_serve(m, n, k, dtype="f16", layout=lay) for lay in LAYOUTS)), None)
if unserved is None:
    sys.exit(f"served_path: {default} serves every candidate unserved shape; add one it does not serve")
m, n, k = unserved
d = dispatch.set_tuned_table(table)
native_call.build_now()
u = torch.randn(m, k, device="cuda", dtype=torch.float16)
v = torch.randn(k, n, device="cuda", dtype=torch.float16)
w = torch.randn(n, k, device="cuda", dtype=torch.float16)
ours, theirs = l2c.nn.Linear(k, n, device="cuda", dtype=torch.float16), torch.nn.Linear(k, n, device="cuda",
                                                                                       dtype=torch.float16)
cand, lin_cand = (load_candidates([f"{via}:{default}"])[0]._kernel for via in ("dispatch", "linear"))
native_call.build_now()
base, lin_base = TorchMatmul(Problem(m, n, k)), TorchLinear(Problem(m, n, k, layout_b="col"))
with torch.no_grad():
    out["unserved_shape"] = [m, n, k]
    out["unserved"] = per_call({
        "torch.matmul": lambda: torch.matmul(u, v), "l2c.matmul": lambda: l2c.matmul(u, v),
        "l2c.matmul, Python path": detached(d, lambda: l2c.matmul(u, v)),
        "bench candidate": lambda: cand(u, v), "bench baseline": lambda: base(u, v),
        "F.linear": lambda: F.linear(u, w), "Dispatcher.linear": lambda: d.linear(u, w),
        "Dispatcher.linear, Python path": detached(d, lambda: d.linear(u, w)),
        "bench linear candidate": lambda: lin_cand(u, w.t()), "bench linear baseline": lambda: lin_base(u, w.t()),
        "torch.nn.Linear": lambda: theirs(u), "l2c.nn.Linear": lambda: ours(u),
        "l2c.nn.Linear, Python path": detached(d, lambda: ours(u))})
out["unserved_stats"] = d.stats
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
