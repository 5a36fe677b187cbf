"""Export: the tuned table (`<arch>.json`, docs/CONTRACTS.md) and the winning `.l2` specs, from the store."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..parser import parse_one
from .space import Problem
from .store import Store


def export(store: Store, problems: Sequence[Problem], gpu: str, protocol: str, out_dir: Path,
           confirmed_since: Optional[float] = None) -> Dict[str, Path]:
    """Write `<arch>.json` (merged with an existing table) and `specs/*.l2`; returns the tables written. With
    `confirmed_since` (a confirm() round), a shape's winner is its best result confirmed in that round."""
    out_dir = Path(out_dir)
    (out_dir / "specs").mkdir(parents=True, exist_ok=True)
    by_arch: Dict[str, List[dict]] = {}
    for p in problems:
        best = store.best(p.key(), gpu, protocol, confirmed_since=confirmed_since)
        if best is None:
            continue
        lay = "".join(x[0] for x in (p.layout_a, p.layout_b, p.layout_c))
        kind = f"gated_{p.gate}" if p.gated else "gemm"   # a plain problem's glob below never meets a gated one's
        name = f"{kind}_{p.shape}_{p.dtype}_{lay}_{best.target}"
        text = parse_one(best.spec).to_l2()   # keeps its knob-derived name: shapes sharing it share one build
        for stale in (out_dir / "specs").glob(f"{kind}_{p.shape}_{p.dtype}_{lay}_*.l2"):
            stale.unlink()   # an earlier export's winner for this shape, possibly of the other target
        (out_dir / "specs" / f"{name}.l2").write_text(text)
        entry = {"m": p.m, "n": p.n, "k": p.k, "batch": p.batch, "dtype": p.dtype, "layout": p.layout,
                 "target": best.target, "spec": text, "tflops": best.tflops, "baseline_tflops": best.baseline_tflops,
                 "speedup": best.speedup}
        if p.gated:   # served only to gated calls (l2c.gated_matmul, l2c.nn.GatedMLP)
            entry["gate"] = p.gate
        by_arch.setdefault(p.arch, []).append(entry)
    written = {}
    for arch, entries in by_arch.items():
        path = out_dir / f"{arch}.json"
        table = {"format": 1, "arch": arch, "gpu": gpu, "protocol": protocol, "entries": []}
        if path.exists():
            old = json.loads(path.read_text())
            if old.get("protocol") == protocol and old.get("gpu") == gpu:
                table["entries"] = old.get("entries", [])
        key = lambda e: (e["m"], e["n"], e["k"], e.get("batch", 1), e["dtype"], e["layout"],
                         e.get("gate", "none"))
        merged = {key(e): e for e in table["entries"]}
        merged.update({key(e): e for e in entries})
        table["entries"] = sorted(merged.values(), key=key)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(table, indent=1) + "\n")
        tmp.replace(path)
        written[arch] = path
    return written
