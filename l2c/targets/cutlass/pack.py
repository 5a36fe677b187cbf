"""The prebuilt pack's format: compiled CUTLASS libraries shipped with l2c, so that the shipped tables' kernels need
no nvcc.

One xz-compressed tar per architecture (`l2c/packs/sm_90.tar.xz`, `L2C_PACK=path` uses another) holds the
shared libraries and, as its first member, `manifest.json`: per library the spec name and text, the key (a hash
of rendered source, nvcc flags and CUTLASS version: `toolchain.pack_key`, which a machine without nvcc can
compute), the nvcc and CUDA versions that built it, its file name, size and sha256.

Format 2 (what `write_pack` writes) compresses each member as an xz stream of its own, the streams one after the
other: still one .tar.xz that tar, xz and `tarfile` ("r:xz") read whole, but one library is read by seeking to its
stream (the manifest's `stream`: where it starts, counted back from the end of the file, and its length) and
decompressing that alone: about 20 ms for a 1.1 MB library on a 2-core CPU host, where format 1's single stream
(the shipped pack: 144 MiB of libraries in 3 MiB) decompresses everything before the member, up to 0.5 s. The
price is size: a library compresses to about 240 KB alone, 21 KB among all the others. Format 1 packs are read
as before (`PackEntry.indexed` is False for their entries).

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
FORMAT = 2
FORMATS = (1, 2)     # what the reader accepts: 1, one xz stream; 2, one stream per member, indexed
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 * 2**20
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
    stream_from_end: int = 0   # format 2: the member's xz stream starts this many bytes before the end of the file
    stream_size: int = 0       # format 2: the stream's length in bytes (0: no index, format 1)

    @property
    def indexed(self) -> bool:
        """Whether the library can be read alone (format 2), not only by decompressing the archive up to it."""
        return self.stream_size > 0

    def to_row(self) -> Dict[str, object]:
        row = asdict(self)
        for name in ("pack", "stream_from_end", "stream_size"):
            del row[name]
        if self.indexed:
            row["stream"] = [self.stream_from_end, self.stream_size]
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
    stream = row.get("stream", [0, 0])
    if not (isinstance(stream, list) and len(stream) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in stream)
            and stream[0] >= stream[1]):
        raise ValueError(f"entry {fields['name']}: stream must be [bytes from the end of the file, length]")
    return PackEntry(size=size, pack=path, stream_from_end=stream[0], stream_size=stream[1], **fields)


def _open_stream(path: str) -> tarfile.TarFile:
    """The archive read front to back. "r:xz" rather than the stream mode "r|xz", which stops silently at the end of
    the first xz stream (the manifest, in format 2)."""
    return tarfile.open(path, mode="r:xz")


_READ_ERRORS = (OSError, EOFError, tarfile.TarError, lzma.LZMAError, UnicodeDecodeError, ValueError)


@functools.lru_cache(maxsize=8)
def _read_manifest(path: str, mtime_ns: int, size: int) -> Pack:
    """The manifest of the pack at `path` (cached per file version: the pack is read on every build-cache miss)."""
    try:
        with tarfile.open(path, mode="r|xz") as tar:   # the manifest is the first member, in the first stream
            member = tar.next()
            if member is None or member.name != MANIFEST or not member.isfile():
                raise PackError(f"{path}: not an l2c pack (its first member is not {MANIFEST})")
            if member.size > MAX_MANIFEST_BYTES:
                raise PackError(f"{path}: {MANIFEST} is larger than {MAX_MANIFEST_BYTES >> 20} MiB")
            data = json.loads(tar.extractfile(member).read().decode("utf-8"))
        if not isinstance(data, dict) or data.get("format") not in FORMATS or not isinstance(data.get("entries"), list):
            raise PackError(f"{path}: {MANIFEST} is not a pack manifest of format "
                            f"{' or '.join(map(str, FORMATS))}")
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


def _libraries(path: str) -> Iterator[Tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """(archive, member) for every member after the manifest, streaming through the archive once."""
    with _open_stream(path) as tar:
        for member in tar:
            if member.name != MANIFEST:
                yield tar, member


def _read_checked(tar: tarfile.TarFile, member: tarfile.TarInfo, entry: PackEntry) -> bytes:
    """The member's bytes if they are the library `entry` records (size, then sha256); PackError saying why not."""
    if not member.isfile() or member.size != entry.size:
        raise PackError(f"{entry.file} is {member.size} bytes in the archive, the manifest says {entry.size}")
    data = tar.extractfile(member).read()
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != entry.size or digest != entry.sha256:
        raise PackError(f"{entry.file} has sha256 {digest}, the manifest says {entry.sha256}")
    return data


class _NotIndexed(PackError):
    """The index does not lead to the member (a stream that is not one, or holds another member)."""


def _read_indexed(entry: PackEntry) -> bytes:
    """The library from its own xz stream (format 2), checked: _NotIndexed when the index does not lead to it,
    PackError when it does and the library is damaged."""
    try:
        with open(entry.pack, "rb") as f:
            f.seek(-entry.stream_from_end, os.SEEK_END)
            compressed = f.read(entry.stream_size)
        if len(compressed) != entry.stream_size:
            raise EOFError(f"the stream ends {entry.stream_size - len(compressed)} bytes early")
        decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        # the member's headers and padding take a few blocks: more output than that is not this member
        chunk = decompressor.decompress(compressed, max_length=entry.size + 64 * tarfile.BLOCKSIZE)
        if not decompressor.eof or decompressor.unused_data:
            raise ValueError("the indexed bytes are not exactly one xz stream of this member")
        tar = tarfile.open(fileobj=io.BytesIO(chunk), mode="r:")
        member = tar.next()
        if member is None or member.name != entry.file:
            raise ValueError(f"the indexed stream holds {member.name if member else 'no member'}")
    except _READ_ERRORS as err:
        raise _NotIndexed(f"{entry.pack}: the index does not lead to {entry.file}: {type(err).__name__}: {err}") \
            from None
    try:
        return _read_checked(tar, member, entry)
    except PackError as err:
        raise PackError(f"{entry.pack}: {err}: refused") from None


def read_library(entry: PackEntry, scan: bool = True) -> bytes:
    """The library's bytes, checked against the manifest's size and sha256; PackError otherwise.

    An indexed entry (format 2) is read from its own stream; where the index does not lead to it, or for a format-1
    entry, the archive is read from the start up to the member, unless `scan` is False (then PackError: for a
    caller that must not wait that long)."""
    if entry.indexed:
        try:
            return _read_indexed(entry)
        except _NotIndexed as err:
            if not scan:
                raise
            log.warning("%s; reading the archive from the start instead", err)
    elif not scan:
        raise PackError(f"{entry.pack}: {entry.file} can only be read by decompressing the archive up to it "
                        f"(a format-1 pack)")
    try:
        for tar, member in _libraries(entry.pack):
            if member.name == entry.file:
                return _read_checked(tar, member, entry)
    except PackError as err:
        raise PackError(f"{entry.pack}: {err}: refused") from None
    except _READ_ERRORS as err:
        raise PackError(f"{entry.pack}: cannot read {entry.file}: {type(err).__name__}: {err}") from None
    raise PackError(f"{entry.pack}: the manifest lists {entry.file}, the archive does not hold it")


# ---- writing

def _member(name: str, data: bytes) -> Tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0   # fixed metadata: the same libraries, the same pack
    return info, io.BytesIO(data)


def _tar_member(name: str, data: bytes) -> bytes:
    """The member as a tar stores it: its header block(s), then the data padded to whole blocks."""
    info, _ = _member(name, data)
    header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    return header + data + tarfile.NUL * (-len(data) % tarfile.BLOCKSIZE)


def _xz(data: bytes) -> bytes:
    """One xz stream of `data`: preset 9, with a dictionary no larger than the data needs (so that reading one
    member allocates a few MiB, not the 64 MiB of preset 9)."""
    dict_size = max(1 << 16, 1 << max(0, len(data) - 1).bit_length())
    filters = [{"id": lzma.FILTER_LZMA2, "preset": 9, "dict_size": min(dict_size, 64 << 20)}]
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, filters=filters)


def write_pack(path: Union[str, Path], arch: str, libraries: Sequence[Tuple[PackEntry, bytes]]) -> Pack:
    """Write a format-2 pack atomically (manifest first, libraries in file-name order, each member an xz stream of
    its own) and return it as read back."""
    ordered = sorted(libraries, key=lambda item: item[0].file)
    streams = [_xz(_tar_member(entry.file, data)) for entry, data in ordered]
    end = _xz(tarfile.NUL * (2 * tarfile.BLOCKSIZE))   # the tar's end-of-archive blocks
    rows, from_end = [], len(end)
    for (entry, _), stream in reversed(list(zip(ordered, streams))):
        from_end += len(stream)
        rows.append({**entry.to_row(), "stream": [from_end, len(stream)]})
    manifest = {"format": FORMAT, "arch": arch, "cutlass_version": cutlass_version(),
                "nvcc_flags": " ".join(NVCC_FLAGS), "entries": rows[::-1]}
    head = _xz(_tar_member(MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode()))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cache.write_atomic(path, b"".join([head, *streams, end]))
    return read_pack(path)


# ---- verifying

def check_libraries(pack: Pack) -> List[str]:
    """Problems with the archive's libraries: one missing, corrupt (size or sha256) or not in the manifest, or (format
    2) one that its index does not lead to."""
    problems, seen, corrupt = [], set(), set()
    by_file = {e.file: e for e in pack.entries.values()}
    try:
        for tar, member in _libraries(pack.path):
            entry = by_file.get(member.name)
            if entry is None:
                problems.append(f"{member.name}: in the archive but not in the manifest")
                continue
            seen.add(member.name)
            try:
                _read_checked(tar, member, entry)
            except PackError as err:
                corrupt.add(member.name)
                problems.append(f"corrupt: {err}")
    except _READ_ERRORS as err:
        problems.append(f"{pack.path}: cannot read the archive: {type(err).__name__}: {err}")
        return problems
    problems += [f"{name}: in the manifest but not in the archive" for name in sorted(set(by_file) - seen)]
    for entry in sorted(pack.entries.values(), key=lambda e: e.file):
        if entry.indexed and entry.file in seen - corrupt:
            try:
                _read_indexed(entry)
            except PackError as err:
                problems.append(f"index: {err}")
    return problems
