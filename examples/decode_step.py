#!/usr/bin/env python
"""One decoding step of Llama-3.1-8B's linear layers, timed with torch and with l2c.

    python examples/decode_step.py [--batch 1,2,4,8,16,32,64,128,256] [--dtype f16] [--out FILE.json]
    L2C_TUNED_TABLE=l2c/tuned/sm_90_graphs.json python examples/decode_step.py ...   # the CUDA-graphs table

A transformer block's seven linear layers (q, k, v, o, gate, up, down; hidden 4096, MLP 14336, 8 KV heads) as
`torch.nn.Linear`, and the same weights after `l2c.nn.replace_linears`. Each step multiplies a batch of tokens
(one per sequence) through every layer, as decoding does. Two copies of the block alternate so that, as in a
32-layer model, every weight is read from HBM, not from the L2. Both sides are captured in CUDA graphs (what
serving engines replay) and timed by their replays, interleaved, median of repetitions; the outputs are
compared first. The roofline is the bytes of the weights over the GPU's read rate measured in this run.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys

import torch

import l2c
from l2c.devices import get_device
from l2c.roofline import measure_ceilings

HIDDEN, MLP, KV = 4096, 14336, 8 * 128
LAYERS = {"q": (HIDDEN, HIDDEN), "k": (KV, HIDDEN), "v": (KV, HIDDEN), "o": (HIDDEN, HIDDEN),
          "gate": (MLP, HIDDEN), "up": (MLP, HIDDEN), "down": (HIDDEN, MLP)}


def block(dtype) -> torch.nn.ModuleDict:
    return torch.nn.ModuleDict({name: torch.nn.Linear(k, n, bias=False, device="cuda", dtype=dtype)
                                for name, (n, k) in LAYERS.items()})


def step(blocks, x, h):
    """Every linear layer of each block once: x (tokens, 4096) feeds q, k, v, o, gate, up; h (tokens, 14336)
    feeds down. Returns the outputs, so that graph capture keeps them."""
    outs = []
    for b in blocks:
        outs += [b[name](x) for name in ("q", "k", "v", "o", "gate", "up")] + [b["down"](h)]
    return outs


def time_graph(fn, reps: int = 20, per_rep: int = 20) -> float:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(per_rep):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / per_rep)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--dtype", choices=["f16", "bf16"], default="f16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("decode_step: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    ref_blocks = [block(dtype) for _ in range(2)]
    l2c_blocks = [l2c.nn.replace_linears(copy.deepcopy(b)) for b in ref_blocks]
    ceilings = measure_ceilings(get_device("cuda"))
    weight_bytes = sum(p.numel() * p.element_size() for b in ref_blocks for p in b.parameters())
    rows = []
    with torch.no_grad():
        for batch in (int(b) for b in args.batch.split(",")):
            x = torch.randn(batch, HIDDEN, device="cuda", dtype=dtype)
            h = torch.randn(batch, MLP, device="cuda", dtype=dtype)
            l2c.precompile(step, l2c_blocks, x, h, timeout=600)   # build and verify what l2c serves, off the clock
            got, want = step(l2c_blocks, x, h), step(ref_blocks, x, h)
            err = max(((g.double() - w.double()).norm() / w.double().norm()).item() for g, w in zip(got, want))
            served = l2c.dispatch.default_dispatcher().stats["tuned"]
            first = time_graph(lambda: step(ref_blocks, x, h))        # torch, l2c, torch: interleaved
            l2c_s = time_graph(lambda: step(l2c_blocks, x, h))
            torch_s = (first + time_graph(lambda: step(ref_blocks, x, h))) / 2
            floor = weight_bytes / ceilings.read_bytes_per_s
            row = {"batch": batch, "dtype": args.dtype, "torch_us": torch_s * 1e6, "l2c_us": l2c_s * 1e6,
                   "speedup": torch_s / l2c_s, "l2c_roofline_fraction": floor / l2c_s,
                   "torch_roofline_fraction": floor / torch_s, "max_rel_error": err, "tuned_calls_so_far": served}
            rows.append(row)
            print(f"batch {batch:4d}: torch {row['torch_us']:8.1f} us  l2c {row['l2c_us']:8.1f} us  "
                  f"{row['speedup']:.3f}x  roofline {row['torch_roofline_fraction']:.2f} -> "
                  f"{row['l2c_roofline_fraction']:.2f}  rel.err {err:.1e}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": args.dtype,
                       "weights_bytes": weight_bytes, "ceilings": ceilings.as_row(),
                       "table": str(l2c.dispatch.default_table_path("sm_90", torch.cuda.get_device_name())),
                       "command": " ".join(sys.argv), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
