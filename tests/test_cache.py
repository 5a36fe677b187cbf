"""The build cache: location override, content hashing, the inter-process lock and atomic writes."""
import threading
from pathlib import Path

import filelock
import pytest

from l2c import cache


def test_cache_dir_honours_env(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"
    sub = cache.cache_dir("triton", "x")
    assert sub == tmp_path / "c" / "triton" / "x" and sub.is_dir()


def test_relative_cache_dir_is_made_absolute(tmp_path, monkeypatch):
    # nvcc runs in a temporary working directory: a relative root must not be passed through as is
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cache.ENV_VAR, ".l2c_cache")
    folder = cache.cache_dir("cutlass")
    assert folder.is_absolute() and folder == tmp_path / ".l2c_cache" / "cutlass" and folder.is_dir()


def test_cache_dir_default_is_user_cache(monkeypatch):
    import platformdirs
    monkeypatch.delenv(cache.ENV_VAR, raising=False)
    monkeypatch.setattr(platformdirs, "user_cache_dir", lambda app: f"/tmp/l2c-test-default-{app}")
    assert str(cache.cache_dir()) == "/tmp/l2c-test-default-l2c"


def test_content_hash_separates_parts():
    assert cache.content_hash("ab", "c") != cache.content_hash("a", "bc")
    assert cache.content_hash("x", "y") == cache.content_hash("x", "y")
    assert len(cache.content_hash("x")) == 64


def test_locked_excludes_a_second_holder(tmp_path):
    target = tmp_path / "kernel.so"
    holding, release = threading.Event(), threading.Event()

    def hold():
        with cache.locked(target):
            holding.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert holding.wait(10)
    with pytest.raises(filelock.Timeout):
        with cache.locked(target, timeout=0.1):
            pass
    release.set()
    t.join()
    with cache.locked(target, timeout=1):
        pass


def test_write_atomic_replaces_whole_file(tmp_path):
    path = tmp_path / "f.py"
    cache.write_atomic(path, "old")
    cache.write_atomic(path, b"new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["f.py"]


def test_an_edited_cached_triton_module_is_rewritten_before_import(tmp_path, monkeypatch):
    """The cache file is named by its content's hash: a file whose content differs is never imported."""
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path))
    from l2c.targets.triton.build import load_module
    source = "def launch(*a):\n    return 'generated'\n\n\ndef prepare(*a):\n    return None\n"
    _, path = load_module(source, "edited")
    path.write_text(source.replace("'generated'", "'edited on disk'"))
    import sys
    for name in [n for n in sys.modules if n.startswith("l2c_triton_edited_")]:
        del sys.modules[name]   # a fresh process: nothing imported yet
    module, again = load_module(source, "edited")
    assert again == path and module.launch() == "generated" and path.read_text() == source


def test_a_cached_triton_module_already_right_is_imported_without_the_lock(tmp_path, monkeypatch):
    """A read-only cache (an image's, a shared mount) cannot create lock files: a module whose content is right is
    served from it; here the lock cannot be taken (its path is a folder), as on a read-only mount."""
    import sys
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path))
    from l2c.targets.triton.build import load_module
    source = "def launch(*a):\n    return 'cached'\n\n\ndef prepare(*a):\n    return None\n"
    _, path = load_module(source, "readonly")
    Path(f"{path}.lock").unlink(missing_ok=True)
    Path(f"{path}.lock").mkdir()
    for name in [n for n in sys.modules if n.startswith("l2c_triton_readonly_")]:
        del sys.modules[name]   # a fresh process: nothing imported yet
    module, again = load_module(source, "readonly")
    assert again == path and module.launch() == "cached"
    path.write_text("damaged")   # a file that must be rewritten still takes the lock (and fails here without it)
    for name in [n for n in sys.modules if n.startswith("l2c_triton_readonly_")]:
        del sys.modules[name]
    with pytest.raises(OSError):
        load_module(source, "readonly")


def test_out_of_the_wrong_dtype_raises_as_torch_does():
    """torch.matmul(out=...) refuses an `out` of another dtype; so does a kernel, rather than cast into it."""
    import torch
    from l2c.build import build
    from l2c.parser import parse_one
    from l2c.validate import validate
    kernel = build(validate(parse_one("kernel o { types a=f16 b=f16 c=f16 tile m=16 n=16 k=16 }"), "triton"))
    a, b = torch.randn(8, 8).half(), torch.randn(8, 8).half()
    with pytest.raises(RuntimeError):
        torch.matmul(a, b, out=torch.empty(8, 8))
    wrong = torch.full((8, 8), 7.0)
    with pytest.raises(ValueError, match="out must be torch.float16"):
        kernel(a, b, out=wrong)
    assert bool((wrong == 7.0).all())
