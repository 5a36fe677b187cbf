#!/usr/bin/env python
"""End to end on a real model class: a Hugging Face LlamaForCausalLM with Llama-3.1-8B's shapes, served by l2c.

    python examples/llama_e2e.py --out benchmarks/results/model_h200.json [--table TABLE.json] [--layers 2]
    python examples/llama_e2e.py --tiny --device cpu --out /tmp/model_tiny.json    # the machinery, on a CPU

The model is built from a Llama-3.1-8B-shaped config (hidden 4096, MLP 14336, 32 heads, 8 KV heads, vocabulary
128256) with random weights (nothing is downloaded) and 2-4 layers, in fp16 and bf16. Four sides, each timed alike:

- `torch_eager`: the Hugging Face modules;
- `torch_max_autotune`: torch.compile(mode="max-autotune")'s kernels (compiled as max-autotune-no-cudagraphs: this
  script captures every side in its own CUDA graph, so that the same replay times them all);
- `l2c`: the same weights after `l2c.nn.replace_mlps` (each MLP a `GatedMLP`: one GEMM over the concatenated gate and
  up weights whose epilogue writes act(gate) * up, then the down projection) and `replace_linears` for the rest,
  each GEMM served by a tuned kernel where the table (`--table`, else the shipped one) has a measured win, torch
  elsewhere;
- `l2c_compiled`: that model under torch.compile (same mode), l2c's GEMMs as opaque custom ops.

Figures, all after the outputs were compared with torch eager's (relative error per side; beyond the dtype's
tolerance the run is marked and exits 1 once the file is written):

- `mlp`: the MLP block alone, down(silu(gate(x)) * up(x)), at `--mlp-tokens`. Every side cycles over copies of the
  weights (`l2c.measure.rotation_sets`, cold), so that each call reads its weights from HBM, not from the L2.
  `roofline_fraction` = the block's floor over l2c's time, the floor being the sum of its two GEMMs' rooflines
  (`l2c.measure.Ceilings.roofline_s`: bytes over the read rate or FLOPs over the dense rate, whichever is longer,
  both rates measured in this run by `measure_ceilings`); `speedup_vs_eager` = torch eager's time over l2c's,
  `speedup_vs_max_autotune` = torch.compile's over l2c under torch.compile.
- `prefill`: the model's forward over `--prefill` tokens (one sequence, no cache, the last token's logits), tokens/s.
- `decode`: one decoding step of `--decode-batch` sequences with `--decode-context` cached tokens each (a static KV
  cache, rewound before each step), tokens/s = sequences / step time.

Times: a batch of back-to-back calls captured in a CUDA graph (`l2c.measure.CudaDevice.prepare`; if any side cannot be
captured every side runs eagerly, and `method` says so), replayed between CUDA events, the sides in random order per
repetition, median over repetitions. On a CPU (`--device cpu`, with `--tiny`) the same code runs eagerly with the host
clock and Triton's interpreter: the figures exercise the script and say nothing about performance; no roofline.
"""
from __future__ import annotations

import argparse
import copy
import inspect
import json
import math
import random
import statistics
import sys
from typing import Callable, Dict, List

import torch

import l2c
from l2c.dispatch import default_dispatcher, set_tuned_table
from l2c.devices import get_device
from l2c.measure import Problem, rotation_sets
from l2c.roofline import measure_ceilings
from l2c.tuned_table import load_table

SIDES = ("torch_eager", "torch_max_autotune", "l2c", "l2c_compiled")
DTYPES = {"fp16": (torch.float16, "f16"), "bf16": (torch.bfloat16, "bf16"), "fp32": (torch.float32, "f32")}
TOLERANCE = {"fp16": 1e-2, "bf16": 3e-2, "fp32": 1e-4}   # relative error of a side's output against torch eager's
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                hidden_act="silu", tie_word_embeddings=False)
TINY = dict(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            max_position_embeddings=256, hidden_act="silu", tie_word_embeddings=False)


def build_config(args):
    from transformers import LlamaConfig
    return LlamaConfig(num_hidden_layers=args.layers, **(TINY if args.tiny else LLAMA_8B))


def timed(device, sides: Dict[str, List[Callable]], reps: int, rng: random.Random, target_s: float = 2e-3):
    """(median seconds per call of each side, method): each side's calls (one per weight copy) run round-robin in
    batches captured together (CUDA graphs, or eagerly when any side cannot be captured), sides in random order."""
    for calls in sides.values():
        for call in calls:
            call()
    device.synchronize()
    one = max(device.time_runner(calls[0]) for calls in sides.values())
    launches = max(max(len(c) for c in sides.values()), min(100, math.ceil(target_s / max(one, 1e-7))))

    def batch(calls):
        def run():
            for i in range(launches):
                calls[i % len(calls)]()
        return run

    batches, method = device.prepare({name: batch(calls) for name, calls in sides.items()})
    for run in batches.values():   # one untimed replay each (graph upload, clocks)
        device.time_runner(run)
    samples = {name: [] for name in sides}
    for _ in range(reps):
        names = list(sides)
        rng.shuffle(names)
        for name in names:
            samples[name].append(device.time_runner(batches[name]) / launches)
    return {name: statistics.median(s) for name, s in samples.items()}, method


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.double()
    return ((got.double() - want).norm() / want.norm()).item()


def compiler(mode: str):
    """torch.compile of `fn(module, *args)`: one compiled function serves every weight copy (parameters are inputs)."""
    return torch.compile(lambda module, *args, **kwargs: module(*args, **kwargs), mode=mode, dynamic=False)


def served(fn) -> Dict[str, int]:
    """What served the GEMMs of one call of `fn`: the dispatcher's counts of tuned kernels and torch fallbacks."""
    before = default_dispatcher().stats   # a snapshot: read again after the call
    with torch.no_grad():
        fn()
    after = default_dispatcher().stats
    return {k: after[k] - before.get(k, 0) for k in after}


def counts(text: str) -> List[int]:
    """A comma-separated list of token counts; empty skips that part of the run."""
    return [int(t) for t in text.split(",") if t.strip()]


def mlp_rows(args, device, ceilings, model_cls_config, dtype_name, rng) -> List[dict]:
    from transformers.models.llama.modeling_llama import LlamaMLP
    dtype, short = DTYPES[dtype_name]
    config = model_cls_config
    hidden, inter = config.hidden_size, config.intermediate_size
    gate_up = lambda m: Problem(m, inter, hidden, dtype=short, out_dtype=short, layout_b="col", gate="silu")  # noqa: E731
    down = lambda m: Problem(m, hidden, inter, dtype=short, out_dtype=short, layout_b="col")  # noqa: E731
    tokens_list = counts(args.mlp_tokens)
    if not tokens_list:
        return []
    copies = max(rotation_sets(p, device.l2_bytes, cold=True) for m in tokens_list for p in (gate_up(m), down(m)))
    torch.manual_seed(0)
    with torch.device(device.torch_device):
        hf = [LlamaMLP(config).to(dtype).eval() for _ in range(copies)]
    ours = [l2c.nn.GatedMLP.from_hf(m).eval() for m in hf]
    compiled_torch, compiled_ours = compiler(args.compile_mode), compiler(args.compile_mode)
    rows = []
    for tokens in tokens_list:
        x = torch.randn(tokens, hidden, device=device.torch_device, dtype=dtype)
        with torch.no_grad():
            l2c.precompile(ours[0], x, timeout=args.prepare_timeout)
        calls = {"torch_eager": [lambda m=m: m(x) for m in hf],
                 "torch_max_autotune": [lambda m=m: compiled_torch(m, x) for m in hf],
                 "l2c": [lambda m=m: m(x) for m in ours],
                 "l2c_compiled": [lambda m=m: compiled_ours(m, x) for m in ours]}
        calls = {name: c for name, c in calls.items() if name in args.sides}
        with torch.no_grad():
            want = hf[0](x)
            errors = {name: rel_error(c[0](), want) for name, c in calls.items() if name != "torch_eager"}
            by = served(lambda: ours[0](x)) if "l2c" in calls else {}
            seconds, method = timed(device, calls, args.reps, rng)
        floor = ceilings.roofline_s(gate_up(tokens)) + ceilings.roofline_s(down(tokens)) if ceilings else None
        row = {"tokens": tokens, "dtype": dtype_name, "hidden": hidden, "intermediate": inter, "weight_copies": copies,
               "method": method, **{f"{name}_us": s * 1e6 for name, s in seconds.items()},
               "flops": gate_up(tokens).flops + down(tokens).flops,
               "bytes": gate_up(tokens).footprint_bytes() + down(tokens).footprint_bytes(),
               "roofline_us": floor * 1e6 if floor else None, "rel_error": errors, "served_by": by}
        row.update(_ratios(seconds, floor))
        rows.append(row)
        print(f"mlp {dtype_name} {tokens:>5} tokens: " + _line(seconds, row), flush=True)
    return rows


def _ratios(seconds: Dict[str, float], floor) -> dict:
    ours = seconds.get("l2c")
    compiled = seconds.get("l2c_compiled", ours)
    out = {"speedup_vs_eager": seconds["torch_eager"] / ours if ours and "torch_eager" in seconds else None,
           "speedup_vs_max_autotune": (seconds["torch_max_autotune"] / compiled
                                       if compiled and "torch_max_autotune" in seconds else None)}
    if floor is not None:
        out["roofline_fraction"] = floor / ours if ours else None
        out.update({f"{name}_roofline_fraction": floor / s for name, s in seconds.items() if name != "l2c"})
    else:
        out["roofline_fraction"] = None
    return out


def _line(seconds, row) -> str:
    text = "  ".join(f"{name} {s * 1e6:9.1f} us" for name, s in seconds.items())
    if row.get("speedup_vs_eager"):
        text += f"  vs eager {row['speedup_vs_eager']:.3f}x"
    if row.get("speedup_vs_max_autotune"):
        text += f"  vs max-autotune {row['speedup_vs_max_autotune']:.3f}x"
    if row.get("roofline_fraction"):
        text += f"  roofline {row['roofline_fraction']:.2f}"
    return text


def _forward_kwargs(model) -> Dict[str, str]:
    """The keyword names this transformers version's forward takes for the cache, the position of the cache's
    slots and how many logits to keep (they were renamed between versions)."""
    params = inspect.signature(model.forward).parameters
    return {"cache": "cache" if "cache" in params else "past_key_values",
            "cache_position": "cache_position" if "cache_position" in params else "",
            "logits_to_keep": next((p for p in ("logits_to_keep", "num_logits_to_keep") if p in params), "")}


def static_cache(model, batch: int, length: int, device, dtype):
    from transformers import StaticCache
    params = inspect.signature(StaticCache.__init__).parameters
    extra = dict(max_batch_size=batch, device=device, dtype=dtype) if "max_batch_size" in params else {}
    return StaticCache(config=model.config, max_cache_len=length, **extra)


def rewind(cache, length: int) -> None:
    """Put a static cache back at `length` tokens (its layers count their tokens on the device in newer versions;
    older ones write at the cache_position each call passes, so there is nothing to rewind)."""
    for layer in getattr(cache, "layers", ()):
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor):
            counter.fill_(length)


def model_rows(args, device, dtype_name, rng):
    from transformers import LlamaForCausalLM
    dtype, _ = DTYPES[dtype_name]
    config = build_config(args)
    torch.manual_seed(0)
    with torch.device(device.torch_device):
        ref = LlamaForCausalLM(config).to(dtype).eval()
    ours = l2c.nn.replace_mlps(copy.deepcopy(ref))
    names = _forward_kwargs(ref)
    models = {"torch_eager": ref, "torch_max_autotune": torch.compile(ref, mode=args.compile_mode, dynamic=False),
              "l2c": ours, "l2c_compiled": torch.compile(ours, mode=args.compile_mode, dynamic=False)}
    models = {name: m for name, m in models.items() if name in args.sides}
    dev = device.torch_device
    prefill, decode = [], []
    for tokens in counts(args.prefill):
        ids = torch.randint(0, config.vocab_size, (1, tokens), device=dev)
        kwargs = {"use_cache": False, **({names["logits_to_keep"]: 1} if names["logits_to_keep"] else {})}
        with torch.no_grad():
            l2c.precompile(lambda: ours(ids, **kwargs), timeout=args.prepare_timeout)
            want = ref(ids, **kwargs).logits[:, -1]
            errors = {n: rel_error(m(ids, **kwargs).logits[:, -1], want) for n, m in models.items() if n != "torch_eager"}
            by = served(lambda: ours(ids, **kwargs)) if "l2c" in models else {}
            seconds, method = timed(device, {n: [lambda m=m: m(ids, **kwargs)] for n, m in models.items()}, args.reps,
                                    rng, target_s=0)
        row = {"tokens": tokens, "dtype": dtype_name, "layers": config.num_hidden_layers, "method": method,
               **{f"{n}_tokens_per_s": tokens / s for n, s in seconds.items()},
               **{f"{n}_us": s * 1e6 for n, s in seconds.items()}, "rel_error": errors, "served_by": by}
        row.update({k: v for k, v in _ratios(seconds, None).items() if k != "roofline_fraction"})
        prefill.append(row)
        print(f"prefill {dtype_name} {tokens:>5} tokens: " + _line(seconds, row), flush=True)
    context = args.decode_context
    for batch in counts(args.decode_batch):
        caches = {n: static_cache(ref, batch, context + 1, dev, dtype) for n in models}
        history = torch.randint(0, config.vocab_size, (batch, context), device=dev)
        token = torch.randint(0, config.vocab_size, (batch, 1), device=dev)
        position = torch.full((batch, 1), context, device=dev)

        def step(name, model=None):
            model = model or models[name]
            cache = caches[name]
            rewind(cache, context)
            kwargs = {names["cache"]: cache, "use_cache": True, "position_ids": position}
            if names["cache_position"]:
                kwargs[names["cache_position"]] = torch.full((1,), context, device=dev)
            return model(token, **kwargs).logits[:, -1]

        with torch.no_grad():
            for name, model in models.items():   # the context, written into each side's cache once
                kwargs = {names["cache"]: caches[name], "use_cache": True}
                if names["cache_position"]:
                    kwargs[names["cache_position"]] = torch.arange(context, device=dev)
                ref(history, **kwargs) if name.startswith("torch") else ours(history, **kwargs)
            l2c.precompile(lambda: step("l2c", ours), timeout=args.prepare_timeout) if "l2c" in models else None
            want = step("torch_eager", ref)
            errors = {n: rel_error(step(n), want) for n in models if n != "torch_eager"}
            by = served(lambda: step("l2c", ours)) if "l2c" in models else {}
            seconds, method = timed(device, {n: [lambda n=n: step(n)] for n in models}, args.reps, rng)
        row = {"batch": batch, "context": context, "dtype": dtype_name, "layers": config.num_hidden_layers,
               "method": method, **{f"{n}_tokens_per_s": batch / s for n, s in seconds.items()},
               **{f"{n}_us": s * 1e6 for n, s in seconds.items()}, "rel_error": errors, "served_by": by}
        row.update({k: v for k, v in _ratios(seconds, None).items() if k != "roofline_fraction"})
        decode.append(row)
        print(f"decode {dtype_name} batch {batch:>4}: " + _line(seconds, row), flush=True)
    return prefill, decode


def mismatches(rows, dtype_key="dtype") -> List[str]:
    return [f"{row.get('tokens', row.get('batch'))} {row[dtype_key]} {name} {err:.2e}"
            for row in rows for name, err in row["rel_error"].items() if not err <= TOLERANCE[row[dtype_key]]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write (the schema of benchmarks/results/model_h200.json)")
    ap.add_argument("--table", help="tuned table JSON (default: the one l2c ships for this GPU)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="a tiny Llama config (hidden 64, MLP 160), for the CPU")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--mlp-tokens", default="1,16,128,512,2048,8192", help="the MLP block's token counts ('' skips it)")
    ap.add_argument("--prefill", default="128,512,2048,8192", help="prefill lengths, tokens of one sequence ('' skips)")
    ap.add_argument("--decode-batch", default="1,8,32,128,256", help="decode batch sizes ('' skips)")
    ap.add_argument("--decode-context", type=int, default=1024, help="tokens already cached per sequence")
    ap.add_argument("--sides", default=",".join(SIDES), help=f"a subset of {','.join(SIDES)}")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode of both compiled sides (default: max-autotune-no-cudagraphs on a GPU, "
                         "default on the CPU)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--prepare-timeout", type=float, default=900.0, help="seconds to wait for l2c's kernel builds")
    args = ap.parse_args(argv)
    args.sides = [s for s in args.sides.split(",") if s]
    if "torch_eager" not in args.sides or any(s not in SIDES for s in args.sides):
        ap.error(f"--sides: torch_eager and any of {', '.join(SIDES[1:])}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("llama_e2e: no CUDA GPU; run with --tiny --device cpu to exercise the script", file=sys.stderr)
        return 2
    if args.device == "cpu" and not args.tiny:
        ap.error("--device cpu runs only the --tiny model (the interpreter would take hours on 8B shapes)")
    if args.compile_mode is None:
        args.compile_mode = "max-autotune-no-cudagraphs" if args.device == "cuda" else "default"
    if args.table:   # on the CPU the dispatcher serves CPU tensors too (Triton's interpreter): for tests only
        set_tuned_table(load_table(args.table), allow_cpu=args.device == "cpu")
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, 64)   # a compiled function per shape and weight copy
    device = get_device(args.device)
    ceilings = measure_ceilings(device) if args.device == "cuda" else None
    rng = random.Random(0)
    result = {"gpu": device.name, "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "l2c": l2c.__version__, "command": " ".join(["python"] + sys.argv), "table": args.table,
              "compile_mode": args.compile_mode, "ceilings": ceilings.as_row() if ceilings else None,
              "config": build_config(args).to_dict(),
              "definitions": {
                  "speedup_vs_eager": "torch_eager_us / l2c_us",
                  "speedup_vs_max_autotune": "torch_max_autotune_us / l2c_compiled_us (l2c_us without that side)",
                  "roofline_fraction": "the MLP block's floor (sum of its gate_up and down GEMMs' max(bytes / read "
                                       "rate, FLOPs / dense rate), rates measured in this run) / l2c_us",
                  "rel_error": "||side - torch_eager|| / ||torch_eager|| of the block's output or the last logits"},
              "mlp": [], "prefill": [], "decode": []}
    if args.device == "cpu":
        from l2c.results_file import CPU_NOTE
        result["note"] = CPU_NOTE
    for dtype_name in args.dtypes.split(","):
        result["mlp"] += mlp_rows(args, device, ceilings, build_config(args), dtype_name, rng)
        prefill, decode = (model_rows(args, device, dtype_name, rng) if counts(args.prefill) or counts(args.decode_batch)
                           else ([], []))
        result["prefill"] += prefill
        result["decode"] += decode
        torch._dynamo.reset()   # the compiled functions hold this dtype's models: free them before the next
        if args.device == "cuda":
            torch.cuda.empty_cache()
    bad = mismatches(result["mlp"]) + mismatches(result["prefill"]) + mismatches(result["decode"])
    result["outputs_match"] = not bad
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if bad:
        print("llama_e2e: outputs differ from torch eager beyond tolerance: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
