"""The `l2c` command line: one subcommand module per job under `l2c/commands/`.

Every user-facing failure is an `L2Error`, a plain `UsageError`, a `DataFileError` (a damaged store or journal),
an `OSError` (where an output cannot be written) or a `MemoryError`, printed as one line on stderr with exit
status 2; no traceback reaches a user for bad input.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from .errors import BenchError, DataFileError, L2Error, describe_os_error

# Each module defines `add_parser(subparsers)`, which registers its subcommand with `func=run(args) -> int`.
COMMAND_MODULES = [
    "l2c.commands.compile",
    "l2c.commands.check",
    "l2c.commands.build",
    "l2c.commands.verify",
    "l2c.commands.table",
    "l2c.commands.propose",
    "l2c.commands.bench",
    "l2c.commands.report",
    "l2c.commands.tune",
    "l2c.commands.import_results",
    "l2c.commands.pack",
    "l2c.commands.warmup",
]


class UsageError(Exception):
    """A command-line mistake that is not about a spec (missing file, bad flag combination)."""


def seed(text: str) -> int:
    """An argparse type: a random seed torch's and Python's generators both take (0 to 2^63 - 1)."""
    value = int(text)
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"a seed is a whole number from 0 to 2^63 - 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="l2c", description="GEMM kernel compiler and tuner.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except L2Error as err:
        print(err.render(), file=sys.stderr)
        return 2
    except (UsageError, DataFileError, BenchError) as err:   # a bad input file (results, table) is one line too
        print(f"l2c {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early: not an error of ours
        sys.stderr.close()
        return 0
    except OSError as err:   # where an output goes: an existing file, no permission, a full disk, a symlink loop
        print(f"l2c {args.command}: error: {describe_os_error(err)}", file=sys.stderr)
        return 2
    except MemoryError as err:
        print(f"l2c {args.command}: error: out of memory{': ' + str(err) if str(err) else ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
