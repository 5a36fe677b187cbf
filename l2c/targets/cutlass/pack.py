"""The prebuilt pack's format: compiled CUTLASS libraries shipped with l2c, so that the shipped tables' kernels need
no nvcc.

One xz-compressed tar per architecture (`l2c/packs/sm_90.tar.xz`, `L2C_PACK=path` uses another) holds the
shared libraries and, as its first member, `manifest.json`: per library the spec name and text, the key (a hash
of rendered source, nvcc flags and CUTLASS version: `toolchain.pack_key`, which a machine without nvcc can
compute), the nvcc and CUDA versions that built it, its file name, size and sha256.

The build cache asks the pack on a miss (`build.compile_source`); an entry is used only for the same key and,
where nvcc is installed, the same nvcc version, and only after its sha256 matches. A changed template or flag
gives another key, so a stale entry is never used: the kernel is built with nvcc instead. What the pack must hold
and how it is built and verified is `l2c.pack`.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import lzma
import os
import re
import tarfile
import threading
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ... import settings
from ... import cache
from .toolchain import NVCC_FLAGS, cutlass_version

log = logging.getLogger("l2c.pack")

ENV_VAR = "L2C_PACK"
FORMAT = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 * 2**20
MAX_LIBRARY_BYTES = 256 * 2**20   # far above any CUTLASS library (1-2 MiB): a member larger is not one
_HEX64 = re.compile(r"[0-9a-f]{64}")
_FILE_NAME = re.compile(r"[A-Za-z0-9_.-]+\.so")


class PackError(Exception):
    """A pack, or one library in it, that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class PackEntry:
    """One library of a pack, as its manifest records it."""
    name: str            # the spec's name (the library's symbols are l2c_<name>_*)
    spec: str            # the spec's .l2 text
    key: str             # toolchain.pack_key of its rendered source
    file: str            # member name in the archive
    sha256: str
    size: int
    nvcc_version: str    # `nvcc --version` of the compiler that built it
    cuda_version: str    # the CUDA release of that compiler
    pack: str = ""       # the archive it was read from (not in the manifest)

    def to_row(self) -> Dict[str, object]:
        row = asdict(self)
        del row["pack"]
        return row


@dataclass(frozen=True)
class Pack:
    path: str
    arch: str
    cutlass_version: str
    nvcc_flags: str
    entries: Dict[str, PackEntry]   # by key


# ---- where the pack is

def default_pack_path(arch: str) -> Path:
    """`L2C_PACK` if set, else the pack shipped for `arch` (l2c/packs/<arch>.tar.xz, which may not exist)."""
    env = settings.value(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path(str(resources.files("l2c") / "packs" / f"{arch}.tar.xz"))


# ---- reading

def _entry_from_row(row, path: str) -> PackEntry:
    if not isinstance(row, dict):
        raise ValueError("an entry must be an object")
    fields = {}
    for name in ("name", "spec", "key", "file", "sha256", "nvcc_version", "cuda_version"):
        if not isinstance(row.get(name), str) or not row[name]:
            raise ValueError(f"entry field {name!r} must be a non-empty string")
        fields[name] = row[name]
    if not _HEX64.fullmatch(fields["key"]) or not _HEX64.fullmatch(fields["sha256"]):
        raise ValueError(f"entry {fields['name']}: key and sha256 must be 64 hex digits")
    if not _FILE_NAME.fullmatch(fields["file"]) or fields["file"] == MANIFEST:
        raise ValueError(f"entry {fields['name']}: bad file name {fields['file']!r}")
    size = row.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"entry {fields['name']}: size must be a positive whole number")
    return PackEntry(size=size, pack=path, **fields)


def _open_stream(path: str) -> tarfile.TarFile:
    return tarfile.open(path, mode="r|xz")


_READ_ERRORS = (OSError, EOFError, tarfile.TarError, lzma.LZMAError, UnicodeDecodeError, ValueError)


@functools.lru_cache(maxsize=8)
def _read_manifest(path: str, mtime_ns: int, size: int) -> Pack:
    """The manifest of the pack at `path` (cached per file version: the pack is read on every build-cache miss)."""
    try:
        with _open_stream(path) as tar:
            member = tar.next()
            if member is None or member.name != MANIFEST or not member.isfile():
                raise PackError(f"{path}: not an l2c pack (its first member is not {MANIFEST})")
            if member.size > MAX_MANIFEST_BYTES:
                raise PackError(f"{path}: {MANIFEST} is larger than {MAX_MANIFEST_BYTES >> 20} MiB")
            data = json.loads(tar.extractfile(member).read().decode("utf-8"))
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
            raise PackError(f"{path}: {MANIFEST} is not a format-{FORMAT} pack manifest")
        entries = [_entry_from_row(row, path) for row in data["entries"]]
        header = [data.get(name) for name in ("arch", "cutlass_version", "nvcc_flags")]
        if not all(isinstance(value, str) for value in header):
            raise PackError(f"{path}: {MANIFEST} needs string fields arch, cutlass_version and nvcc_flags")
    except PackError:
        raise
    except _READ_ERRORS as err:
        raise PackError(f"{path}: cannot read the pack: {type(err).__name__}: {err}") from None
    by_key = {e.key: e for e in entries}
    if len(by_key) != len(entries) or len({e.file for e in entries}) != len(entries):
        raise PackError(f"{path}: {MANIFEST} lists a key or a file twice")
    return Pack(path, *header, entries=by_key)


def read_pack(path: Union[str, Path]) -> Pack:
    """The pack at `path` (its manifest; the libraries are read on demand); PackError if it is not one."""
    path = str(path)
    try:
        stat = os.stat(path)
    except OSError as err:
        raise PackError(f"{path}: cannot read the pack: {err.strerror or err}") from None
    return _read_manifest(path, stat.st_mtime_ns, stat.st_size)


_warned: set = set()
_warned_lock = threading.Lock()


def lookup(arch: str, key: str, name: str) -> Optional[PackEntry]:
    """The entry of `arch`'s pack with this key and spec name, or None: no pack, no such entry, or a pack that
    cannot be read (warned about once; builds then go to nvcc)."""
    path = default_pack_path(arch)
    if not path.exists():
        return None
    try:
        pack = read_pack(path)
    except PackError as err:
        with _warned_lock:
            if str(path) not in _warned:
                _warned.add(str(path))
                log.warning("l2c: the prebuilt pack is not used: %s", err)
        return None
    entry = pack.entries.get(key)
    return entry if entry is not None and entry.name == name and pack.arch == arch else None


def _libraries(path: str) -> Iterator[Tuple[tarfile.TarInfo, Optional[bytes]]]:
    """(member, its bytes) for every member after the manifest, streaming through the archive once; None for the
    bytes of a member that is not a file or is larger than any library. Each member is read whole, wanted or
    not: skipping one in a stream makes tarfile decompress it in 10 KB reads that each copy what the decompressor
    holds (reaching the middle of the shipped pack took 5.8 s that way, 0.56 s reading through)."""
    with _open_stream(path) as tar:
        for member in tar:
            if member.name != MANIFEST:
                readable = member.isfile() and member.size <= MAX_LIBRARY_BYTES
                yield member, tar.extractfile(member).read() if readable else None


def _checked(member: tarfile.TarInfo, data: Optional[bytes], entry: PackEntry) -> bytes:
    """The member's bytes if they are the library `entry` records (size, then sha256); PackError saying why not."""
    if data is None or member.size != entry.size:
        raise PackError(f"{entry.file} is {member.size} bytes in the archive, the manifest says {entry.size}")
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != entry.size or digest != entry.sha256:
        raise PackError(f"{entry.file} has sha256 {digest}, the manifest says {entry.sha256}")
    return data


def read_library(entry: PackEntry) -> bytes:
    """The library's bytes, checked against the manifest's size and sha256; PackError otherwise."""
    try:
        for member, data in _libraries(entry.pack):
            if member.name == entry.file:
                return _checked(member, data, entry)
    except PackError as err:
        raise PackError(f"{entry.pack}: {err}: refused") from None
    except _READ_ERRORS as err:
        raise PackError(f"{entry.pack}: cannot read {entry.file}: {type(err).__name__}: {err}") from None
    raise PackError(f"{entry.pack}: the manifest lists {entry.file}, the archive does not hold it")


def read_libraries(path: str, entries: Sequence[PackEntry]) -> Iterator[Tuple[PackEntry, bytes]]:
    """(entry, bytes) for each of `entries` (of the pack at `path`) in one pass through the archive, each checked
    as `read_library` checks it. A stream is read from its start, so asking `read_library` for each of a table's
    libraries decompresses the archive once per library: minutes for a whole pack. A library that fails its
    check, or that a damaged archive hides, is left out; `read_library`, asked for it alone, says why."""
    wanted = {e.file: e for e in entries}
    try:
        for member, data in _libraries(path):
            entry = wanted.pop(member.name, None)
            if entry is not None:
                try:
                    yield entry, _checked(member, data, entry)
                except PackError:
                    continue
            if not wanted:
                return
    except _READ_ERRORS:
        return


# ---- writing

def _member(name: str, data: bytes) -> Tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0   # fixed metadata: the same libraries, the same pack
    return info, io.BytesIO(data)


def write_pack(path: Union[str, Path], arch: str, libraries: Sequence[Tuple[PackEntry, bytes]]) -> Pack:
    """Write the pack atomically (manifest first, libraries in file-name order) and return it as read back."""
    ordered = sorted(libraries, key=lambda item: item[0].file)
    manifest = {"format": FORMAT, "arch": arch, "cutlass_version": cutlass_version(),
                "nvcc_flags": " ".join(NVCC_FLAGS), "entries": [entry.to_row() for entry, _ in ordered]}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=9, format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(*_member(MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode()))
        for entry, data in ordered:
            tar.addfile(*_member(entry.file, data))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cache.write_atomic(path, buffer.getvalue())
    return read_pack(path)


# ---- verifying

def check_libraries(pack: Pack) -> List[str]:
    """Problems with the archive's libraries: one missing, corrupt (size or sha256) or not in the manifest."""
    problems, seen = [], set()
    by_file = {e.file: e for e in pack.entries.values()}
    try:
        for member, data in _libraries(pack.path):
            entry = by_file.get(member.name)
            if entry is None:
                problems.append(f"{member.name}: in the archive but not in the manifest")
                continue
            seen.add(member.name)
            try:
                _checked(member, data, entry)
            except PackError as err:
                problems.append(f"corrupt: {err}")
    except _READ_ERRORS as err:
        problems.append(f"{pack.path}: cannot read the archive: {type(err).__name__}: {err}")
        return problems
    problems += [f"{name}: in the manifest but not in the archive" for name in sorted(set(by_file) - seen)]
    return problems
