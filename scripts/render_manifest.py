"""Hashes of the source every committed spec renders to: the guard that a template change meant for new specs
leaves every existing kernel's code (and so its build-cache key and its measurements) as it was.

The corpus is every spec in examples/*.l2, benchmarks/*.l2 and the entries of l2c/tuned/*.json, plus a feature
matrix that reaches every branch of the GEMM templates (`feature_matrix`), rendered for each target it validates for (Triton split-K kernels under both `split_k reduce` reductions).
`python scripts/render_manifest.py --write` records the hashes in tests/data/rendered_sources.json;
tests/test_rendered_corpus.py checks that rendering still gives them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Dict

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "tests" / "data" / "rendered_sources.json"


def corpus_texts():
    """(where, spec text) of every committed spec."""
    for pattern in ("examples/*.l2", "benchmarks/*.l2"):
        for path in sorted(ROOT.glob(pattern)):
            yield str(path.relative_to(ROOT)), path.read_text()
    for path in sorted((ROOT / "l2c" / "tuned").glob("*.json")):
        for i, entry in enumerate(json.loads(path.read_text())["entries"]):
            yield f"{path.relative_to(ROOT)}#{i}", entry["spec"]


def feature_matrix():
    """Specs crossing the knobs the GEMM templates branch on, so that a branch no committed spec takes is guarded too."""
    from itertools import product
    from l2c.ir import KernelSpec
    specs = []
    for i, (types, layouts, dims, split, launch, epilogue) in enumerate(product(
            (("f16", "f32", "f16"), ("f16", "f16", "f16"), ("bf16", "f32", "bf16"), ("f32", "f32", "f32")),
            (("row", "row", "row"), ("col", "col", "col"), ("row", "col", "row")),
            ((64, 128, 256, 1), ("any", "any", "any", "any"), (100, 70, 300, 3)),
            ((1, "workspace"), (4, "workspace"), (3, "atomic"), (2, "parallel")),
            (("no", "pointer", 1, "m"), ("yes", "pointer", 8, "n"), ("no", "tma", 4, "m"), ("yes", "tma_device", 8, "m")),
            ((1.0, 0.0, "none", "none"), (0.5, -1.0, "col", "gelu"), (2.0, 1.0, "row", "silu")))):
        (a, acc, c), (la, lb, lc), (m, n, k, batch) = types, layouts, dims
        slices, mode = split
        persistent, loads, group, raster = launch
        alpha, beta, bias, act = epilogue
        specs.append(KernelSpec(
            name=f"matrix{i}", types_a=a, types_b=a, types_acc=acc, types_c=c, layout_a=la, layout_b=lb,
            layout_c=lc, problem_m=m, problem_n=n, problem_k=k, problem_batch=batch, tile_m=64, tile_n=128,
            tile_k=32, split_k_slices=slices, split_k_mode=mode, launch_persistent=persistent, launch_loads=loads,
            swizzle_group=group, swizzle_raster=raster, epilogue_alpha=alpha, epilogue_beta=beta,
            epilogue_bias=bias, epilogue_activation=act, launch_swap="yes" if i % 2 else "no"))
    # the gated epilogues of Triton's two families, each load path and layout
    for i, (gate, family, loads, layout, dims, bias) in enumerate(product(
            ("silu", "gelu_tanh"), ("gemm", "gemv"), ("pointer", "tma", "tma_device"), ("row", "col"),
            ((64, 128, 256, 1), ("any", "any", "any", 1)), ("none", "col"))):
        if family == "gemv" and loads != "pointer":
            continue
        m, n, k, batch = dims
        specs.append(KernelSpec(
            name=f"gated{i}", types_a="f16", types_b="f16", types_c="f16", layout_a=layout, layout_b=layout,
            problem_m=m, problem_n=n, problem_k=k, problem_batch=batch, launch_family=family, launch_loads=loads,
            tile_m=4 if family == "gemv" else 64, tile_n=32 if family == "gemv" else 64, tile_k=64,
            epilogue_gate=gate, epilogue_bias=bias, epilogue_alpha=0.5 if i % 3 == 0 else 1.0))
    # the gated epilogue of the CUTLASS target's CUDA-core gemv (B column-major), with and without K slices and bias
    for i, (gate, slices, bias, dtype) in enumerate(product(("silu", "gelu_tanh"), (1, 2), ("none", "col"),
                                                            ("f16", "bf16"))):
        specs.append(KernelSpec(
            name=f"gatedgemv{i}", target="cutlass", types_a=dtype, types_b=dtype, types_c=dtype, layout_b="col",
            launch_family="gemv", launch_warps=4, launch_evict="first", tile_m=2, tile_n=16, tile_k=256,
            split_k_slices=slices, epilogue_gate=gate, epilogue_bias=bias, epilogue_alpha=0.5 if i % 3 == 0 else 1.0))
    # l2c's staged epilogue in each schedule, plain and gated (the CUTLASS GEMM's gate: tile n of each half of B)
    for i, (schedule, tile_m, tile_n, gate, bias) in enumerate(product(
            ("basic", "pingpong", "cooperative"), (128,), (48, 64, 96, 128), ("none", "silu", "gelu_tanh"),
            ("none", "col"))):
        specs.append(KernelSpec(
            name=f"staged{i}", target="cutlass", types_a="bf16" if i % 2 else "f16", types_b="bf16" if i % 2 else "f16",
            types_c="bf16" if i % 2 else "f16", layout_b="col", tile_m=tile_m, tile_n=tile_n, tile_k=64,
            launch_schedule=schedule, cluster_m=2 if i % 3 == 0 else 1, epilogue_gate=gate, epilogue_bias=bias,
            epilogue_alpha=0.5 if i % 5 == 0 else 1.0, epilogue_store="staged"))
    return specs


def rendered_hashes() -> Dict[str, str]:
    """`where:kernel:target[:reduce]` -> sha256 of the rendered source, for every spec of the corpus."""
    from l2c.errors import L2ValidationError
    from l2c.lower import render
    from l2c.parser import parse
    from l2c.validate import targets_for, validate
    hashes: Dict[str, str] = {}
    corpus = [(where, spec) for where, text in corpus_texts() for spec in parse(text, where)]
    corpus += [("matrix", spec) for spec in feature_matrix()]
    for where, spec in corpus:
        for target in targets_for(spec):
            try:
                valid = validate(spec, target)
            except L2ValidationError:
                continue
            reduces = ("inkernel", "finalize") if target == "triton" and spec.split_k_slices > 1 else ("",)
            for reduce in reduces:
                if reduce and spec.split_k_mode == "workspace":
                    valid = validate(spec.replace(split_k_reduce=reduce), target)
                key = ":".join(x for x in (where, spec.name, target, reduce) if x)
                hashes[key] = hashlib.sha256(render(valid).encode()).hexdigest()
    return hashes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"record the hashes in {MANIFEST.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    hashes = rendered_hashes()
    if args.write:
        MANIFEST.write_text(json.dumps(hashes, indent=0, sort_keys=True) + "\n")
        print(f"{len(hashes)} rendered sources recorded in {MANIFEST.relative_to(ROOT)}")
        return 0
    recorded = json.loads(MANIFEST.read_text())
    changed = sorted(k for k in recorded.keys() | hashes.keys() if recorded.get(k) != hashes.get(k))
    for key in changed:
        print(f"changed: {key}")
    print(f"{len(hashes)} rendered, {len(changed)} differ from the manifest")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
