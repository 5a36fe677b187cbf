"""The prebuilt pack (l2c.pack, `l2c pack`): which kernels it must hold, and, with real nvcc builds, that a
machine without nvcc is served from it and that a damaged or stale pack is never used.

The nvcc tests build one table entry's two kernels (no bias, per-column bias) into a fresh cache once for the
module; they are skipped only when nvcc is absent. "Without nvcc" means L2C_NVCC naming nothing and no nvcc on
PATH: find_nvcc also looks in /usr/local/cuda, so PATH alone cannot hide it.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
from importlib import metadata
from pathlib import Path

import pytest
import torch

from l2c import cache, pack
from l2c.targets.cutlass import pack as pack_format
from l2c.targets.cutlass.build import compile_source
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


def test_verify_fails_without_a_pack(tmp_path, capsys):
    table = _write_table(tmp_path / "t.json", [_row(_example("small_basic_64x16"), 64)])
    assert main(["pack", "verify", "--table", str(table), "--pack", str(tmp_path / "absent.tar.xz")]) == 1
    assert "cannot read the pack" in capsys.readouterr().out


# ---- with real builds

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A pack of one table entry (small_basic_64x16: two kernels), built with nvcc into a fresh cache."""
    root = tmp_path_factory.mktemp("pack")
    table = _write_table(root / "tiny.json", [_row(_example("small_basic_64x16"), 256)])
    os.environ["L2C_CACHE_DIR"] = str(root / "cache")
    os.environ["L2C_PACK"] = str(root / "no-pack.tar.xz")   # nothing to install from: the build compiles
    try:
        start = time.perf_counter()
        assert main(["pack", "build", "--table", str(table), "-j", "2", "-o", str(root / "sm_90.tar.xz")]) == 0
        print(f"\npack build: 2 CUTLASS kernels in {time.perf_counter() - start:.0f} s")
    finally:
        del os.environ["L2C_CACHE_DIR"], os.environ["L2C_PACK"]
    _, kernels, _ = pack.required_kernels([table])
    return root, table, root / "sm_90.tar.xz", kernels


@needs_nvcc
def test_the_pack_records_each_build(built):
    root, _, pack_path, kernels = built
    written = pack_format.read_pack(pack_path)
    assert written.arch == "sm_90" and written.cutlass_version == metadata.version("nvidia-cutlass")
    assert set(written.entries) == {k.key for k in kernels} and len(kernels) == 2
    nvcc_version = subprocess.run([find_nvcc(), "--version"], capture_output=True, text=True).stdout.strip()
    for kernel in kernels:
        entry = written.entries[kernel.key]
        assert entry.key == pack_key(kernel.source) == cache.content_hash(
            kernel.source, " ".join(NVCC_FLAGS), metadata.version("nvidia-cutlass"))
        assert entry.name == kernel.name == "small_basic_64x16" and entry.spec == kernel.spec
        assert entry.nvcc_version == nvcc_version and entry.cuda_version in nvcc_version
        # the library in the pack is the one the build cache holds, under the cache's unchanged key
        digest = cache.content_hash(kernel.source, " ".join(NVCC_FLAGS), nvcc_version,
                                    metadata.version("nvidia-cutlass"))[:24]
        cached = root / "cache" / "cutlass" / f"{kernel.name}_{digest}.so"
        assert hashlib.sha256(cached.read_bytes()).hexdigest() == entry.sha256
        assert pack_format.read_library(entry) == cached.read_bytes()


@needs_nvcc
def test_verify_passes_without_a_compiler(built, monkeypatch, tmp_path, capsys):
    _, table, pack_path, _ = built
    _hide_nvcc(monkeypatch, tmp_path)
    assert main(["pack", "verify", "--table", str(table), "--pack", str(pack_path)]) == 0
    assert "ok, holds all 2 kernels" in capsys.readouterr().out
    # a table naming a kernel the pack lacks fails, and says which
    more = _write_table(tmp_path / "more.json", [_row(_example("small_basic_64x16"), 256),
                                                 _row(_example("tall_swap_192x128"), 4096, k=512)])
    assert main(["pack", "verify", "--table", str(more), "--pack", str(pack_path)]) == 1
    out = capsys.readouterr().out
    assert out.count("missing: tall_swap_192x128") == 2 and "missing: small_basic" not in out


@needs_nvcc
def test_without_nvcc_a_cache_miss_installs_from_the_pack(built, monkeypatch, tmp_path):
    root, _, pack_path, kernels = built
    monkeypatch.setenv("L2C_PACK", str(pack_path))
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "empty-cache"))
    _hide_nvcc(monkeypatch, tmp_path)
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
def test_with_nvcc_of_the_same_version_a_cache_miss_installs_from_the_pack(built, monkeypatch, tmp_path):
    root, _, pack_path, kernels = built
    monkeypatch.setenv("L2C_PACK", str(pack_path))
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "empty-cache"))
    start = time.perf_counter()
    library = compile_source(kernels[0].source, kernels[0].name)
    assert time.perf_counter() - start < 10      # an nvcc build takes tens of seconds
    assert library.read_bytes() == (root / "cache" / "cutlass" / library.name).read_bytes()


@needs_nvcc
def test_a_changed_source_is_not_served_from_the_pack(built, monkeypatch, tmp_path):
    _, _, pack_path, kernels = built
    monkeypatch.setenv("L2C_PACK", str(pack_path))
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "empty-cache"))
    _hide_nvcc(monkeypatch, tmp_path)
    changed = kernels[0].source.replace("#include", "// a template change\n#include", 1)
    assert changed != kernels[0].source
    with pytest.raises(BuildError, match="not in l2c's prebuilt pack"):
        compile_source(changed, kernels[0].name)
    assert list((tmp_path / "empty-cache" / "cutlass").glob("*.so")) == []


def _rewrite(pack_path: Path, out: Path, index: int, change) -> None:
    """Copy the pack with member `index` (0: the manifest, 1: the first library) changed by `change(bytes)`."""
    with tarfile.open(pack_path, "r:xz") as src, tarfile.open(out, "w:xz") as dst:
        for i, member in enumerate(src.getmembers()):
            data = src.extractfile(member).read()
            if i == index:
                data = change(data)
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))


@needs_nvcc
def test_a_stale_entry_fails_verify_and_is_not_served(built, monkeypatch, tmp_path, capsys):
    """An entry for the same spec under another key: what a pack built before a template change holds."""
    _, table, pack_path, kernels = built
    first = sorted(pack_format.read_pack(pack_path).entries.values(), key=lambda e: e.file)[0]

    def old_key(data: bytes) -> bytes:
        manifest = json.loads(data)
        manifest["entries"][0]["key"] = "0" * 64
        return json.dumps(manifest).encode()

    stale = tmp_path / "sm_90.tar.xz"
    _rewrite(pack_path, stale, 0, old_key)
    assert main(["pack", "verify", "--table", str(table), "--pack", str(stale)]) == 1
    out = capsys.readouterr().out
    assert out.count("stale: small_basic_64x16") == 1 and "missing" not in out
    monkeypatch.setenv("L2C_PACK", str(stale))
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "empty-cache"))
    _hide_nvcc(monkeypatch, tmp_path)
    kernel = next(k for k in kernels if k.key == first.key)
    with pytest.raises(BuildError, match="not in l2c's prebuilt pack"):
        compile_source(kernel.source, kernel.name)


@needs_nvcc
def test_a_library_that_does_not_match_its_sha256_is_refused(built, monkeypatch, tmp_path, capsys):
    _, table, pack_path, kernels = built
    bad = tmp_path / "sm_90.tar.xz"
    _rewrite(pack_path, bad, 1, lambda data: data[:1000] + bytes([data[1000] ^ 1]) + data[1001:])
    assert main(["pack", "verify", "--table", str(table), "--pack", str(bad)]) == 1
    assert "corrupt:" in capsys.readouterr().out
    monkeypatch.setenv("L2C_PACK", str(bad))
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "empty-cache"))
    _hide_nvcc(monkeypatch, tmp_path)
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
    bad = tmp_path / "sm_90.tar.xz"
    bad.write_bytes(bytes(data))
    assert main(["pack", "verify", "--table", str(table), "--pack", str(bad)]) == 1
    assert "FAILED" in capsys.readouterr().out
    monkeypatch.setenv("L2C_PACK", str(bad))
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "empty-cache"))
    _hide_nvcc(monkeypatch, tmp_path)
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


# ---- reading one library alone (format 2), and kernels ready without a compiler

def _library_entry(name: str, data: bytes) -> pack_format.PackEntry:
    digest = hashlib.sha256(data).hexdigest()
    return pack_format.PackEntry(name=name, spec=f"kernel {name} {{}}", key=hashlib.sha256(name.encode()).hexdigest(),
                                 file=f"{name}_{digest[:24]}.so", sha256=digest, size=len(data),
                                 nvcc_version="nvcc test", cuda_version="13.0")


def _split_manifest(pack_path: Path):
    """(the manifest as JSON, the archive's bytes after the manifest's xz stream)."""
    import lzma
    raw = pack_path.read_bytes()
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    head = decompressor.decompress(raw)
    assert decompressor.eof
    with tarfile.open(fileobj=io.BytesIO(head), mode="r:") as tar:
        manifest = json.loads(tar.extractfile(tar.next()).read())
    return manifest, decompressor.unused_data


def _with_manifest(pack_path: Path, out: Path, manifest: dict) -> Path:
    """The format-2 pack with another manifest: the libraries' streams, and so their places from the end, unchanged."""
    _, rest = _split_manifest(pack_path)
    out.write_bytes(pack_format._xz(pack_format._tar_member("manifest.json", json.dumps(manifest).encode())) + rest)
    return out


def _solid(pack_path: Path, out: Path) -> Path:
    """The pack as format 1 writes it (one xz stream, no index), as the shipped pack is."""
    with tarfile.open(pack_path, "r:xz") as src, tarfile.open(out, "w:xz", preset=9) as dst:
        for member in src:
            data = src.extractfile(member).read()
            if member.name == "manifest.json":
                manifest = json.loads(data)
                manifest["format"] = 1
                for row in manifest["entries"]:
                    del row["stream"]
                data = json.dumps(manifest).encode()
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    return out


def test_each_library_is_read_alone_from_a_pack_that_stays_one_tar_xz(tmp_path, caplog):
    datas = [os.urandom(3000 + 512 * i) * 3 for i in range(4)]   # compressible, each unlike the others
    libraries = [(_library_entry(f"k{i}", data), data) for i, data in enumerate(datas)]
    written = pack_format.write_pack(tmp_path / "p.tar.xz", "sm_90", libraries)
    assert len(written.entries) == 4 and all(e.indexed for e in written.entries.values())
    by_file = {entry.file: data for entry, data in libraries}
    for entry in written.entries.values():
        assert pack_format.read_library(entry, scan=False) == by_file[entry.file]
    # every reader of a .tar.xz still reads the whole archive: tarfile, and tar itself
    with tarfile.open(written.path, "r:xz") as tar:
        assert {m.name: tar.extractfile(m).read() for m in tar if m.name != "manifest.json"} == by_file
    listing = subprocess.run(["tar", "tJf", written.path], capture_output=True, text=True, check=True).stdout.split()
    assert listing == ["manifest.json", *sorted(by_file)]
    assert pack_format.check_libraries(written) == []

    # an index that leads to another member: refused when reading alone, the whole archive read otherwise
    manifest, _ = _split_manifest(Path(written.path))
    rows = manifest["entries"]
    rows[0]["stream"], rows[1]["stream"] = rows[1]["stream"], rows[0]["stream"]
    swapped = pack_format.read_pack(_with_manifest(Path(written.path), tmp_path / "swapped.tar.xz", manifest))
    entry = swapped.entries[rows[0]["key"]]
    with pytest.raises(pack_format.PackError, match="index does not lead"):
        pack_format.read_library(entry, scan=False)
    assert pack_format.read_library(entry) == by_file[entry.file]
    assert any("index: " in p for p in pack_format.check_libraries(swapped))

    # format 1 (one stream): read only from the start of the archive
    solid = pack_format.read_pack(_solid(Path(written.path), tmp_path / "solid.tar.xz"))
    assert not any(e.indexed for e in solid.entries.values())
    entry = next(iter(solid.entries.values()))
    with pytest.raises(pack_format.PackError, match="format-1"):
        pack_format.read_library(entry, scan=False)
    assert pack_format.read_library(entry) == by_file[entry.file]
    assert pack_format.check_libraries(solid) == []


def test_the_shipped_pack_is_read_as_it_was_written():
    """The shipped pack predates format 2: its libraries are read from the start of the archive, so the dispatcher
    does not prepare them on a caller's thread (`Prebuilt.cheap`) until the pack is rebuilt."""
    shipped = pack_format.read_pack(pack_format.default_pack_path("sm_90"))
    assert shipped.entries and not any(e.indexed for e in shipped.entries.values())


def _valid(kernel):
    from l2c.validate import validate
    return validate(parse_one(kernel.spec), "cutlass", "sm_90")


@needs_nvcc
def test_a_kernel_the_pack_holds_is_ready_without_a_compiler(built, monkeypatch, tmp_path):
    """The seam the dispatcher asks before preparing a kernel on the calling thread: `prebuilt_library` says where
    the library comes from with no compiler run, `build_prebuilt` installs and loads it, never compiling."""
    from l2c.targets.cutlass.build import build_prebuilt, prebuilt_library
    from l2c.targets.cutlass.kernel import CutlassKernel
    root, _, pack_path, kernels = built
    monkeypatch.setenv("L2C_PACK", str(pack_path))
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "empty-cache"))
    for kernel in kernels:
        found = prebuilt_library(kernel.source, kernel.name)
        assert found is not None and found.entry is not None and found.entry.key == kernel.key and found.cheap
        assert not found.library.exists()
        start = time.perf_counter()
        loaded = build_prebuilt(_valid(kernel))
        seconds = time.perf_counter() - start
        print(f"\ninstalled {found.entry.file} from the pack and loaded it in {1e3 * seconds:.1f} ms")
        assert isinstance(loaded, CutlassKernel) and seconds < 5     # an nvcc build takes tens of seconds
        assert found.library.read_bytes() == (root / "cache" / "cutlass" / found.library.name).read_bytes()
        assert prebuilt_library(kernel.source, kernel.name) == type(found)(found.library, None)   # a cache hit now
    changed = kernels[0].source.replace("#include", "// a template change\n#include", 1)
    assert prebuilt_library(changed, kernels[0].name) is None

    # entries that do not match are never taken: another key (a stale pack), another nvcc than the one here
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "empty-again"))
    manifest, _ = _split_manifest(pack_path)
    stale = json.loads(json.dumps(manifest))
    stale["entries"][0]["key"] = "0" * 64
    monkeypatch.setenv("L2C_PACK", str(_with_manifest(pack_path, tmp_path / "stale.tar.xz", stale)))
    stale_one = next(k for k in kernels if k.key == manifest["entries"][0]["key"])
    assert prebuilt_library(stale_one.source, stale_one.name) is None
    other = json.loads(json.dumps(manifest))
    for row in other["entries"]:
        row["nvcc_version"] = "Cuda compilation tools, release 12.4, V12.4.131"
    monkeypatch.setenv("L2C_PACK", str(_with_manifest(pack_path, tmp_path / "other-nvcc.tar.xz", other)))
    assert all(prebuilt_library(k.source, k.name) is None for k in kernels)
    # ... unless there is no nvcc here: then any nvcc's build is what runs, as compile_source takes it
    _hide_nvcc(monkeypatch, tmp_path)
    found = prebuilt_library(kernels[0].source, kernels[0].name)
    assert found is not None and found.entry.nvcc_version.endswith("V12.4.131") and found.cheap

    # a format-1 pack's entry matches, but reading it decompresses the archive up to it: not prepared inline
    monkeypatch.setenv("L2C_PACK", str(_solid(pack_path, tmp_path / "solid.tar.xz")))
    found = prebuilt_library(kernels[0].source, kernels[0].name)
    assert found is not None and found.entry is not None and not found.cheap
    assert build_prebuilt(_valid(kernels[0])) is None and not found.library.exists()


@needs_nvcc
def test_the_dispatcher_prepares_a_packed_kernel_on_the_calling_thread(built, monkeypatch, tmp_path):
    """Background mode with a kernel the pack holds: the first call installs, loads and verifies it on the calling
    thread, no worker process starts. On this CPU host the verification fails (a CUTLASS kernel runs on CUDA
    tensors only), which is remembered as a worker's failure would be, and torch serves; a kernel the pack lacks
    (a fused activation) goes to the worker."""
    from l2c.prepare import FAILED
    from l2c.targets.cutlass import shim
    _, table_path, pack_path, _ = built
    cache_dir = tmp_path / "empty-cache"
    monkeypatch.setenv("L2C_PACK", str(pack_path))
    monkeypatch.setenv("L2C_CACHE_DIR", str(cache_dir))
    _hide_nvcc(monkeypatch, tmp_path)          # nothing can be compiled: what is served comes from the pack
    shim.shim_library.cache_clear()            # the call-plan shim is not built in this cache either
    table = load_table(table_path)
    dispatcher = Dispatcher(table, allow_cpu=True, prepare="background")
    entry = next(iter(table.exact.values()))
    a = torch.randn(entry.m, entry.k, dtype=torch.float16)
    b = torch.randn(entry.k, entry.n, dtype=torch.float16)
    bias = torch.randn(entry.n, dtype=torch.float16)

    torch.testing.assert_close(dispatcher.matmul(a, b), torch.matmul(a, b))
    job = dispatcher._job(entry, ("f16", "row,row,row", entry.m, entry.n, entry.k, False, "none", "cpu"))
    assert dispatcher.preparer.state(job) == FAILED
    reason = dispatcher.preparer.reason(job)
    assert "verification failed" in reason and "CUDA tensors" in reason, reason
    print(f"\nprepared on the calling thread in {1e3 * dispatcher.preparer.seconds[job.key]:.1f} ms")
    assert len(list((cache_dir / "cutlass").glob("*.so"))) == 1     # installed from the pack during the call
    assert dispatcher.preparer._thread is None                      # no worker process was asked
    dispatcher.matmul(a, b)                                         # remembered: not tried again
    dispatcher.matmul(a, b, bias=bias)                              # the bias kernel is in the pack too
    assert len(list((cache_dir / "cutlass").glob("*.so"))) == 2
    assert dispatcher.preparer._thread is None and dispatcher.stats == {"tuned": 0, "fallback": 3}

    # a kernel the pack lacks goes the background way: the worker, which cannot build it here
    torch.testing.assert_close(dispatcher.matmul(a, b, activation="relu"), torch.relu(torch.matmul(a, b)))
    relu = dispatcher._job(entry, ("f16", "row,row,row", entry.m, entry.n, entry.k, False, "relu", "cpu"))
    assert dispatcher.preparer.state(relu) in ("queued", FAILED) and dispatcher.preparer._thread is not None
    assert dispatcher.wait(timeout=300)
    assert dispatcher.preparer.state(relu) == FAILED and "not in l2c's prebuilt pack" in dispatcher.preparer.reason(relu)


@needs_nvcc
def test_a_kernel_loaded_before_the_shim_is_built_takes_it_later(built, monkeypatch, tmp_path):
    """A kernel prepared on a caller's thread does not wait for the host C compiler to build the call-plan shim:
    the shim builds in a daemon thread, and the kernel takes it once it is there."""
    from l2c.targets.cutlass import shim
    from l2c.targets.cutlass.build import build_prebuilt
    _, _, pack_path, kernels = built
    monkeypatch.setenv("L2C_PACK", str(pack_path))
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "empty-cache"))
    shim.shim_library.cache_clear()
    kernel = build_prebuilt(_valid(kernels[0]))
    assert kernel._run_planned is None and kernel._shim_pending
    assert shim.building() or shim._ready()
    shim._background.join(timeout=60)
    kernel._adopt_shim()
    assert kernel._run_planned is not None and not kernel._shim_pending
    assert list((tmp_path / "empty-cache" / "native").glob("cutlass_call_plan_*.so"))
