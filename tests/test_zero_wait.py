"""scripts/zero_wait.py, the issue #19 measurement, on what needs no GPU: what it chooses to measure, that the job it
watches is the one the dispatcher queues, the summary of its per-call numbers, and its fresh processes."""
from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def zw():
    spec = importlib.util.spec_from_file_location("zero_wait", ROOT / "scripts" / "zero_wait.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pack(zw):
    from l2c.targets.cutlass.pack import read_pack
    return read_pack(zw.shipped("packs", "sm_90.zip"))


@pytest.fixture(scope="module")
def prebuilt(zw, pack):
    from l2c.tuned_table import load_table
    return zw.pick_prebuilt(load_table(zw.shipped("tuned", "sm_90.json")), pack)


def test_a_packed_entry_and_a_one_knob_variant_the_pack_lacks(zw, pack, prebuilt):
    from l2c.errors import L2ValidationError
    from l2c.parser import parse_one
    from l2c.validate import validate
    assert prebuilt.target == "cutlass" and zw.in_pack(prebuilt, pack)
    variant, change = zw.unbuilt_variant(prebuilt, pack)
    assert not zw.in_pack(variant, pack)
    before, after = parse_one(prebuilt.spec_text), parse_one(variant.spec_text)
    differ = [f for f in before.knob_values() if getattr(before, f) != getattr(after, f)]
    assert len(differ) == 1 and change.startswith(differ[0])
    assert (variant.m, variant.n, variant.k, variant.layout, variant.dtype) == \
        (prebuilt.m, prebuilt.n, prebuilt.k, prebuilt.layout, prebuilt.dtype)
    specs = zw.batch_specs(pack, 32)
    names = [s.split()[1] for s in specs]
    assert len(specs) == 32 and len(set(names)) == 32
    staged = zw.batch_specs(pack, 32, "staged")   # the same kernels, with the staged store wherever it is valid
    assert [s.split()[1] for s in staged] == names
    changed = [(a, b) for a, b in zip(specs, staged) if a != b]
    assert changed and all(parse_one(b) == parse_one(a).replace(epilogue_store="staged") for a, b in changed)
    for kept in (a for a, b in zip(specs, staged) if a == b):   # kept: staged already, or the staged store not valid
        if parse_one(kept).epilogue_store != "staged":
            with pytest.raises(L2ValidationError):
                validate(parse_one(kept).replace(epilogue_store="staged"), "cutlass")


def test_the_watched_job_is_the_one_the_dispatcher_queues(zw, prebuilt):
    """The job whose state the part reads is the one the dispatcher queues: the background worker takes it (and, on
    a CPU, fails its check: a CUTLASS kernel needs CUDA tensors), and the preparer records it under that key."""
    import dataclasses
    from l2c.dispatch import Dispatcher
    from l2c.prepare import FAILED, QUEUED
    from l2c.tuned_table import TunedTable
    entry = dataclasses.replace(prebuilt, m=64, n=128, k=64)   # same spec and layouts, a shape the CPU runs fast
    dispatcher = Dispatcher(TunedTable([entry]), allow_cpu=True, prepare="background", online=False)
    a = torch.randn(64, 64, dtype=torch.float16)
    b = torch.randn(128, 64, dtype=torch.float16).t() if entry.layout.split(",")[1] == "col" else \
        torch.randn(64, 128, dtype=torch.float16)
    dispatcher.matmul(a, b)
    job = zw.queued_job(entry, "cpu")
    assert dispatcher.preparer.state(job) in (QUEUED, FAILED)
    assert dispatcher.wait(300) and dispatcher.preparer.state(job) == FAILED
    assert dispatcher.stats == {"tuned": 0, "fallback": 1}


def test_the_summary_of_per_call_numbers(zw):
    # (call, t_s, torch_ms, l2c_ms, served)
    calls = [(1, 0.0, 1.0, 31.0, False), (2, 0.5, 1.0, 1.5, False), (3, 1.0, 1.0, 61.0, True),
             (4, 1.2, 1.0, 1.0, True), (5, 1.3, 1.0, 0.9, True)]
    s = zw.summarise(calls)
    assert s["first_call"]["extra_ms"] == 30.0 and s["first_served_call"] == 3
    assert s["seconds_until_served"] == pytest.approx(1.061)
    assert (s["max_extra_ms"], s["max_extra_call"], s["calls_over_50ms_extra"]) == (60.0, 3, 1)
    assert s["before_served"]["calls"] == 2 and s["after_served"]["calls"] == 3
    assert [c[0] for c in s["raw"]["slow"]] == [1, 3]
    assert zw.judge_unbuilt({"summary": s})["pass"] is False
    assert zw.judge_prebuilt({"summary": s})["pass"] is False       # served from call 3
    never = zw.summarise([(1, 0.0, 1.0, 2.0, False)])
    assert never["first_served_call"] is None and zw.judge_unbuilt({"summary": never})["pass"] is False


def test_fresh_environments_and_process_trees(zw, tmp_path, monkeypatch):
    monkeypatch.setenv("L2C_PREPARE", "inline")
    monkeypatch.setenv("L2C_NVCC", "/opt/nvcc")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere")
    env = zw.fresh_env(tmp_path, L2C_PACK="/none")
    assert "L2C_PREPARE" not in env and env["L2C_NVCC"] == "/opt/nvcc" and env["L2C_PACK"] == "/none"
    for name in zw.CACHE_VARS:
        assert Path(env[name]).is_dir() and not any(Path(env[name]).iterdir()) and tmp_path in Path(env[name]).parents
    busy = zw.run_tree([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t "
                        "< 0.5: pass"], env, tmp_path, 30)
    assert busy["rc"] == 0 and busy["cpu_s"] >= 0.4
    start = time.monotonic()   # a grandchild holding the output pipe is killed with its group at the timeout
    stuck = zw.run_tree([sys.executable, "-c", "import subprocess, time\nsubprocess.Popen(['sleep', '60'])\n"
                         "time.sleep(60)"], env, tmp_path, 1)
    assert stuck["rc"] == 124 and time.monotonic() - start < 20
