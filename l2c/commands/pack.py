"""`l2c pack build` / `l2c pack verify`: the prebuilt pack of the shipped tables' CUTLASS kernels (`l2c.pack`).

`build` compiles, through the build cache (built kernels are reused), every CUTLASS kernel the dispatcher builds
for the tables' entries and writes the pack; it exits 1 if any kernel failed to build. `verify` renders the same
kernels without any compiler and exits 1, listing each, when the pack lacks one, holds one stale (another key:
the template, flags or CUTLASS version changed) or holds a damaged library. Neither needs a GPU.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .. import pack
from ..targets.cutlass.pack import PackError, default_pack_path


def add_parser(sub) -> None:
    p = sub.add_parser("pack", help="build or verify the prebuilt pack of the tuned tables' CUTLASS kernels")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    tables_help = "tuned table(s) whose kernels the pack holds (default: the shipped l2c/tuned/*.json)"

    b = actions.add_parser("build", help="compile the tables' CUTLASS kernels (build cache) and write the pack")
    b.add_argument("--table", action="append", help=tables_help)
    b.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="parallel nvcc processes")
    b.add_argument("-o", "--out", help="the pack to write (default: l2c/packs/<arch>.zip in the package)")
    b.set_defaults(func=run_build)

    v = actions.add_parser("verify", help="check, without a compiler, that the pack holds the tables' kernels")
    v.add_argument("--table", action="append", help=tables_help)
    v.add_argument("--pack", help="the pack to check (default: $L2C_PACK, else the shipped l2c/packs/<arch>.zip)")
    v.set_defaults(func=run_verify)


def _kernels(args):
    from ..cli import UsageError
    from ..tuned_table import TableError
    tables = args.table or pack.shipped_tables()
    try:
        arch, kernels, problems = pack.required_kernels(tables)
    except (TableError, PackError) as err:
        raise UsageError(str(err)) from None
    print(f"{len(kernels) - 1} CUTLASS kernels and l2c's checker for {arch} in "
          f"{', '.join(Path(t).name for t in tables)}")
    return arch, kernels, problems


def run_build(args) -> int:
    from ..targets.cutlass.toolchain import find_nvcc
    from ..cli import UsageError
    from ..errors import BuildError
    try:
        find_nvcc()   # before any work: the pack records the nvcc that builds its libraries
    except BuildError as err:
        raise UsageError(str(err)) from None
    arch, kernels, problems = _kernels(args)
    for problem in problems:
        print(f"FAILED {problem}")

    def report(kernel, error, seconds):
        if error is None:
            print(f"built {kernel.name} at {seconds:.0f}s: {kernel.label}", flush=True)
        else:
            print(f"FAILED {kernel.name} after {seconds:.0f}s: {kernel.label}: {error}", flush=True)

    out = args.out or default_pack_path(arch)
    try:
        written, failed = pack.build_pack(kernels, arch, out, args.jobs, report)
    except PackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    size = Path(written.path).stat().st_size
    files = len({entry.file for entry in written.entries.values()})
    print(f"wrote {written.path}: {len(written.entries)} kernels in {files} libraries, {size / 2**20:.2f} MiB; "
          f"{failed + len(problems)} failed")
    return 1 if failed or problems else 0


def run_verify(args) -> int:
    arch, kernels, problems = _kernels(args)
    path = args.pack or default_pack_path(arch)
    found, unused = pack.verify_pack(path, arch, kernels)
    problems += found
    for problem in problems:
        print(problem)
    if unused:
        print(f"{unused} librar{'y' if unused == 1 else 'ies'} in the pack no table asks for")
    if problems:
        print(f"{path}: FAILED ({len(problems)} problem{'s' if len(problems) != 1 else ''})")
        return 1
    print(f"{path}: ok, holds all {len(kernels) - 1} kernels and the checker")
    return 0
