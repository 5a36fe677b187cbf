#!/usr/bin/env python
"""GPU check of l2c's checker (`l2c.checker`, what verifies a prebuilt kernel on a caller's thread) against
`l2c.verify`, the torch-based verification it stands in for.

    python scripts/checker_check.py --out checker_check.json [--count 16]

For a sample of the shipped tables' plain CUTLASS entries whose kernel the pack holds (both dtypes, every layout
they have, bias none and per column), at the entry's shape and at a ragged M inside its range:
- the correct kernel passes both checks;
- the kernel with a fault injected into every output it writes fails both: one element off by 1% (bf16: 10%), one
  element left unwritten (NaN), a 3x3 block zeroed, eight columns replaced by the eight before them, the last row
  unwritten, one element a unit in the last place off (found by the inputs where the result is exact), one element
  stored past the output's end; and kernels that write into B, or err only on a B with a padded leading dimension.
Also the seconds of each check (warm) and the checker's relative error against verify's. Exits 1 on any
disagreement.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch

from l2c import checker
from l2c.build import build
from l2c.dispatch import _validated
from l2c.pack import shipped_tables
from l2c.prepare import Job
from l2c.tuned_table import load_table, served_entries, served_spec
from l2c.verify import verify


class Faulty:
    """A kernel whose every output gets `fault(out)` after the real kernel wrote it."""

    def __init__(self, kernel, fault):
        self.kernel, self.fault, self.valid = kernel, fault, kernel.valid

    def __call__(self, a, b, c=None, bias=None, out=None):
        result = self.kernel(a, b, c=c, bias=bias, out=out)
        self.fault(result)
        return result


def _off_by_a_percent(out):
    """1% in f16 (2.6 of its units; the elementwise bound allows about 0.4%); 10% in bf16, whose unit is 0.4%."""
    out[out.shape[0] // 2, out.shape[1] // 3] *= 1.01 if out.dtype == torch.float16 else 1.1


def _unwritten_element(out):
    out[out.shape[0] - 1, out.shape[1] // 2] = float("nan")


def _zero_block(out):
    out[:3, -3:] = 0


def _neighbour_columns(out):
    """Eight columns read from the eight before them (a tile offset off by eight): with one row, a single column
    copied from its neighbour lands within its bound about 2% of the time in bf16."""
    j = max(8, out.shape[1] // 2)
    out[:, j:j + 8] = out[:, j - 8:j].clone()


def _unwritten_row(out):
    out[-1, :] = float("nan")


def _one_unit_off(out):
    """One element a unit in the last place off: within the bound of normal inputs, not exact on integer ones."""
    i, j = out.shape[0] // 2, out.shape[1] // 3
    out[i, j] = torch.nextafter(out[i, j], torch.tensor(float("inf"), dtype=out.dtype, device=out.device))


def _past_the_end(out):
    """One element stored just past the output's last one (the verified output sits between guards; the first
    check fails, so no allocating call, whose output has no guard, is made)."""
    out.as_strided((1,), (1,), out.storage_offset() + out.numel()).fill_(0)


FAULTS = {"off_by_a_percent": _off_by_a_percent, "unwritten_element": _unwritten_element,
          "zero_block": _zero_block, "neighbour_columns": _neighbour_columns, "unwritten_row": _unwritten_row,
          "one_unit_off": _one_unit_off, "past_the_end": _past_the_end}


class WritesIntoB(Faulty):
    """A kernel that also adds 1 to its B operand's first element."""

    def __init__(self, kernel):
        super().__init__(kernel, lambda out: None)

    def __call__(self, a, b, c=None, bias=None, out=None):
        result = self.kernel(a, b, c=c, bias=bias, out=out)
        b[0, 0] += 1
        return result


class WrongWhenPadded(Faulty):
    """A kernel that ignores B's leading dimension: where it exceeds B's extent, B's memory is read as if packed
    (the rows past the first come from the wrong places), as a kernel whose stride argument was dropped would.
    (A fault of +1 at one element hid inside the elementwise bound of a large bf16 output.)"""

    def __init__(self, kernel):
        super().__init__(kernel, lambda out: None)

    def __call__(self, a, b, c=None, bias=None, out=None):
        rows, cols = b.shape
        packed = (cols, 1) if b.stride(1) == 1 else (1, rows)
        if b.stride() != packed:
            b = b.as_strided(b.shape, packed, b.storage_offset())
        return self.kernel(a, b, c=c, bias=bias, out=out)


WRAPPED_FAULTS = {"writes_into_b": WritesIntoB, "wrong_when_padded": WrongWhenPadded}


def _timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out")
    p.add_argument("--count", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("checker_check: needs a GPU", file=sys.stderr)
        return 2
    if not checker.prepare():
        print("checker_check: l2c's checker cannot be loaded or built", file=sys.stderr)
        return 2
    entries = [e for path in shipped_tables() for e in served_entries(load_table(path))
               if e.target == "cutlass" and e.gate == "none" and e.batch == 1]
    rng = random.Random(args.seed)
    by_kind = {}
    for e in entries:
        by_kind.setdefault((e.dtype, e.layout), []).append(e)
    picked = []
    while len(picked) < args.count and any(by_kind.values()):
        for kind in sorted(by_kind):
            if by_kind[kind] and len(picked) < args.count:
                picked.append(by_kind[kind].pop(rng.randrange(len(by_kind[kind]))))
    rows, failures = [], 0
    for i, entry in enumerate(picked):
        lo, hi = (entry.m_lo, entry.m_hi) if entry.serves_range else (entry.m, entry.m)
        ms = sorted({entry.m, rng.randint(lo, hi)} if hi > lo else {entry.m})
        for m in ms:
            has_bias = i % 2 == 1
            spec = served_spec(entry, m, has_bias, "none")
            job = Job(spec.to_l2(), "cutlass", "sm_90", m, entry.n, entry.k, "cuda")
            valid = _validated(job)
            row = {"dtype": entry.dtype, "layout": entry.layout, "m": m, "n": entry.n, "k": entry.k,
                   "bias": has_bias, "kernel": valid.name, "checkable": checker.checkable(spec, m, entry.n, entry.k)}
            if not row["checkable"]:
                rows.append(row)
                continue
            kernel = build(valid)
            got, row["checker_s"] = _timed(lambda: checker.verify(kernel, m, entry.n, entry.k))
            ref, row["verify_s"] = _timed(lambda: verify(kernel, m, entry.n, entry.k))
            row.update(checker_ok=got.ok, verify_ok=ref.ok, checker_rel=got.rel_error, verify_rel=ref.rel_error,
                       checker_reason=got.reason, verify_reason=ref.reason)
            ok = got.ok and ref.ok
            row["faults"] = {}
            for name, bad in [*((name, Faulty(kernel, fault)) for name, fault in FAULTS.items()),
                              *((name, wrap(kernel)) for name, wrap in WRAPPED_FAULTS.items())]:
                fault_got = checker.verify(bad, m, entry.n, entry.k)
                fault_ref = verify(bad, m, entry.n, entry.k)
                row["faults"][name] = {"checker": fault_got.ok, "verify": fault_ref.ok,
                                       "checker_reason": fault_got.reason[:300]}
                ok = ok and not fault_got.ok and not fault_ref.ok
            row["pass"] = ok
            failures += not ok
            print(json.dumps({k: row[k] for k in ("dtype", "layout", "m", "n", "k", "bias", "pass", "checker_s",
                                                  "verify_s")}), flush=True)
            rows.append(row)
    checked = [r for r in rows if r.get("checkable")]
    summary = {"checked": len(checked), "failures": failures, "not_checkable": len(rows) - len(checked),
               "median_checker_s": sorted(r["checker_s"] for r in checked)[len(checked) // 2] if checked else None,
               "median_verify_s": sorted(r["verify_s"] for r in checked)[len(checked) // 2] if checked else None}
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "rows": rows, "device": torch.cuda.get_device_name()}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
