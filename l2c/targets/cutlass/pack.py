"""The prebuilt pack's format: compiled CUTLASS libraries shipped with l2c, so that the shipped tables' kernels need
no nvcc.

One zip archive per architecture (`l2c/packs/sm_90.zip`, `L2C_PACK=path` uses another) holds `manifest.json`, per
kernel its spec name and text, the key (a hash of rendered source, nvcc flags and CUTLASS version:
`toolchain.pack_key`, which a machine without nvcc can compute), the nvcc and CUDA versions that built it, and the
library's member name, size and sha256; then each distinct library once, as `<sha256>.so`, compressed on its own
(deflate). Kernels compiled in one nvcc run share a library, so the members are far fewer than the kernels. A member
is compressed alone so that installing one kernel decompresses one library, not the archive up to it; deflate rather
than LZMA because a first call may wait for it: 8 ms a library against 24 (the pack is 9.3 MiB against 6.7).

The build cache asks the pack on a miss (`build.compile_source`); an entry is used only for the same key and,
where nvcc is installed, the same nvcc version, and only after its sha256 matches. A changed template or flag
gives another key, so a stale entry is never used: the kernel is built with nvcc instead. What the pack must hold
and how it is built and verified is `l2c.pack`.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import struct
import threading
import lzma
import zipfile
import zlib
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
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 * 2**20
MAX_LIBRARY_BYTES = 256 * 2**20   # far above any CUTLASS library (1-2 MiB): a member larger is not one
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")   # the grammar's NAME (grammar/l2.lark)


class PackError(Exception):
    """A pack, or one library in it, that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class PackEntry:
    """One library of a pack, as its manifest records it."""
    name: str            # the spec's name (the library's symbols are l2c_<name>_*)
    spec: str            # the spec's .l2 text
    key: str             # toolchain.pack_key of its rendered source
    file: str            # member name in the archive: <sha256>.so
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
    """`L2C_PACK` if set, else the pack shipped for `arch` (l2c/packs/<arch>.zip, which may not exist)."""
    env = settings.value(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path(str(resources.files("l2c") / "packs" / f"{arch}.zip"))


# ---- reading

def _entry_from_row(row, path: str) -> PackEntry:
    if not isinstance(row, dict):
        raise ValueError("an entry must be an object")
    fields = {}
    for name in ("name", "spec", "key", "file", "sha256", "nvcc_version", "cuda_version"):
        if not isinstance(row.get(name), str) or not row[name]:
            raise ValueError(f"entry field {name!r} must be a non-empty string")
        fields[name] = row[name]
    if not _NAME.fullmatch(fields["name"]):   # it names files in the build cache: a spec's name, no path
        raise ValueError(f"entry name {fields['name'][:80]!r} is not a kernel name ([A-Za-z_][A-Za-z0-9_]*)")
    if not _HEX64.fullmatch(fields["key"]) or not _HEX64.fullmatch(fields["sha256"]):
        raise ValueError(f"entry {fields['name']}: key and sha256 must be 64 hex digits")
    if fields["file"] != library_member(fields["sha256"]):
        raise ValueError(f"entry {fields['name']}: its file must be {library_member(fields['sha256'])!r}, "
                         f"not {fields['file']!r}")
    size = row.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"entry {fields['name']}: size must be a positive whole number")
    return PackEntry(size=size, pack=path, **fields)


def library_member(sha256: str) -> str:
    """The archive member holding the library of this sha256."""
    return f"{sha256}.so"


def _open_archive(path: str) -> zipfile.ZipFile:
    return zipfile.ZipFile(path)


_READ_ERRORS = (OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, lzma.LZMAError, zlib.error,
                NotImplementedError, UnicodeDecodeError, ValueError, KeyError, RecursionError)


# A zip local file header: signature, versions, flags, method, time, date, CRC, sizes, name and extra lengths.
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")


def _member_bytes(archive: zipfile.ZipFile, name: str, limit: int) -> bytes:
    """The member's bytes, its CRC checked; ValueError for one larger than `limit` or damaged, KeyError for none.
    A deflated member is inflated in one call: zipfile's reader inflates in small chunks, 18-22 ms for a 1.5 MB
    library against 8."""
    info = archive.getinfo(name)
    if info.file_size > limit:
        raise ValueError(f"{name} is {info.file_size} bytes, more than any member can be ({limit})")
    if info.compress_type != zipfile.ZIP_DEFLATED or info.flag_bits & 0x1:
        return archive.read(info)
    file = archive.fp
    file.seek(info.header_offset)
    header = file.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
        raise ValueError(f"{name}: bad local file header")
    *_, name_length, extra_length = _LOCAL_HEADER.unpack(header)
    file.seek(name_length + extra_length, os.SEEK_CUR)
    data = zlib.decompress(file.read(info.compress_size), -zlib.MAX_WBITS, info.file_size)
    if len(data) != info.file_size or zlib.crc32(data) != info.CRC:
        raise ValueError(f"{name}: its CRC or size does not match the archive's directory")
    return data


@functools.lru_cache(maxsize=8)
def _read_manifest(path: str, mtime_ns: int, size: int) -> Pack:
    """The manifest of the pack at `path` (cached per file version: the pack is read on every build-cache miss)."""
    try:
        with _open_archive(path) as archive:
            if MANIFEST not in archive.namelist():
                raise PackError(f"{path}: not an l2c pack (it holds no {MANIFEST})")
            data = json.loads(_member_bytes(archive, MANIFEST, MAX_MANIFEST_BYTES).decode("utf-8"))
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
    if len(by_key) != len(entries):
        raise PackError(f"{path}: {MANIFEST} lists a key twice")
    sizes = {}
    for entry in entries:
        if sizes.setdefault(entry.file, entry.size) != entry.size:
            raise PackError(f"{path}: {MANIFEST} gives {entry.file} two sizes")
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


def _checked(data: bytes, entry: PackEntry) -> bytes:
    """`data` if it is the library `entry` records (size, then sha256); PackError saying why not."""
    if len(data) != entry.size:
        raise PackError(f"{entry.file} is {len(data)} bytes in the archive, the manifest says {entry.size}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise PackError(f"{entry.file} has sha256 {digest}, the manifest says {entry.sha256}")
    return data


def _read_checked(archive: zipfile.ZipFile, entry: PackEntry) -> bytes:
    try:
        data = _member_bytes(archive, entry.file, MAX_LIBRARY_BYTES)
    except KeyError:
        raise PackError(f"the manifest lists {entry.file}, the archive does not hold it") from None
    return _checked(data, entry)


def read_library(entry: PackEntry) -> bytes:
    """The library's bytes, checked against the manifest's size and sha256; PackError otherwise."""
    try:
        with _open_archive(entry.pack) as archive:
            return _read_checked(archive, entry)
    except PackError as err:
        raise PackError(f"{entry.pack}: {err}: refused") from None
    except _READ_ERRORS as err:
        raise PackError(f"{entry.pack}: cannot read {entry.file}: {type(err).__name__}: {err}") from None


def read_libraries(path: str, entries: Sequence[PackEntry]) -> Iterator[Tuple[PackEntry, bytes]]:
    """(entry, bytes) for each of `entries` (of the pack at `path`), the archive opened once and each library
    decompressed once however many entries share it, each checked as `read_library` checks it. A library that
    fails its check, or that a damaged archive hides, is left out; `read_library`, asked for it alone, says why."""
    try:
        with _open_archive(path) as archive:
            read: Dict[str, Optional[bytes]] = {}
            for entry in entries:
                if entry.file not in read:
                    try:
                        read[entry.file] = _read_checked(archive, entry)
                    except (PackError, *_READ_ERRORS):
                        read[entry.file] = None
                if read[entry.file] is not None:
                    yield entry, read[entry.file]
    except _READ_ERRORS:
        return


# ---- writing

def _zip_info(name: str, compress_type: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))   # fixed: the same libraries, the same pack
    info.compress_type, info.external_attr = compress_type, 0o644 << 16
    return info


def write_pack(path: Union[str, Path], arch: str, libraries: Sequence[Tuple[PackEntry, bytes]]) -> Pack:
    """Write the pack atomically (manifest first, then each distinct library once, in sha256 order) and return
    it as read back. Entries must name their library's member (`library_member`)."""
    import io
    ordered = sorted(libraries, key=lambda item: (item[0].file, item[0].name, item[0].key))
    manifest = {"format": FORMAT, "arch": arch, "cutlass_version": cutlass_version(),
                "nvcc_flags": " ".join(NVCC_FLAGS), "entries": [entry.to_row() for entry, _ in ordered]}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, mode="w") as archive:
        archive.writestr(_zip_info(MANIFEST, zipfile.ZIP_DEFLATED), json.dumps(manifest, indent=1) + "\n")
        written = set()
        for entry, data in ordered:
            if entry.file not in written:
                written.add(entry.file)
                archive.writestr(_zip_info(entry.file, zipfile.ZIP_DEFLATED), _checked(data, entry), compresslevel=9)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cache.write_atomic(path, buffer.getvalue())
    return read_pack(path)


# ---- verifying

def check_libraries(pack: Pack) -> List[str]:
    """Problems with the archive's libraries: one missing, corrupt (size, sha256 or the member's CRC) or not in
    the manifest."""
    problems = []
    by_file = {e.file: e for e in pack.entries.values()}
    try:
        with _open_archive(pack.path) as archive:
            names = [n for n in archive.namelist() if n != MANIFEST]
            problems += [f"{name}: in the archive but not in the manifest" for name in names if name not in by_file]
            for file, entry in sorted(by_file.items()):
                if file not in names:
                    problems.append(f"{file}: in the manifest but not in the archive")
                    continue
                try:
                    _read_checked(archive, entry)
                except PackError as err:
                    problems.append(f"corrupt: {err}")
                except _READ_ERRORS as err:
                    problems.append(f"corrupt: {file}: {type(err).__name__}: {err}")
    except _READ_ERRORS as err:
        problems.append(f"{pack.path}: cannot read the archive: {type(err).__name__}: {err}")
    return problems
