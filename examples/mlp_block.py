#!/usr/bin/env python
"""End to end: a transformer MLP block (Llama-3.1-8B sizes) with torch.nn.Linear vs l2c.nn.Linear.

    python examples/mlp_block.py [--table TABLE.json] [--tokens 128,2048] [--out result.json]

The block is y = down(gelu(up(x))) with hidden 4096 and intermediate 14336, fp16, on the GPU. The same
module is timed twice, side by side and interleaved: once with its torch.nn.Linear layers and once after
`l2c.nn.replace_linears` swapped them for l2c.nn.Linear (same weights), which serves each layer from the
tuned table (or falls back to torch where the table has no kernel for the shape). The two outputs are
compared first. With --fuse the l2c side computes GELU in the up projection's epilogue instead of a
separate torch kernel. Times are medians of CUDA-event timings over repeated forward passes.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys

import torch

import l2c
from l2c.dispatch import TunedTable, default_dispatcher, set_tuned_table


class MLP(torch.nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.up = torch.nn.Linear(hidden, intermediate, bias=False)
        self.down = torch.nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


class FusedMLP(torch.nn.Module):
    """The same block on l2c.nn.Linear, with GELU fused into the up projection's epilogue."""

    def __init__(self, mlp: MLP):
        super().__init__()
        self.up = l2c.nn.Linear.from_linear(mlp.up, activation="gelu")
        self.down = l2c.nn.Linear.from_linear(mlp.down)

    def forward(self, x):
        return self.down(self.up(x))


def time_ms(fn, x, reps: int = 20, inner: int = 5) -> float:
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn(x)
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / inner)
    return statistics.median(samples)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", help="tuned table JSON (default: the one l2c ships for this GPU)")
    p.add_argument("--tokens", default="128,2048")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--fuse", action="store_true", help="fuse GELU into the up projection (l2c's epilogue)")
    p.add_argument("--out")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("mlp_block: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.table:
        set_tuned_table(TunedTable.load(args.table))
    torch.manual_seed(0)
    ref = MLP(args.hidden, args.intermediate).to("cuda", torch.float16).eval()
    tuned = FusedMLP(ref) if args.fuse else l2c.nn.replace_linears(copy.deepcopy(ref))
    rows = []
    with torch.inference_mode():
        for tokens in map(int, args.tokens.split(",")):
            x = torch.randn(tokens, args.hidden, device="cuda", dtype=torch.float16)
            before = dict(default_dispatcher().stats)
            y_ref, y = ref(x), tuned(x)
            after = default_dispatcher().stats
            served = {k: after[k] - before.get(k, 0) for k in after}
            rel = ((y.float() - y_ref.float()).norm() / y_ref.float().norm()).item()
            for _ in range(3):   # warm up both (clocks, caches, first-call builds)
                time_ms(ref, x, reps=3)
                time_ms(tuned, x, reps=3)
            t_ref, t_l2c = [], []
            for _ in range(5):   # interleave the two sides
                t_ref.append(time_ms(ref, x))
                t_l2c.append(time_ms(tuned, x))
            row = {"tokens": tokens, "hidden": args.hidden, "intermediate": args.intermediate,
                   "torch_ms": statistics.median(t_ref), "l2c_ms": statistics.median(t_l2c),
                   "speedup": statistics.median(t_ref) / statistics.median(t_l2c), "rel_diff": rel,
                   "layers_served_by_tuned_kernels": served.get("tuned", 0),
                   "layers_served_by_torch_fallback": served.get("fallback", 0)}
            rows.append(row)
            print(f"tokens {tokens:>5}: torch {row['torch_ms']:.3f} ms  l2c {row['l2c_ms']:.3f} ms  "
                  f"speedup {row['speedup']:.3f}x  rel diff {rel:.1e}  "
                  f"(tuned layers {row['layers_served_by_tuned_kernels']}, "
                  f"fallback {row['layers_served_by_torch_fallback']})")
            if rel > 1e-2:
                print("mlp_block: l2c output differs from torch", file=sys.stderr)
                return 1
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "fused": args.fuse,
                       "table": args.table, "command":
                       " ".join(["python"] + sys.argv), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
