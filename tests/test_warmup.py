"""`l2c warmup`: every kernel a table serves is built ahead of use (CUTLASS from the shipped pack when there is no
nvcc, Triton modules generated); a kernel that cannot be built is named and fails the command; a bad table is one
line. Real tables, the real shipped pack, the real build cache."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from l2c.ir import KernelSpec
from tests.test_pack import _hide_nvcc

ROOT = Path(__file__).resolve().parent.parent


def _table(path: Path, entries) -> Path:
    path.write_text(json.dumps({"format": 1, "arch": "sm_90", "gpu": "test", "protocol": "kernel",
                                "entries": entries}))
    return path


def _shipped_cutlass_entry() -> dict:
    table = json.loads((ROOT / "l2c" / "tuned" / "sm_90.json").read_text())
    return next(e for e in table["entries"] if e["target"] == "cutlass" and "m_range" not in e)


def _warmup(*args, env):
    return subprocess.run([sys.executable, "-m", "l2c", "warmup", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT)


@pytest.fixture
def no_nvcc_env(tmp_path, monkeypatch):
    import os
    _hide_nvcc(monkeypatch, tmp_path)
    return dict(os.environ, L2C_CACHE_DIR=str(tmp_path / "cache"), TRITON_INTERPRET="1")


def test_warmup_builds_every_served_kernel_from_the_pack_without_nvcc(tmp_path, no_nvcc_env):
    triton = {"m": 64, "n": 64, "k": 64, "batch": 1, "dtype": "f16", "layout": "row,row,row", "target": "triton",
              "spec": KernelSpec(name="w", target="triton", tile_m=32, tile_n=32, tile_k=32).to_l2(),
              "tflops": 2.0, "baseline_tflops": 1.0}
    table = _table(tmp_path / "t.json", [_shipped_cutlass_entry(), triton])
    done = _warmup(table, "--device", "cpu", "-j", "2", env=no_nvcc_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 kernels" in done.stdout and done.stdout.count("] built ") == 4, done.stdout   # 2 entries x 2 epilogues
    assert "4 ready, 0 failed" in done.stdout
    libraries = list((tmp_path / "cache" / "cutlass").glob("*.so"))
    assert len(libraries) == 2                     # the CUTLASS entry without and with nn.Linear's bias
    again = _warmup(table, "--device", "cpu", env=no_nvcc_env)   # everything is a cache hit now
    assert again.returncode == 0 and "4 ready" in again.stdout


def test_warmup_names_a_kernel_it_cannot_build_and_fails(tmp_path, no_nvcc_env):
    entry = dict(_shipped_cutlass_entry())
    entry["spec"] = KernelSpec(name="notpacked", target="cutlass", tile_m=128, tile_n=64, tile_k=64,
                               pipeline_stages=3).to_l2()   # a kernel the shipped pack does not hold
    table = _table(tmp_path / "t.json", [entry])
    done = _warmup(table, "--device", "cpu", env=no_nvcc_env)
    assert done.returncode == 1
    assert "FAILED to build" in done.stdout and "nvcc not found" in done.stdout and "prebuilt pack" in done.stdout
    assert "0 ready, 2 failed" in done.stderr


def test_warmup_names_an_entry_whose_spec_does_not_parse_and_builds_the_others(tmp_path, no_nvcc_env):
    """One entry's bad spec fails that entry (the dispatcher sends its calls to torch), not the whole table."""
    good = {"m": 64, "n": 64, "k": 64, "batch": 1, "dtype": "f16", "layout": "row,row,row", "target": "triton",
            "spec": KernelSpec(name="w", target="triton", tile_m=32, tile_n=32, tile_k=32).to_l2(),
            "tflops": 2.0, "baseline_tflops": 1.0}
    table = _table(tmp_path / "t.json", [dict(good, spec="kernel bad {", m=8, n=16, k=24), good])
    done = _warmup(table, "--device", "cpu", env=no_nvcc_env)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "FAILED" in done.stdout and "the entry f16 row,row,row 8x16x24" in done.stdout, done.stdout
    assert "2 ready, 1 failed" in done.stderr


@pytest.mark.parametrize("table", [{"arch": ["sm_90"], "entries": []},
                                   {"arch": "sm_90", "entries": [{"m": 8, "n": 8, "k": 8, "dtype": "f16",
                                                                  "layout": "row,row,row", "target": "triton",
                                                                  "spec": "kernel w { }", "baseline_tflops": 1.0,
                                                                  "tflops": int("1" + "0" * 400)}]}])
def test_warmup_of_a_table_with_values_json_holds_but_python_chokes_on_is_one_line(table, tmp_path, no_nvcc_env):
    """An unhashable arch and an integer past float's range: a one-line error or a malformed entry counted,
    never a TypeError or OverflowError traceback (the default dispatcher reads tables through the same code)."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    done = _warmup(path, "--device", "cpu", env=no_nvcc_env)
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    assert "t.json" in done.stdout + done.stderr and (done.stdout + done.stderr).count("t.json: t.json") == 0


def test_warmup_of_a_file_that_is_not_a_table_is_one_line(tmp_path, no_nvcc_env):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    done = _warmup(bad, env=no_nvcc_env)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "bad.json" in done.stderr


def test_warmup_records_each_verified_kernel_so_a_later_process_serves_it_from_its_first_call(tmp_path, monkeypatch):
    """What `l2c warmup` does on a GPU, here on the interpreter: each served kernel is verified at the shape it serves
    and the pass recorded under the job a call at that shape makes; a dispatcher of a later process then serves the
    kernel from its first call, with no worker."""
    import torch
    import l2c
    from l2c.commands.warmup import verify_served
    from l2c.dispatch import set_tuned_table
    from l2c.parser import parse_one
    from l2c.build import build
    from l2c.tuned_table import load_table, served_kernels
    from l2c.validate import validate
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "cache"))
    spec = KernelSpec(name="w", target="triton", problem_m="any", problem_n="any", problem_k="any", tile_m=16,
                      tile_n=16, tile_k=16, layout_b="col", swizzle_group=1, launch_warps=4)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": 1, "arch": "sm_90", "protocol": "kernel", "entries": [
        {"m": 32, "n": 48, "k": 40, "batch": 1, "dtype": "f16", "layout": "row,col,row", "target": "triton",
         "spec": spec.to_l2(), "tflops": 2.0, "baseline_tflops": 1.0}]}))
    table = load_table(path)
    built = [(k, validate(parse_one(k.spec_text), k.target, "sm_90")) for k in served_kernels(table)[0]]
    for _, valid in built:
        build(valid)
    assert len(built) == 2 and verify_served(built, "cpu") == 0        # with and without a bias
    dispatcher = set_tuned_table(table, allow_cpu=True, prepare="background")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    torch.testing.assert_close(l2c.matmul(a, w.t()).float(), a.float() @ w.float().t(), atol=2e-2, rtol=2e-2)
    assert dispatcher.stats == {"tuned": 1, "fallback": 0} and not dispatcher.preparer.seconds
    set_tuned_table(None)
