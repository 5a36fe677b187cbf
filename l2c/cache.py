"""The build cache shared by every target: where built kernels live, how they are keyed, and a lock.

A build is keyed by a content hash of everything that determines its output (generated source, compiler
flags, toolchain versions), so a changed template, flag or compiler never reuses a stale artifact, and
an unchanged one is never rebuilt. Builders write into `cache_dir(target)` under `locked(path)` and
publish with `write_atomic`, so concurrent builds of the same kernel (a tuner's worker pool, several
processes) neither race nor see half-written files.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import struct
import tempfile
from importlib import resources
from pathlib import Path
from typing import Dict, Iterator, Optional, Union

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


@functools.lru_cache(maxsize=1)
def code_identity() -> str:
    """l2c's version and a digest of its own code (its Python modules and kernel templates), which decides how a
    kernel is built, launched and verified: records of verifications and online decisions made by other code are
    not trusted, and the version string alone does not change between commits. About 2 ms, once per process."""
    from . import __version__
    digest = hashlib.sha256()
    for root in (Path(__file__).parent, Path(str(resources.files("l2c._templates")))):
        for path in sorted(root.rglob("*")):
            if path.suffix in (".py", ".j2", ".cu") and path.is_file():
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"


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
    """Write `data` to a temporary file beside `path`, flush it to disk, then rename it over `path`: readers see all
    or nothing, also after a crash (without the flush a rename can reach the disk before the data)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)   # as a file open() creates (mkstemp's 0600 hid it from other users of a shared cache)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# ELF64 little-endian (x86-64, aarch64): the header's table offsets and entry sizes, and a program header's extent.
_ELF_HEADER = struct.Struct("<16xHHIQQQIHHHHHH")
_PROGRAM_HEADER = struct.Struct("<IIQQQQQQ")


def intact_library(path: Union[str, Path]) -> bool:
    """Whether `path` is a whole shared library: an ELF64 file holding every byte its program headers load and its
    section header table. dlopen maps a truncated library (a copy cut short, a disk full) and the process dies of
    SIGBUS on first touching the missing pages; a cached library that fails this is rebuilt or installed again,
    never loaded. Reads the headers only (microseconds)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_ELF_HEADER.size)
            if len(head) < _ELF_HEADER.size or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return False
            (_, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = _ELF_HEADER.unpack(head)
            if phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
                return False
            if phnum and phentsize < _PROGRAM_HEADER.size:
                return False
            f.seek(phoff)
            table = f.read(phnum * phentsize)
    except OSError:
        return False
    for i in range(phnum):
        _, _, offset, _, _, filesz, _, _ = _PROGRAM_HEADER.unpack_from(table, i * phentsize)
        if offset + filesz > size:
            return False
    return True


def load_library(path: Union[str, Path]):
    """`ctypes.CDLL(path)` for an `intact_library`; OSError (as dlopen's own failures) for any other file."""
    import ctypes
    if not intact_library(path):
        raise OSError(f"{path} is not a whole shared library (truncated or damaged): not loaded")
    return ctypes.CDLL(str(path))


class KeyedRecords:
    """A JSON map persisted in the cache for one identity (a GPU, its driver and the l2c version, say): what one
    process learned, later processes of the same identity reuse. The file is named by a hash of the identity, so
    another identity starts empty; concurrent writers merge under the file lock; an unreadable file reads empty."""

    def __init__(self, folder: str, prefix: str, identity: Dict[str, object]):
        self.key = dict(identity)
        digest = content_hash(json.dumps(self.key, sort_keys=True))[:16]
        self.path = cache_dir(folder) / f"{prefix}_{digest}.json"
        self.entries: Dict[str, object] = self._on_disk()

    @classmethod
    def of_gpu(cls, folder: str, prefix: str, gpu: str, driver: str, version: Optional[str] = None,
               **more: object) -> "KeyedRecords":
        """The records of one GPU (name), driver and l2c code (this one, `code_identity`, unless given), and of
        whatever else `more` names."""
        return cls(folder, prefix, {"gpu": gpu, "driver": driver, "l2c": version or code_identity(), **more})

    def _on_disk(self) -> Dict[str, object]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError, RecursionError):
            return {}
        if not isinstance(data, dict) or data.get("key") != self.key or not isinstance(data.get("entries"), dict):
            return {}
        return data["entries"]

    def put(self, name: str, value: object) -> None:
        """Record `name` = `value` here and in the file, over whatever other processes recorded meanwhile (which this
        process then reads: its own older records never overwrite theirs, nor bring back one deleted)."""
        with locked(self.path):
            merged = {**self._on_disk(), name: value}
            write_atomic(self.path, json.dumps({"key": self.key, "entries": merged}, indent=1))
            self.entries = merged
