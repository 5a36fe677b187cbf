"""Export: the tuned table (`<arch>.json`, docs/CONTRACTS.md) and the winning `.l2` specs, from the store."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..errors import DataFileError
from ..parser import parse_one
from ..tuned_table import TableError, entry_from_row, read_table_data
from .space import Problem
from .store import Store


def existing_entries(out_dir: Path, arch: str, gpu: str, protocol: str) -> List[dict]:
    """The entries of `out_dir`'s table for `arch`, which an export merges with (none where there is no table);
    DataFileError for one it must not touch: a file that is not a tuned table, one with malformed entries, or a table
    of another GPU or protocol (the export would replace it). `l2c tune` asks this before it tunes."""
    path = Path(out_dir) / f"{arch}.json"
    if not path.exists():
        return []
    try:
        old = read_table_data(path)
    except TableError as err:
        raise DataFileError(f"--export: {err}; move it away or export into another folder") from None
    if (old.get("gpu"), old.get("protocol")) != (gpu, protocol):
        raise DataFileError(f"--export: {path} is a table of {old.get('gpu')!r} measured by {old.get('protocol')!r}; "
                            f"this tune's is {gpu!r} by {protocol!r}: export into another folder (merging would "
                            f"replace it)")
    for i, row in enumerate(old["entries"]):
        try:
            entry_from_row(row)
        except (ValueError, TypeError) as err:
            raise DataFileError(f"--export: {path}: entries[{i}] is malformed ({err}); fix it or export into "
                                f"another folder") from None
    return old["entries"]


def check_export(out_dir: Path, problems: Sequence[Problem], gpu: str, protocol: str) -> None:
    """What `export` needs of `out_dir`, checked before a tune spends its time (and without making anything): its
    specs folder is a folder or can be made (no file in the way), and each architecture's table there is one the
    export may merge into (`existing_entries`)."""
    specs = Path(out_dir).absolute() / "specs"
    for folder in (specs, *specs.parents):
        if folder.exists():
            if not folder.is_dir():
                raise DataFileError(f"--export {out_dir}: {folder} is not a folder; the specs go in {specs}")
            break
    for arch in sorted({p.arch for p in problems}):
        existing_entries(out_dir, arch, gpu, protocol)


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
        table = {"format": 1, "arch": arch, "gpu": gpu, "protocol": protocol,
                 "entries": existing_entries(out_dir, arch, gpu, protocol)}
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
