"""Subcommands of the `l2c` CLI, one module each (see l2c/cli.py)."""
from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import List


def validated_kernels(paths, requested_target: str, arch: str) -> List["ValidSpec"]:  # noqa: F821
    """Parse and validate every kernel of every file for the requested target(s), before any work is done.

    A spec restricted to another target than the requested one is skipped with a note on stderr; the first
    invalid spec raises its L2Error (the CLI prints it as file:line:col and exits 2).
    """
    from ..parser import parse_file
    from ..validate import targets_for, validate
    valids = []
    for path in paths:
        for spec in parse_file(path):
            targets = targets_for(spec, requested_target)
            if not targets:
                print(f"{path}: {spec.name}: skipped (the spec is for {spec.target} only)", file=sys.stderr)
            valids += [validate(spec, t, arch) for t in targets]
    return valids


def output_dir(path) -> Path:
    """Create the output directory `path` (and its parents) or raise an OSError naming what is in the way: a
    file, a symbolic link that leads nowhere or in a loop, a place without write permission."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        # the path itself, or the folder above it that is in the way
        blocker = next((p for p in (path, *path.parents)
                        if (p.is_symlink() and not p.exists()) or (p.exists() and not p.is_dir())), path)
        if blocker.is_symlink() and not blocker.exists():
            try:
                os.stat(blocker)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise OSError(err.errno, "a loop of symbolic links", str(blocker)) from None
            raise FileNotFoundError(errno.ENOENT, f"a symbolic link to {os.readlink(blocker)}, which does not exist",
                                    str(blocker)) from None
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", str(blocker)) from None
    return path
