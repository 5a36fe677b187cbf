"""The prebuilt pack: compiled CUTLASS libraries shipped with l2c, so that the shipped tables' kernels need no nvcc.

One xz-compressed tar per architecture (`l2c/packs/sm_90.tar.xz`, `L2C_PACK=path` uses another) holds the
shared libraries and, as its first member, `manifest.json`: per library the spec name and text, the key (a hash
of rendered source, nvcc flags and CUTLASS version: `build_cutlass.pack_key`, which a machine without nvcc can
compute), the nvcc and CUDA versions that built it, its file name, size and sha256.

The build cache asks the pack on a miss (`build_cutlass.compile_source`); an entry is used only for the same key
and, where nvcc is installed, the same nvcc version, and only after its sha256 matches. A changed template or
flag gives another key, so a stale entry is never used: the kernel is built with nvcc instead.

The pack holds exactly the kernels the dispatcher builds for the shipped tables' CUTLASS entries
(`tuned_table.served_spec`) for calls without bias or with nn.Linear's per-column bias, without activation.
`l2c pack build` compiles them (through the build cache) and writes the pack; `l2c pack verify` checks, with no
compiler and no GPU, that the pack holds every one of them under its current key and that every library is intact.
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
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

log = logging.getLogger("l2c.pack")

ENV_VAR = "L2C_PACK"
FORMAT = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 * 2**20
# The calls each entry's kernel is prebuilt for: (has bias, activation). Bias is per column, as nn.Linear's.
EPILOGUES: Tuple[Tuple[bool, str], ...] = ((False, "none"), (True, "none"))
_HEX64 = re.compile(r"[0-9a-f]{64}")
_FILE_NAME = re.compile(r"[A-Za-z0-9_.-]+\.so")


class PackError(Exception):
    """A pack, or one library in it, that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class PackEntry:
    """One library of a pack, as its manifest records it."""
    name: str            # the spec's name (the library's symbols are l2c_<name>_*)
    spec: str            # the spec's .l2 text
    key: str             # build_cutlass.pack_key of its rendered source
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


@dataclass(frozen=True)
class RequiredKernel:
    """A kernel the dispatcher builds for a table entry: what the pack must hold."""
    name: str
    spec: str            # canonical .l2 text, as the dispatcher hands it to the builder
    source: str          # the rendered CUDA source
    key: str
    label: str           # which table entry and call asks for it, for messages


# ---- where the pack is

def default_pack_path(arch: str) -> Path:
    """`L2C_PACK` if set, else the pack shipped for `arch` (l2c/packs/<arch>.tar.xz, which may not exist)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path(str(resources.files("l2c") / "packs" / f"{arch}.tar.xz"))


def shipped_tables() -> List[Path]:
    """The tuned tables shipped with l2c (l2c/tuned/*.json)."""
    return sorted(Path(str(resources.files("l2c") / "tuned")).glob("*.json"))


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


def read_library(entry: PackEntry) -> bytes:
    """The library's bytes, checked against the manifest's size and sha256; PackError otherwise."""
    try:
        for tar, member in _libraries(entry.pack):
            if member.name == entry.file:
                return _read_checked(tar, member, entry)
    except PackError as err:
        raise PackError(f"{entry.pack}: {err}: refused") from None
    except _READ_ERRORS as err:
        raise PackError(f"{entry.pack}: cannot read {entry.file}: {type(err).__name__}: {err}") from None
    raise PackError(f"{entry.pack}: the manifest lists {entry.file}, the archive does not hold it")


# ---- what the pack must hold

def required_kernels(table_paths: Sequence[Union[str, Path]]) -> Tuple[str, List[RequiredKernel], List[str]]:
    """(arch, the kernels, problems): every CUTLASS kernel the dispatcher builds for the tables' served entries at
    the EPILOGUES, rendered (no compiler needed), once each; problems are entries whose spec does not validate.
    TableError for a file that is not a table, PackError for tables of different architectures."""
    from .build_cutlass import pack_key
    from .errors import L2Error
    from .lower import render
    from .parser import parse_one
    from .tuned_table import load_table, served_entries, served_ms, served_spec
    from .validate import validate

    tables = [load_table(path) for path in table_paths]
    arches = sorted({t.arch for t in tables})
    if len(arches) != 1:
        raise PackError(f"a pack is for one architecture; the tables are for {', '.join(arches) or 'none'}")
    arch = arches[0]
    kernels: Dict[str, RequiredKernel] = {}
    problems: List[str] = []
    for table in tables:
        for entry in served_entries(table):
            if entry.target != "cutlass":
                continue
            where = f"{Path(table.source).name}: {entry.dtype} {entry.layout} {entry.m}x{entry.n}x{entry.k}"
            try:
                for m in served_ms(entry):
                    for has_bias, activation in EPILOGUES:
                        text = served_spec(entry, m, has_bias, activation).to_l2()
                        if text in kernels:
                            continue
                        valid = validate(parse_one(text), "cutlass", arch)   # as the dispatcher builds it
                        source = render(valid)
                        label = f"{where} (M={m}, bias={'col' if has_bias else 'none'}, activation={activation})"
                        kernels[text] = RequiredKernel(valid.name, text, source, pack_key(source), label)
            except L2Error as err:
                problems.append(f"{where}: the spec cannot be built: {err}")
    return arch, list(kernels.values()), problems


# ---- writing

def _member(name: str, data: bytes) -> Tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0   # fixed metadata: the same libraries, the same pack
    return info, io.BytesIO(data)


def write_pack(path: Union[str, Path], arch: str, libraries: Sequence[Tuple[PackEntry, bytes]]) -> Pack:
    """Write the pack atomically (manifest first, libraries in file-name order) and return it as read back."""
    from . import cache
    from .build_cutlass import NVCC_FLAGS, cutlass_version
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


def build_pack(kernels: Sequence[RequiredKernel], arch: str, out: Union[str, Path], jobs: int,
               report: Callable[[RequiredKernel, Optional[str], float], None]) -> Tuple[Pack, int]:
    """Compile `kernels` through the build cache (`jobs` nvcc processes; built ones are reused), write the pack
    of those that built to `out`, and return it with the number that failed. `report(kernel, error, seconds)`
    is called for each kernel, in order. Needs nvcc: the pack records the version that built its libraries."""
    from .build_cutlass import compile_source, cuda_release, find_nvcc, nvcc_version
    from .errors import BuildError
    compiler = nvcc_version(find_nvcc())

    def build_one(kernel: RequiredKernel):
        start = time.perf_counter()
        try:
            return kernel, compile_source(kernel.source, kernel.name), None, time.perf_counter() - start
        except BuildError as err:
            return kernel, None, str(err), time.perf_counter() - start

    libraries, failed = [], 0
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="l2c-pack") as pool:
        for kernel, library, error, seconds in pool.map(build_one, kernels):
            report(kernel, error, seconds)
            if error is not None:
                failed += 1
                continue
            data = Path(library).read_bytes()
            entry = PackEntry(name=kernel.name, spec=kernel.spec, key=kernel.key,
                              file=f"{kernel.name}_{kernel.key[:24]}.so", sha256=hashlib.sha256(data).hexdigest(),
                              size=len(data), nvcc_version=compiler, cuda_version=cuda_release(compiler))
            libraries.append((entry, data))
    return write_pack(out, arch, libraries), failed


# ---- verifying

def check_libraries(pack: Pack) -> List[str]:
    """Problems with the archive's libraries: one missing, corrupt (size or sha256) or not in the manifest."""
    problems, seen = [], set()
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
                problems.append(f"corrupt: {err}")
    except _READ_ERRORS as err:
        problems.append(f"{pack.path}: cannot read the archive: {type(err).__name__}: {err}")
        return problems
    problems += [f"{name}: in the manifest but not in the archive" for name in sorted(set(by_file) - seen)]
    return problems


def verify_pack(pack_path: Union[str, Path], arch: str, kernels: Sequence[RequiredKernel]) -> Tuple[List[str], int]:
    """(problems, unused): every required kernel the pack lacks or holds under another key (stale: its template,
    flags or CUTLASS version changed since), every library that is damaged; and how many pack entries no table
    asks for. No compiler, no GPU."""
    from .build_cutlass import NVCC_FLAGS, cutlass_version
    try:
        pack = read_pack(pack_path)
    except PackError as err:
        return [str(err)], 0
    problems = []
    if pack.arch != arch:
        problems.append(f"{pack.path}: the pack is for {pack.arch}, the tables for {arch}")
    by_spec = {e.spec: e for e in pack.entries.values()}
    for kernel in kernels:
        if kernel.key in pack.entries:
            continue
        held = by_spec.get(kernel.spec)
        if held is None:
            problems.append(f"missing: {kernel.name} for {kernel.label}")
        else:
            problems.append(f"stale: {kernel.name} for {kernel.label}: the pack's build has key {held.key[:16]}, "
                            f"the current source, flags and CUTLASS version give {kernel.key[:16]}")
    if any(p.startswith("stale") for p in problems) and \
            (pack.cutlass_version, pack.nvcc_flags) != (cutlass_version(), " ".join(NVCC_FLAGS)):
        problems.append(f"note: the pack was built with CUTLASS {pack.cutlass_version} and flags "
                        f"'{pack.nvcc_flags}'; now CUTLASS {cutlass_version()}, flags '{' '.join(NVCC_FLAGS)}'")
    problems += check_libraries(pack)
    unused = len(set(pack.entries) - {k.key for k in kernels})
    return problems, unused
