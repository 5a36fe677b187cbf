"""The build cache shared by every target: where built kernels live, how they are keyed, and a lock.

A build is keyed by a content hash of everything that determines its output (generated source, compiler
flags, toolchain versions), so a changed template, flag or compiler never reuses a stale artifact, and
an unchanged one is never rebuilt. Builders write into `cache_dir(target)` under `locked(path)` and
publish with `write_atomic`, so concurrent builds of the same kernel (a tuner's worker pool, several
processes) neither race nor see half-written files.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Union

import filelock
import platformdirs

from . import settings

ENV_VAR = "L2C_CACHE_DIR"


def cache_dir(*parts: str) -> Path:
    """The cache root (env L2C_CACHE_DIR, else the user cache dir for "l2c"), or a subfolder; created.

    Always absolute: builders run compilers in their own working directories, where a relative
    L2C_CACHE_DIR (e.g. `.l2c_cache`) would name a different place.
    """
    root = settings.value(ENV_VAR) or platformdirs.user_cache_dir("l2c")
    path = Path(root).expanduser().resolve().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def content_hash(*parts: str) -> str:
    """SHA-256 hex digest of the parts; each is length-prefixed so ("ab", "c") != ("a", "bc")."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode()
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


@contextlib.contextmanager
def locked(path: Union[str, Path], timeout: float = -1) -> Iterator[None]:
    """Hold an inter-process lock on `path` (the lock file is `path` + ".lock"); -1 waits forever."""
    with filelock.FileLock(f"{path}.lock", timeout=timeout):
        yield


def write_atomic(path: Union[str, Path], data: Union[str, bytes]) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`: readers see all or nothing."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
