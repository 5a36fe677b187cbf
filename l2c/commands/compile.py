"""`l2c compile spec.l2`: validate each kernel and write its generated sources."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..errors import L2ValidationError
from ..lower import file_name, render
from . import output_dir, validated_kernels


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="generate Triton and/or CUTLASS sources from .l2 files")
    p.add_argument("specs", nargs="+", help=".l2 files")
    p.add_argument("--target", choices=["triton", "cutlass", "all"], default="all",
                   help="which target to lower to (all: every target the spec allows)")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("-o", "--output", default="l2c_out", help="output directory (default: l2c_out)")
    p.set_defaults(func=run)


def run(args) -> int:
    out_dir = Path(args.output)
    jobs = validated_kernels(args.specs, args.target, args.arch)   # all of them before any work
    _refuse_shared_outputs(jobs)
    output_dir(out_dir)
    for valid in jobs:
        dest = out_dir / valid.target / file_name(valid)
        output_dir(dest.parent)
        _write(dest, render(valid))
        print(f"wrote {dest}")
    return 0


def _refuse_shared_outputs(jobs) -> None:
    """Two kernels of one name (in two files) would be written to one output file, the second over the first."""
    first = {}
    for valid in jobs:
        key = (valid.target, file_name(valid))
        if key in first:
            o, p = first[key].spec.origin, valid.spec.origin
            raise L2ValidationError(f"kernel name {valid.name!r} is also used at {o.file}:{o.line}:{o.col}; both "
                                    f"would be written to {valid.target}/{file_name(valid)}", file=p.file,
                                    line=p.line, col=p.col, rule="unique")
        first[key] = valid


def _write(dest: Path, text: str) -> None:
    """Write through a temporary file renamed over `dest`, so a failed write (a full disk) leaves no half-written
    source; the file gets the usual permissions (open, not mkstemp's 0600)."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, dest)
    except OSError as err:   # named by the file the user asked for, not by the temporary one
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OSError(err.errno, err.strerror, str(dest)) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
