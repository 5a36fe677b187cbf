"""`l2c import`: record `l2c bench` measurements in the tuner's results store.

A pool screened with `l2c bench` (one shape-generic kernel on many shapes) measures the same (problem, spec)
points a tune would try. Imported, they are what the tuner already knows: `l2c tune` takes a stored result
instead of measuring that point again (its trials are cached by problem and spec text), exports tables from
them, and the learned policy trains on them, every verified row with its measured speedup and every failed
one as a failure. A result keeps its spec's search-space point when the spec is one (the text is then the one
the tuner writes for that point, so later trials hit it); a spec outside the space (e.g. 32 split-K slices)
is stored without one: it is a cached measurement, not a training sample.
"""
from __future__ import annotations

import math
import sys
from datetime import datetime
from typing import Dict, Iterable, List, Tuple


# What an import counts per file: rows recorded, and those left out or kept as measurements only.
COUNTS = ("imported", "outside_space", "not_a_verdict", "stale", "unverified", "not_a_kernel")


def add_parser(sub) -> None:
    p = sub.add_parser("import", help="record `l2c bench` results in the tuner's results store")
    p.add_argument("results", nargs="+", help="JSON-lines files written by l2c bench (.jsonl or .jsonl.xz)")
    p.add_argument("--store", default=None, help="results store (SQLite file; default in the user data dir)")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--shapes", default=None,
                   help="only rows of these shapes (grid | llm | square | FILE): e.g. the shapes a tune will search")
    p.set_defaults(func=run)


def results_from_rows(rows: Iterable[dict], arch: str, spec_cache: dict) -> Tuple[List, Dict[str, int]]:
    """Store results for the kernel rows of one bench file, and counts of what was taken or left."""
    from l2c.build import build_id_of
    from l2c.commands.table import spec_text
    from l2c.errors import L2Error
    from l2c.ir import config_name
    from l2c.knobs import ANY
    from l2c.parser import parse_one
    from l2c.search.space import Problem, params_from_spec, spec_from_params
    from l2c.search.store import STATUSES, Result

    results, counts = [], dict.fromkeys(COUNTS, 0)
    points: Dict[tuple, Tuple[dict, str]] = {}   # (spec text, target, dtype, layout, batch) -> (point, stored text)
    gpu, when = None, 0.0
    for row in rows:
        if row.get("type") == "env":
            gpu = row.get("gpu")
            try:
                when = datetime.fromisoformat(str(row.get("date"))).timestamp()
            except ValueError:
                when = 0.0
            continue
        if row.get("type") != "result" or row.get("kernel") == "torch":
            continue
        if row.get("target") in ("dispatch", "torch"):   # a table or torch measured through a call, not a kernel
            counts["not_a_kernel"] += 1
            continue
        missing = [f for f in ("target", "dtype", "layout", "protocol") if not isinstance(row.get(f), str)]
        if missing:
            raise ValueError(f"a result row ({row.get('m')}x{row.get('n')}x{row.get('k')}) without "
                             f"{', '.join(repr(f) for f in missing)}: not a row l2c bench wrote")
        # bench statuses the store knows are verdicts on the kernel; `error` (an exception while timing, e.g. out
        # of memory) is not
        status = str(row.get("status"))
        if status not in STATUSES:
            counts["not_a_verdict"] += 1
            continue
        if gpu is None:
            raise ValueError("a result row comes before any environment row naming the GPU")
        if status == "ok" and not _verified_figures(row):   # a win the store would trust must be one l2c bench made
            counts["unverified"] += 1
            continue
        text = spec_text(row, spec_cache)
        if not text:
            raise ValueError(f"the spec of {row.get('name')} is neither in the row nor in {row.get('source')!r}")
        # the figures count as today's only if the row timed the build the current code makes of its spec
        current = row.get("build_id") is not None and row["build_id"] == build_id_of(text, str(row["target"]), arch)
        la, lb, lc = str(row["layout"]).split(",")
        problem = Problem(int(row["m"]), int(row["n"]), int(row["k"]), batch=int(row.get("batch", 1)),
                          dtype=str(row["dtype"]), layout_a=la, layout_b=lb, layout_c=lc, arch=arch,
                          gate=str(row.get("gate", "none")))   # a gated row: the gated problem's (l2c tune --gate)
        target = str(row["target"])
        memo_key = (text, target, problem.dtype, problem.layout, problem.batch, problem.gate)   # all the point needs
        if memo_key not in points:
            spec = parse_one(text, file=f"the spec of {row.get('name') or row.get('kernel')}")
            generic = spec.replace(name="_", problem_m=ANY, problem_n=ANY, problem_k=ANY)
            points[memo_key] = ({}, generic.replace(name=spec.name).to_l2())
            try:
                candidate = params_from_spec(spec, target)
                point = spec_from_params(candidate, problem, generic=True)
                # the point's kernel, or its twin with the other epilogue store (the tuner's choice per point,
                # `space.tuner_store`, not a searched knob): the row keeps the text of the kernel it measured
                if point.replace(name="_", epilogue_store=generic.epilogue_store) == generic:
                    points[memo_key] = (candidate, generic.replace(name=config_name(generic)).to_l2())
            except (ValueError, L2Error):
                pass
        params, text = points[memo_key]
        if not params:
            counts["outside_space"] += 1
        speedup = row.get("speedup") if status == "ok" else None
        results.append(Result(problem=problem.key(), spec=text, target=target, gpu=gpu, protocol=str(row["protocol"]),
                              status=status, tflops=row.get("candidate_tflops") if status == "ok" else None,
                              baseline_tflops=row.get("baseline_tflops"), speedup=speedup,
                              reason=str(row.get("reason") or ""), source="import", params=params, time=when,
                              build=None if current else "unknown"))
        counts["imported"] += 1
        counts["stale"] += not current
    return results, counts


def _verified_figures(row) -> bool:
    """Whether an `ok` row is what `l2c bench` writes for a kernel it verified: `verified` true and finite,
    non-negative figures (a hand-made row could otherwise become a tuned table's winner)."""
    def figure(name):
        value = row.get(name)
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return row.get("verified") is True and all(figure(f) for f in ("speedup", "candidate_tflops", "baseline_tflops"))


def run(args) -> int:
    from ..errors import BenchError, L2Error
    from ..results_file import read_rows
    from ..cli import UsageError
    from l2c.search.store import Store, default_store_path

    from ..arch import ARCHS
    if args.arch not in ARCHS:   # it is part of every stored problem's key: a tune of that arch reads them
        raise UsageError(f"--arch {args.arch!r}: l2c knows {', '.join(sorted(ARCHS))}")
    wanted = None
    if args.shapes:
        from l2c.shapes import load_shapes
        try:
            wanted = {(s.m, s.n, s.k) for s in load_shapes(args.shapes)}
        except (OSError, ValueError) as err:
            raise UsageError(f"--shapes: {err}") from None

    def rows_of(path):
        for row in read_rows(path):
            if wanted is None or row.get("type") != "result" or (row.get("m"), row.get("n"), row.get("k")) in wanted:
                yield row

    store = Store(args.store or default_store_path())
    cache: dict = {}
    total = dict.fromkeys(COUNTS, 0)
    for path in args.results:
        try:
            results, counts = results_from_rows(rows_of(path), args.arch, cache)
        except (BenchError, OSError) as err:
            raise UsageError(str(err)) from None
        except L2Error as err:   # a row's spec that does not parse
            raise UsageError(f"{path}: {err.render()}") from None
        except (ValueError, KeyError, TypeError) as err:   # a row whose fields are not what l2c bench writes
            raise UsageError(f"{path}: {err}") from None
        store.record_many(results)
        print(f"{path}: {counts['imported']} result(s) recorded ({counts['outside_space']} outside the search space, "
              f"kept as measurements only; {counts['stale']} of another build than l2c makes now, kept but not "
              f"used); {counts['not_a_verdict']} error row(s), {counts['unverified']} win(s) without verified "
              f"figures and {counts['not_a_kernel']} row(s) of a table or torch measured through a call skipped")
        for key in total:
            total[key] += counts[key]
    print(f"{store.path}: {total['imported']} result(s) imported; the store holds {store.count()}", file=sys.stderr)
    return 0
