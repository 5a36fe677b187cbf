#!/usr/bin/env python
"""GPU check of the drop-in path: `l2c.matmul` through the shipped tuned table, against torch.

    python scripts/dispatch_check.py --out dispatch_check.json [--count 12]

For a sample of the table's shapes (both targets): fresh random inputs in the entry's dtype and layouts. After the
dispatcher's background worker prepared the call's kernel, `l2c.matmul(a, b)` must equal torch.matmul within the
dtype's tolerance and must have been served by the tuned kernel (dispatcher statistics); called with inputs that
require grad it must keep autograd, with gradients equal to torch's. Triton entries are also called with a fused
column bias + GELU (the dispatcher specialises the spec's epilogue). A token count the table holds no measurement
for (3 below an exact entry, outside any range) must be served by torch. Then the C++ call table on a side stream and
in a replayed CUDA graph, kernels that write a workspace on two streams at once, and a B whose leading dimension the
kernel declines (torch serves it). Exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import json
import random
import sys

import torch
import torch.nn.functional as F

import l2c
from l2c import native_call
from l2c.dispatch import default_dispatcher


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out")
    p.add_argument("--count", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--also", metavar="TEXT", help="also check every entry whose spec text contains TEXT "
                                                  "(e.g. loads=tma: a path the random sample may miss)")
    args = p.parse_args(argv)
    # the C++ call table builds off the calling thread (a minute of g++ on a fresh machine): the checks below are of
    # the path users get once it is loaded, so they wait for it
    if native_call.enabled() and not native_call.build_now():
        print(f"dispatch_check: the C++ call table did not build: {native_call.failure()}", file=sys.stderr)
    disp = default_dispatcher()
    table = disp.table
    if table is None:
        print("dispatch_check: no tuned table for this GPU", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    entries = sorted(table.exact.values(), key=lambda e: (e.target, e.m, e.n, e.k))
    small = [e for e in entries if e.m * e.n * e.k <= 4096 ** 3]
    picks = rng.sample(small, min(args.count, len(small)))
    if args.also:
        picks += [e for e in small if args.also in e.spec_text and e not in picks]
    rows, failures = [], 0
    torch.manual_seed(args.seed)
    for e in picks:
        cases = [(e.m, None, None)]
        if e.target == "triton":
            cases += [(e.m, "bias", "gelu"), (max(1, e.m - 3), None, None)]
        dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[e.dtype]
        layout_a, layout_b = e.layout.split(",")[:2]
        for m, bias_kind, act in cases:
            # operands in the entry's dtype and layouts (col: the transposed view of a contiguous matrix)
            a = torch.randn(m, e.k, device="cuda", dtype=dtype) if layout_a == "row" else \
                torch.randn(e.k, m, device="cuda", dtype=dtype).t()
            b = torch.randn(e.k, e.n, device="cuda", dtype=dtype) if layout_b == "row" else \
                torch.randn(e.n, e.k, device="cuda", dtype=dtype).t()
            bias = torch.randn(e.n, device="cuda", dtype=dtype) if bias_kind else None
            l2c.matmul(a, b, bias=bias, activation=act)        # queues the kernel; torch serves this call
            disp.wait(600)
            expect_tuned = table.lookup(e.dtype, e.layout, m, e.n, e.k) is not None
            before = dict(disp.stats)
            y = l2c.matmul(a, b, bias=bias, activation=act)
            torch.cuda.synchronize()
            served = "tuned" if disp.stats["tuned"] > before["tuned"] else "fallback"
            ref = a.float() @ b.float()
            if bias is not None:
                ref = ref + bias.float()
            if act == "gelu":
                ref = F.gelu(ref)
            rel = ((y.float() - ref).norm() / ref.norm()).item()
            tol = 5e-3 if dtype == torch.float16 else 2e-2   # bf16 keeps 8 mantissa bits to fp16's 11
            ok = served == ("tuned" if expect_tuned else "fallback") and rel < tol and not torch.isnan(y).any().item()
            grad_rel = None
            if act is None and expect_tuned:
                # autograd through the served kernel: dA and dB against torch's on the same upstream gradient
                ga, gb = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
                before = dict(disp.stats)
                out = l2c.matmul(ga, gb, bias=bias)
                upstream = torch.randn_like(out)
                out.backward(upstream)
                ra, rb = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
                (ra @ rb + (bias.float() if bias is not None else 0)).backward(upstream.float())
                grad_rel = max(((g.grad.float() - r.grad).norm() / r.grad.norm()).item() for g, r in ((ga, ra), (gb, rb)))
                ok = ok and out.grad_fn is not None and disp.stats["tuned"] > before["tuned"] and grad_rel < tol
            failures += not ok
            rows.append({"m": m, "n": e.n, "k": e.k, "dtype": e.dtype, "layout": e.layout, "target": e.target,
                         "bias": bias_kind, "activation": act, "served_by": served, "expected": "tuned" if expect_tuned
                         else "fallback", "rel_error": rel, "grad_rel_error": grad_rel, "ok": ok})
            print(f"{'ok  ' if ok else 'FAIL'} {e.target:<8} {e.dtype:<4} {m:>6}x{e.n:>6}x{e.k:>6} bias={bias_kind} act={act} "
                  f"served by {served}, rel error {rel:.2e}" + (f", grads {grad_rel:.2e}" if grad_rel is not None else ""))
    replayed = replay_check(disp, rows)
    failures += not replayed["ok"]
    concurrent = workspace_check(disp, entries)
    failures += sum(not r["ok"] for r in concurrent)
    declined = declined_check(disp, rows)
    failures += not declined["ok"]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "table": table.source,
                       "command": " ".join(["python"] + sys.argv), "checks": rows, "replayed": replayed,
                       "concurrent_workspaces": concurrent, "declined_signature": declined}, f, indent=1)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


def replay_check(disp, rows) -> dict:
    """A served CUTLASS call through the C++ call table launches on the caller's current stream: captured into a CUDA
    graph on the capture's stream and replayed on fresh inputs, and called on a side stream behind a long sleep, its
    results equal torch's."""
    served = [r for r in rows if r["ok"] and r["served_by"] == "tuned" and r["target"] == "cutlass"
              and r["bias"] is None and r["layout"].startswith("row")]
    if disp.native is None or not served:
        return {"ok": disp.native is not None, "reason": "no C++ call table" if disp.native is None else
                "no plain CUTLASS entry served"}
    r = served[0]
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[r["dtype"]]
    a = torch.randn(r["m"], r["k"], device="cuda", dtype=dtype)
    b = torch.randn(r["k"], r["n"], device="cuda", dtype=dtype) if r["layout"].split(",")[1] == "row" else \
        torch.randn(r["n"], r["k"], device="cuda", dtype=dtype).t()
    l2c.matmul(a, b)
    tol = 5e-3 if dtype == torch.float16 else 2e-2
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    before = disp.native.counts()[0]
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)   # a launch on any other stream would read and write before this ends
        a.normal_()
        y_side = l2c.matmul(a, b)
    side.synchronize()
    side_rel = ((y_side.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = l2c.matmul(a, b)
    a.normal_()
    graph.replay()
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    graph_rel = ((y_graph.float() - ref).norm() / ref.norm()).item()
    launched = disp.native.counts()[0] - before
    ok = side_rel < tol and graph_rel < tol and launched == 2
    print(f"{'ok  ' if ok else 'FAIL'} C++ call table, {r['m']}x{r['n']}x{r['k']} {r['dtype']}: side stream rel error "
          f"{side_rel:.2e}, CUDA graph replay rel error {graph_rel:.2e}, {launched} launches from the table")
    return {"ok": ok, "shape": [r["m"], r["n"], r["k"]], "dtype": r["dtype"], "side_stream_rel_error": side_rel,
            "graph_replay_rel_error": graph_rel, "table_launches": launched}


def declined_check(disp, rows) -> dict:
    """A served CUTLASS shape called with B a column slice whose leading dimension TMA cannot take (not a multiple
    of 16 bytes): the kernel declines the signature, torch serves it, and the result equals torch's, three times."""
    served = [r for r in rows if r["ok"] and r["served_by"] == "tuned" and r["target"] == "cutlass"
              and r["bias"] is None and r["layout"] == "row,row,row"]
    if not served:
        return {"ok": True, "reason": "no plain row-major CUTLASS entry served"}
    r = served[0]
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[r["dtype"]]
    a = torch.randn(r["m"], r["k"], device="cuda", dtype=dtype)
    b = torch.randn(r["k"], r["n"] + 1, device="cuda", dtype=dtype)[:, :r["n"]]
    ref = a.float() @ b.float()
    tol = 5e-3 if dtype == torch.float16 else 2e-2
    before = dict(disp.stats)
    errors = []
    for _ in range(3):
        y = l2c.matmul(a, b)
        torch.cuda.synchronize()
        errors.append(((y.float() - ref).norm() / ref.norm()).item())
    tuned = disp.stats["tuned"] - before["tuned"]
    ok = tuned == 0 and max(errors) < tol
    print(f"{'ok  ' if ok else 'FAIL'} B sliced to a leading dimension of {r['n'] + 1} at {r['m']}x{r['n']}x{r['k']} "
          f"{r['dtype']}: {tuned} tuned calls, worst rel error {max(errors):.2e}")
    return {"ok": ok, "shape": [r["m"], r["n"], r["k"]], "dtype": r["dtype"], "tuned_calls": tuned,
            "rel_errors": errors}


def workspace_check(disp, entries, calls_per_stream: int = 4) -> list:
    """Kernels that write a workspace (CUTLASS parallel split-K and stream-K entries; the smallest of each mode)
    served on two streams at once: each stream waits behind a sleep, then launches its calls back to back, so the
    two streams' kernels overlap; every output must equal torch's (a shared workspace would mix their partials)."""
    results = []
    for mode in ("parallel", "stream_k"):
        found = sorted((e for e in entries if e.target == "cutlass" and f"mode={mode}" in e.spec_text
                        and e.layout.startswith("row")), key=lambda e: e.m * e.n * e.k)
        if not found:
            results.append({"mode": mode, "ok": True, "reason": "no such entry in the table"})
            continue
        e = found[0]
        dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[e.dtype]
        b = torch.randn(e.k, e.n, device="cuda", dtype=dtype) if e.layout.split(",")[1] == "row" else \
            torch.randn(e.n, e.k, device="cuda", dtype=dtype).t()
        inputs = [torch.randn(e.m, e.k, device="cuda", dtype=dtype) for _ in range(2 * calls_per_stream)]
        l2c.matmul(inputs[0], b)
        disp.wait(600)
        before = disp.stats["tuned"]   # the Python path's and the C++ table's served calls
        l2c.matmul(inputs[0], b)
        torch.cuda.synchronize()
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        outputs = []
        for i, stream in enumerate(streams):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                torch.cuda._sleep(50_000_000)
                outputs += [l2c.matmul(a, b) for a in inputs[i * calls_per_stream:(i + 1) * calls_per_stream]]
        torch.cuda.synchronize()
        served = disp.stats["tuned"] - before
        tol = 5e-3 if dtype == torch.float16 else 2e-2
        errors = []
        for a, y in zip(inputs, outputs):
            ref = a.float() @ b.float()
            errors.append(((y.float() - ref).norm() / ref.norm()).item())
        ok = served == 1 + len(outputs) and max(errors) < tol
        print(f"{'ok  ' if ok else 'FAIL'} {mode} entry {e.m}x{e.n}x{e.k} {e.dtype} on two streams at once: "
              f"{served} served calls, worst rel error {max(errors):.2e}")
        results.append({"mode": mode, "ok": ok, "shape": [e.m, e.n, e.k], "dtype": e.dtype, "spec": e.spec_text,
                        "served_calls": served, "rel_errors": errors})
    return results


if __name__ == "__main__":
    sys.exit(main())
