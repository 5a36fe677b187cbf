"""`l2c table RESULTS.jsonl -o TABLE.json`: a tuned table from measured bench results.

For every shape, the fastest verified candidate of the results file (one protocol) becomes the table entry,
if its speedup over torch.matmul is at least `--min-speedup`. Choosing the best of several candidates on the
same measurements favours lucky draws (a winner's curse), so the default margin, 1.05, is the run-to-run
spread of identical kernels on the H200: an entry that clears it is a win, not noise. The table has the
format of docs/CONTRACTS.md, which `l2c.matmul`, `l2c bench` and `l2c tune --export` share.
"""
from __future__ import annotations

import json
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("table", help="build a tuned table from l2c bench results (per-shape best candidate)")
    p.add_argument("results", nargs="+", help="JSON-lines files written by l2c bench")
    p.add_argument("-o", "--output", required=True, help="tuned table JSON to write")
    p.add_argument("--protocol", default="kernel")
    p.add_argument("--min-speedup", type=float, default=1.05)
    p.add_argument("--arch", default="sm_90")
    p.set_defaults(func=run)


def spec_text(row, cache) -> str:
    """The measured spec's canonical text: from the row, or from the `.l2` file it names (`source`)."""
    if row.get("spec"):
        return row["spec"]
    from ..errors import L2Error
    from ..parser import parse_file
    source = row.get("source", "")
    if source not in cache:
        try:
            if source.endswith(".l2"):
                cache[source] = {s.name: s.to_l2() for s in parse_file(source)}
            elif source.endswith(".json"):
                from ..parser import parse_one
                entries = json.loads(Path(source).read_text()).get("entries", [])
                cache[source] = {parse_one(e["spec"]).name: e["spec"] for e in entries}
            else:
                cache[source] = {}
        except (L2Error, OSError, ValueError, KeyError):
            cache[source] = {}
    return cache[source].get(row.get("name"), "")


def best_rows(rows, protocol: str, min_speedup: float):
    """The best verified non-torch row per (shape, dtype, layout) at or above `min_speedup`."""
    best, cache = {}, {}
    for r in rows:
        if r.get("type") != "result" or r.get("status") != "ok" or r.get("protocol") != protocol:
            continue
        if r.get("kernel") == "torch" or r.get("speedup") is None:
            continue
        r = dict(r, spec=spec_text(r, cache))
        if not r["spec"]:
            continue
        key = (r["m"], r["n"], r["k"], r.get("batch", 1), r["dtype"], r["layout"])
        if key not in best or r["speedup"] > best[key]["speedup"]:
            best[key] = r
    return [r for r in best.values() if r["speedup"] >= min_speedup]


def run(args) -> int:
    from ..bench import read_rows
    from ..cli import UsageError
    rows, gpus = [], set()
    for path in args.results:
        for r in read_rows(path):
            rows.append(r)
            if r.get("type") == "env" and r.get("gpu"):
                gpus.add(r["gpu"])
    if len(gpus) > 1:
        raise UsageError(f"results from different GPUs: {sorted(gpus)}")
    chosen = best_rows(rows, args.protocol, args.min_speedup)
    entries = [{"m": r["m"], "n": r["n"], "k": r["k"], "batch": r.get("batch", 1), "dtype": r["dtype"],
                "layout": r["layout"], "target": r["target"], "spec": r["spec"],
                "tflops": r["candidate_tflops"], "baseline_tflops": r["baseline_tflops"], "speedup": r["speedup"]}
               for r in sorted(chosen, key=lambda r: (r["m"], r["n"], r["k"]))]
    table = {"format": 1, "arch": args.arch, "gpu": next(iter(gpus), None), "protocol": args.protocol,
             "min_speedup": args.min_speedup, "sources": [str(p) for p in args.results], "entries": entries}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {out}: {len(entries)} shape(s) at >= {args.min_speedup}x in the {args.protocol} protocol")
    return 0
