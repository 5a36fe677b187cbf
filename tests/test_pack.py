"""The prebuilt pack (l2c.pack, `l2c pack`): which kernels it must hold, and, with real nvcc builds, that a
machine without nvcc is served from it and that a damaged or stale pack is never used.

The nvcc tests build one table entry's two kernels (no bias, per-column bias) into a fresh cache once for the
module; they are skipped only when nvcc is absent. "Without nvcc" means L2C_NVCC naming nothing and no nvcc on
PATH: find_nvcc also looks in /usr/local/cuda, so PATH alone cannot hide it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import subprocess
import zipfile
import time
from importlib import metadata
from pathlib import Path

import pytest

from l2c import cache, checker, pack
from l2c.targets.cutlass import pack as pack_format
from l2c.targets.cutlass.build import compile_many, compile_source, install_pack
from l2c.targets.cutlass.toolchain import NVCC_FLAGS, find_nvcc, pack_key
from l2c.cli import main
from l2c.dispatch import Dispatcher
from l2c.errors import BuildError
from l2c.parser import parse_file, parse_one
from l2c.tuned_table import entry_from_row, load_table
from tests.toolchain import needs_nvcc

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(name: str) -> str:
    return next(s for s in parse_file(EXAMPLES / "cublas_shapes.l2") if s.name == name).to_l2()


def _row(spec_text: str, m: int, n: int = 256, k: int = 1024, **extra) -> dict:
    return {"m": m, "n": n, "k": k, "batch": 1, "dtype": "f16", "layout": "row,row,row", "target": "cutlass",
            "spec": spec_text, "tflops": 2.0, "baseline_tflops": 1.0, **extra}


def _write_table(path: Path, rows) -> Path:
    path.write_text(json.dumps({"format": 1, "arch": "sm_90", "gpu": "test", "protocol": "kernel",
                                "entries": rows}))
    return path


def _hide_nvcc(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("L2C_NVCC", str(tmp_path / "no-nvcc-here"))
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "nvcc").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    with pytest.raises(BuildError):
        find_nvcc()


def _install_from(pack_path, monkeypatch, tmp_path, nvcc: bool = False) -> None:
    """Builds from here on install from `pack_path` into an empty cache; without nvcc unless `nvcc`."""
    monkeypatch.setenv("L2C_PACK", str(pack_path))
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "empty-cache"))
    if not nvcc:
        _hide_nvcc(monkeypatch, tmp_path)


# ---- which kernels (no compiler)

def test_the_pack_lists_exactly_the_specs_the_dispatcher_builds(tmp_path):
    generic = _example("small_basic_64x16")
    fixed_256 = generic.replace("m=any", "m=256", 1)
    fixed_128 = generic.replace("m=any", "m=128", 1)
    rows = [_row(generic, 64), _row(fixed_256, 256), _row(fixed_128, 128, n=512, m_range=[64, 192]),
            _row(_example("tall_swap_192x128"), 64, k=512, tflops=0.5),   # slower than torch: never served
            dict(_row(generic, 64, n=1024), target="triton")]              # not a CUTLASS kernel
    table_path = _write_table(tmp_path / "t.json", rows)
    arch, kernels, problems = pack.required_kernels([table_path])
    assert arch == "sm_90" and problems == []
    assert kernels[-1].name == checker.NAME and kernels[-1].source == checker.source()
    kernels = kernels[:-1]
    wanted = {k.spec for k in kernels}

    table = load_table(table_path)
    dispatcher = Dispatcher(table)
    asked = set()
    for row in rows[:3]:
        entry = entry_from_row(row)
        lo, hi = row.get("m_range", [row["m"], row["m"]])
        for m in range(lo, hi + 1, 16):
            for has_bias in (False, True):
                job = dispatcher._job(entry, ("f16", "row,row,row", m, entry.n, entry.k, has_bias, "none", "cuda"))
                asked.add(job.spec_text)
    assert asked == wanted
    # generic, fixed at 256, fixed at 128 (the range's spec, generic elsewhere in the range): two epilogues each
    assert len(kernels) == 3 * 2
    assert all(parse_one(k.spec).epilogue_activation == "none" for k in kernels)
    assert {parse_one(k.spec).epilogue_bias for k in kernels} == {"none", "col"}


def test_every_shipped_cutlass_kernel_renders_without_a_compiler():
    arch, kernels, problems = pack.required_kernels(pack.shipped_tables())
    assert problems == []
    assert arch == "sm_90" and len(kernels) >= 2
    assert len({k.key for k in kernels}) == len(kernels)


def test_the_shipped_pack_holds_every_kernel_the_shipped_tables_name(capsys):
    """What a new user's first tuned CUTLASS call installs instead of running nvcc: `l2c pack verify` on the
    package's own tables and pack (no compiler needed)."""
    assert main(["pack", "verify"]) == 0, capsys.readouterr().out


def test_the_wheel_built_from_the_repository_carries_the_pack_and_the_tables(tmp_path):
    """`pip wheel .` of the repository's tracked files holds the shipped pack and tables byte for byte, so an
    installed l2c serves prebuilt kernels with no nvcc."""
    import shutil
    import sys
    repo = Path(__file__).resolve().parent.parent
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
    source = tmp_path / "source"
    for name in filter(None, listed.decode().split("\0")):
        if (repo / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(tmp_path / "wheel")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "wheel").glob("l2c-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        for shipped in ["l2c/packs/sm_90.zip", *(f"l2c/tuned/{p.name}" for p in (repo / "l2c/tuned").glob("*.json"))]:
            assert archive.read(shipped) == (repo / shipped).read_bytes(), shipped


def test_verify_fails_without_a_pack(tmp_path, capsys):
    table = _write_table(tmp_path / "t.json", [_row(_example("small_basic_64x16"), 64)])
    assert main(["pack", "verify", "--table", str(table), "--pack", str(tmp_path / "absent.zip")]) == 1
    assert "cannot read the pack" in capsys.readouterr().out


@pytest.mark.parametrize("manifest", ["[" * 200000, "{", "[]", '{"entries": 5}'])
def test_verify_of_a_pack_whose_manifest_is_not_one_fails_in_one_line(manifest, tmp_path, capsys):
    """A manifest nested past Python's recursion limit read as a RecursionError traceback (and failed builds that
    should have warned and used nvcc); every unreadable manifest is a failed verify that says why."""
    import zipfile
    bad = tmp_path / "sm_90.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("manifest.json", manifest)
    table = _write_table(tmp_path / "t.json", [_row(_example("small_basic_64x16"), 64)])
    assert main(["pack", "verify", "--table", str(table), "--pack", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and ("cannot read the pack" in out or "not a format-2 pack manifest" in out), out


# ---- with real builds

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A pack of one table entry (small_basic_64x16: two kernels), built with nvcc into a fresh cache."""
    root = tmp_path_factory.mktemp("pack")
    table = _write_table(root / "tiny.json", [_row(_example("small_basic_64x16"), 256)])
    os.environ["L2C_CACHE_DIR"] = str(root / "cache")
    os.environ["L2C_PACK"] = str(root / "no-pack.zip")   # nothing to install from: the build compiles
    try:
        start = time.perf_counter()
        assert main(["pack", "build", "--table", str(table), "-j", "2", "-o", str(root / "sm_90.zip")]) == 0
        print(f"\npack build: 2 CUTLASS kernels in {time.perf_counter() - start:.0f} s")
    finally:
        del os.environ["L2C_CACHE_DIR"], os.environ["L2C_PACK"]
    _, kernels, _ = pack.required_kernels([table])
    return root, table, root / "sm_90.zip", kernels


@needs_nvcc
def test_the_pack_records_each_build(built):
    root, _, pack_path, kernels = built
    written = pack_format.read_pack(pack_path)
    assert written.arch == "sm_90" and written.cutlass_version == metadata.version("nvidia-cutlass")
    assert set(written.entries) == {k.key for k in kernels} and len(kernels) == 3
    nvcc_version = subprocess.run([find_nvcc(), "--version"], capture_output=True, text=True).stdout.strip()
    assert written.entries[kernels[-1].key].name == checker.NAME
    for kernel in kernels[:-1]:
        entry = written.entries[kernel.key]
        assert entry.key == pack_key(kernel.source) == cache.content_hash(
            kernel.source, " ".join(NVCC_FLAGS), metadata.version("nvidia-cutlass"))
        assert entry.name == kernel.name == "small_basic_64x16" and entry.spec == kernel.spec
        assert entry.nvcc_version == nvcc_version and entry.cuda_version in nvcc_version
        # the library in the pack is the one the build cache holds, under the cache's unchanged key
        digest = cache.content_hash(pack_key(kernel.source), nvcc_version)[:24]
        cached = root / "cache" / "cutlass" / f"{kernel.name}_{digest}.so"
        assert hashlib.sha256(cached.read_bytes()).hexdigest() == entry.sha256
        assert pack_format.read_library(entry) == cached.read_bytes()


@needs_nvcc
def test_verify_passes_without_a_compiler(built, monkeypatch, tmp_path, capsys):
    _, table, pack_path, _ = built
    _hide_nvcc(monkeypatch, tmp_path)
    assert main(["pack", "verify", "--table", str(table), "--pack", str(pack_path)]) == 0
    assert "ok, holds all 2 kernels and the checker" in capsys.readouterr().out
    # a table naming a kernel the pack lacks fails, and says which
    more = _write_table(tmp_path / "more.json", [_row(_example("small_basic_64x16"), 256),
                                                 _row(_example("tall_swap_192x128"), 4096, k=512)])
    assert main(["pack", "verify", "--table", str(more), "--pack", str(pack_path)]) == 1
    out = capsys.readouterr().out
    assert out.count("missing: tall_swap_192x128") == 2 and "missing: small_basic" not in out


@needs_nvcc
def test_without_nvcc_a_cache_miss_installs_from_the_pack(built, monkeypatch, tmp_path):
    root, _, pack_path, kernels = built
    _install_from(pack_path, monkeypatch, tmp_path)
    for kernel in kernels:
        start = time.perf_counter()
        library = compile_source(kernel.source, kernel.name)
        assert time.perf_counter() - start < 10
        # the file a local nvcc of the pack's version would have built, byte for byte
        built_here = root / "cache" / "cutlass" / library.name
        assert library.parent == tmp_path / "empty-cache" / "cutlass"
        assert library.read_bytes() == built_here.read_bytes()
        assert compile_source(kernel.source, kernel.name) == library   # now a plain cache hit


@needs_nvcc
def test_a_truncated_cached_library_is_installed_again_never_loaded(built, monkeypatch, tmp_path):
    """dlopen maps a truncated library and the process dies of SIGBUS on its missing pages: a cached library cut
    short (a copy interrupted, a disk full) is not a cache hit, and the pack installs it again whole."""
    root, _, pack_path, kernels = built
    _install_from(pack_path, monkeypatch, tmp_path)
    library = compile_source(kernels[0].source, kernels[0].name)
    whole = library.read_bytes()
    for size in (0, 4000, len(whole) // 2, len(whole) - 1):
        library.write_bytes(whole[:size])
        assert not cache.intact_library(library)
        assert compile_source(kernels[0].source, kernels[0].name) == library
        assert library.read_bytes() == whole
    library.write_bytes(whole[:len(whole) // 2])
    assert install_pack() >= 1 and library.read_bytes() == whole
    with pytest.raises(OSError, match="not a whole shared library"):
        library.write_bytes(whole[:len(whole) // 2])
        cache.load_library(library)


@needs_nvcc
def test_many_cache_misses_read_the_pack_once(built, monkeypatch, tmp_path):
    """The archive is opened once for all of them, and a library two kernels share is decompressed once."""
    root, _, pack_path, kernels = built
    _install_from(pack_path, monkeypatch, tmp_path)
    pack_format.read_pack(pack_path)   # the manifest, read once per file version
    opened = []
    real_open = pack_format._open_archive
    monkeypatch.setattr(pack_format, "_open_archive", lambda path: opened.append(path) or real_open(path))
    libraries = compile_many([(k.source, k.name) for k in kernels], workers=2)
    assert opened == [str(pack_path)]
    for kernel, library in zip(kernels, libraries):
        assert library.read_bytes() == (root / "cache" / "cutlass" / library.name).read_bytes()


@needs_nvcc
def test_install_pack_installs_every_library_once_with_links(built, monkeypatch, tmp_path):
    """What a warm start does ahead of first calls: every library this machine would use, a library that several
    kernels share written once (hard links), and nothing the second time."""
    root, _, pack_path, kernels = built
    _install_from(pack_path, monkeypatch, tmp_path)
    assert install_pack() == len(kernels)
    for kernel in kernels:
        library = compile_source(kernel.source, kernel.name)   # a cache hit: nothing decompressed any more
        assert library.read_bytes() == (root / "cache" / "cutlass" / library.name).read_bytes()
    by_sha = {}
    for entry in pack_format.read_pack(pack_path).entries.values():
        by_sha.setdefault(entry.sha256, []).append(entry.name)
    files = list((tmp_path / "empty-cache" / "cutlass").glob("*.so"))
    assert len(files) == len(kernels) and len({f.stat().st_ino for f in files}) == len(by_sha)
    assert install_pack() == 0


@needs_nvcc
def test_with_nvcc_of_the_same_version_a_cache_miss_installs_from_the_pack(built, monkeypatch, tmp_path):
    root, _, pack_path, kernels = built
    _install_from(pack_path, monkeypatch, tmp_path, nvcc=True)
    start = time.perf_counter()
    library = compile_source(kernels[0].source, kernels[0].name)
    assert time.perf_counter() - start < 10      # an nvcc build takes tens of seconds
    assert library.read_bytes() == (root / "cache" / "cutlass" / library.name).read_bytes()


@needs_nvcc
def test_a_changed_source_is_not_served_from_the_pack(built, monkeypatch, tmp_path):
    _, _, pack_path, kernels = built
    _install_from(pack_path, monkeypatch, tmp_path)
    changed = kernels[0].source.replace("#include", "// a template change\n#include", 1)
    assert changed != kernels[0].source
    with pytest.raises(BuildError, match="not in l2c's prebuilt pack"):
        compile_source(changed, kernels[0].name)
    assert list((tmp_path / "empty-cache" / "cutlass").glob("*.so")) == []


def _rewrite(pack_path: Path, out: Path, index: int, change) -> None:
    """Copy the pack with member `index` (0: the manifest, 1: the first library) changed by `change(bytes)`."""
    with zipfile.ZipFile(pack_path) as src, zipfile.ZipFile(out, "w") as dst:
        for i, info in enumerate(src.infolist()):
            data = src.read(info)
            dst.writestr(info, change(data) if i == index else data)


@needs_nvcc
def test_a_stale_entry_fails_verify_and_is_not_served(built, monkeypatch, tmp_path, capsys):
    """An entry for the same spec under another key: what a pack built before a template change holds."""
    _, table, pack_path, kernels = built
    first = next(e for e in pack_format.read_pack(pack_path).entries.values() if e.name == "small_basic_64x16")

    def old_key(data: bytes) -> bytes:
        manifest = json.loads(data)
        next(row for row in manifest["entries"] if row["name"] == "small_basic_64x16")["key"] = "0" * 64
        return json.dumps(manifest).encode()

    stale = tmp_path / "sm_90.zip"
    _rewrite(pack_path, stale, 0, old_key)
    assert main(["pack", "verify", "--table", str(table), "--pack", str(stale)]) == 1
    out = capsys.readouterr().out
    assert out.count("stale: small_basic_64x16") == 1 and "missing" not in out
    _install_from(stale, monkeypatch, tmp_path)
    kernel = next(k for k in kernels if k.key == first.key)
    with pytest.raises(BuildError, match="not in l2c's prebuilt pack"):
        compile_source(kernel.source, kernel.name)


@needs_nvcc
def test_a_library_that_does_not_match_its_sha256_is_refused(built, monkeypatch, tmp_path, capsys):
    _, table, pack_path, kernels = built
    bad = tmp_path / "sm_90.zip"
    _rewrite(pack_path, bad, 1, lambda data: data[:1000] + bytes([data[1000] ^ 1]) + data[1001:])
    assert main(["pack", "verify", "--table", str(table), "--pack", str(bad)]) == 1
    assert "corrupt:" in capsys.readouterr().out
    _install_from(bad, monkeypatch, tmp_path)
    damaged = sorted(pack_format.read_pack(bad).entries.values(), key=lambda e: e.file)[0]
    with pytest.raises(pack_format.PackError, match="sha256"):
        pack_format.read_library(damaged)
    kernel = next(k for k in kernels if k.key == damaged.key)
    with pytest.raises(BuildError, match="cannot be used"):
        compile_source(kernel.source, kernel.name)
    assert list((tmp_path / "empty-cache" / "cutlass").glob("*.so")) == []


@needs_nvcc
def test_a_corrupt_archive_fails_verify_and_installs_nothing_wrong(built, monkeypatch, tmp_path, capsys):
    _, table, pack_path, kernels = built
    data = bytearray(pack_path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "sm_90.zip"
    bad.write_bytes(bytes(data))
    assert main(["pack", "verify", "--table", str(table), "--pack", str(bad)]) == 1
    assert "FAILED" in capsys.readouterr().out
    _install_from(bad, monkeypatch, tmp_path)
    good = pack_format.read_pack(pack_path).entries
    refused = 0
    for kernel in kernels:
        try:
            library = compile_source(kernel.source, kernel.name)
        except BuildError:
            refused += 1
            continue
        assert hashlib.sha256(library.read_bytes()).hexdigest() == good[kernel.key].sha256
    assert refused >= 1


@pytest.mark.parametrize("name", ["../../escaped", "/abs/x", "a/b", "bad name", ""])
def test_a_pack_entry_whose_name_is_not_a_kernel_name_is_refused(tmp_path, name):
    """A manifest's names become file names in the build cache: one that is not a spec's name (a path out of the
    cache, an absolute path) makes the whole pack unreadable, so nothing of it is installed."""
    data = b"\x7fELF not a real library"
    entry = pack_format.PackEntry(name=name or "x", spec="kernel x {}", key="0" * 64,
                                  file=pack_format.library_member(hashlib.sha256(data).hexdigest()),
                                  sha256=hashlib.sha256(data).hexdigest(), size=len(data), nvcc_version="nvcc",
                                  cuda_version="13.0")
    if not name:
        entry = dataclasses.replace(entry, name="")
    path = tmp_path / "evil.zip"
    with pytest.raises(pack_format.PackError, match="name"):   # write_pack reads back what it wrote
        pack_format.write_pack(path, "sm_90", [(entry, data)])
    with zipfile.ZipFile(path, "w") as archive:   # a pack written by other means
        archive.writestr(pack_format.MANIFEST, json.dumps({
            "format": pack_format.FORMAT, "arch": "sm_90", "cutlass_version": "4.2.0", "nvcc_flags": "",
            "entries": [entry.to_row()]}))
        archive.writestr(entry.file, data)
    with pytest.raises(pack_format.PackError, match="name"):
        pack_format.read_pack(path)


def test_a_table_arch_that_is_not_an_architecture_names_no_file(tmp_path, capsys):
    """A table's arch names the pack's file: one that is not a known architecture (a path) is refused before any
    build, and nothing is written outside the packs folder."""
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"arch": "../../escaped", "entries": [_row(_example("small_basic_64x16"), 64)]}))
    assert main(["pack", "verify", "--table", str(table)]) == 2
    assert "'arch' must be one of sm_90" in capsys.readouterr().err
    assert not (tmp_path.parent / "escaped.zip").exists()


def test_a_build_where_every_kernel_fails_writes_no_pack(tmp_path, monkeypatch, capsys):
    """A compiler that fails every kernel leaves the pack as it was (never an empty pack in its place)."""
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Cuda compilation tools, release 13.0, "
                    "V13.0.48'; exit 0; fi\necho broken >&2; exit 1\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("L2C_NVCC", str(nvcc))
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("L2C_PACK", str(tmp_path / "no-pack.zip"))
    table = _write_table(tmp_path / "t.json", [_row(_example("small_basic_64x16"), 64)])
    out = tmp_path / "sm_90.zip"
    out.write_bytes(b"the pack before")
    assert main(["pack", "build", "--table", str(table), "-j", "1", "-o", str(out)]) == 1
    assert out.read_bytes() == b"the pack before"
    assert "none of the" in capsys.readouterr().err
