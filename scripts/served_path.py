#!/usr/bin/env python
"""Where the host time of one served `l2c.matmul` call goes, piece by piece, against torch.matmul (GPU).

    python scripts/served_path.py OUT.json

Each figure is microseconds per call of 400 back-to-back calls without synchronizing (best of 5): on a small
shape that is host time, what the `call` protocol pays. The served kernel is the CUDA-graphs table's first CUTLASS
fp16 entry under 256 MFLOP, behind a one-entry table prepared inline (served from the first call). The pieces:
the kernel's planned call and its bound launcher (`Kernel.launcher`), the C++ served-call table
(l2c.targets.cutlass.native) and `l2c.matmul` with and without it, the dispatcher's served lookup,
`Dispatcher.matmul`, `ops.matmul_with`, and their parts (the call signature, the output's allocation, the stream
and device queries). Then the unserved path (a shape no default-table entry has) through `l2c.matmul` and through
`l2c bench`'s two wrappers.
"""
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import torch
import l2c
from l2c import dispatch, ops
from l2c.kernel import call_signature, cuda_accessors
from l2c.tuned_table import load_table, TunedTable

def per_call(fn, n=400):
    best = 1e9
    for _ in range(5):
        torch.cuda.synchronize(); s = time.perf_counter()
        for _ in range(n): fn()
        best = min(best, (time.perf_counter() - s) / n)
        torch.cuda.synchronize()
    return round(best * 1e6, 2)

out = {}
t = load_table(ROOT / "l2c" / "tuned" / "sm_90_graphs.json")
e = next(x for x in t.exact.values() if x.dtype == "f16" and x.layout == "row,row,row" and x.target == "cutlass"
         and x.m * x.n * x.k <= 256 * 1024 * 1024)
a = torch.randn(e.m, e.k, device="cuda", dtype=torch.float16)
b = torch.randn(e.k, e.n, device="cuda", dtype=torch.float16)
out["shape"] = [e.m, e.n, e.k]
from l2c.targets.cutlass import native
out["native_table"] = native.build_now(timeout=300) or native.failure()
d = dispatch.set_tuned_table(TunedTable([e]), prepare="inline")
y = l2c.matmul(a, b); y = l2c.matmul(a, b)
out["stats_after_two"] = dict(d.stats)
sig = call_signature(a, b, None)
launch = d._served.get((sig, None))
kernel = d.resolve(a, b, None, "none")
out["served"] = launch is not None and kernel is not None
get_device, get_stream = cuda_accessors()
parts = {"torch.matmul": lambda: torch.matmul(a, b), "l2c.matmul": lambda: l2c.matmul(a, b),
         "matmul_with": lambda: ops.matmul_with(d, a, b), "dispatcher.matmul": lambda: d.matmul(a, b),
         "call_signature": lambda: call_signature(a, b, None), "new_empty": lambda: a.new_empty((e.m, e.n)),
         "get_stream": lambda: get_stream(0), "get_device": lambda: get_device(),
         "is_compiling": lambda: torch.compiler.is_compiling(), "served_kn[dtype][layout][b.shape]":
             lambda: d.served_kn[a.dtype][not b.is_contiguous()][b.shape]}
if out["served"]:
    parts["kernel.call_planned"] = lambda: kernel.call_planned(sig, a, b, None)
    parts["bound launcher"] = lambda: launch(a, b, None)
    parts["_served_call"] = lambda: d._served_call(a, b, None, None, sig)
if d.native is not None:   # the C++ table's path, then the same calls with the table set aside (Python)
    parts["native table.matmul"] = lambda: d.native.matmul(a, b, None, 0, get_device(), get_stream(get_device()))
for name, fn in parts.items():
    try: out[name] = per_call(fn)
    except Exception as err: out[name] = repr(err)
table, d.native = d.native, None
out["l2c.matmul, Python path"] = per_call(lambda: l2c.matmul(a, b))
d.native = table
# while queued: a background dispatcher whose worker is busy with the first job (the same entry, never ready)
d2 = dispatch.set_tuned_table(TunedTable([e]), prepare="background")
l2c.matmul(a, b)
out["queued_stats"] = dict(d2.stats)
out["queued l2c.matmul"] = per_call(lambda: l2c.matmul(a, b), n=100)
out["queued_stats_after"] = dict(d2.stats)
# unserved: a shape no entry has, through l2c.matmul and through the bench's two wrappers
from l2c.candidates import load_candidates
from l2c.measure import Problem, TorchMatmul
dispatch.set_tuned_table(load_table(ROOT / "l2c" / "tuned" / "sm_90.json"))
u = torch.randn(4, 88, device="cuda", dtype=torch.float16); v = torch.randn(88, 264, device="cuda", dtype=torch.float16)
cand = load_candidates([f"dispatch:{ROOT / 'l2c' / 'tuned' / 'sm_90.json'}"])[0]._kernel
base = TorchMatmul(Problem(4, 264, 88))
for name, fn in {"unserved torch.matmul": lambda: torch.matmul(u, v), "unserved l2c.matmul": lambda: l2c.matmul(u, v),
                 "unserved bench candidate": lambda: cand(u, v), "unserved bench baseline": lambda: base(u, v)}.items():
    out[name] = per_call(fn)
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
