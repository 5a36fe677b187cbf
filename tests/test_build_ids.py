"""Build ids: every measurement names the build it timed, and the store serves only figures of the build the
current templates and toolchain make, so a template change retires old figures by itself (real SQLite, real
templates rendered through a changed copy)."""
from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import jinja2
import pytest

from l2c import lower
from l2c.build import build_id, build_id_of
from l2c.commands.import_results import results_from_rows
from l2c.ir import KernelSpec
from l2c.search.store import Result, Store
from l2c.validate import validate

PROBLEM = "64x64x64x1:f16:row,row,row:sm_90"
SPEC = KernelSpec(name="b", tile_m=64, tile_n=64, tile_k=32).to_l2()
TEMPLATES = Path(lower.__file__).resolve().parent.parent / "templates"


def result(speedup, build=None, spec=SPEC):
    return Result(PROBLEM, spec, "triton", "gpu", "kernel", "ok", speedup=speedup, build=build)


@pytest.fixture
def change_template(tmp_path, monkeypatch):
    """Call it to render through the real templates with one more line in every Triton gemm module."""
    def change():
        copy = tmp_path / "templates"
        shutil.copytree(TEMPLATES, copy)
        gemm = copy / "triton" / "gemm.py.j2"
        gemm.write_text(gemm.read_text() + "\n# one more line\n")
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(copy)), undefined=jinja2.StrictUndefined,
                                 keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
        monkeypatch.setattr(lower, "environment", lambda: env)
        build_id_of.cache_clear()
    yield change
    build_id_of.cache_clear()


def test_the_build_id_follows_the_generated_code():
    spec = KernelSpec(name="b", split_k_slices=2)
    ids = {build_id(validate(s, "triton")) for s in (spec, spec.replace(split_k_reduce="finalize"),
                                                      spec.replace(name="c"), spec.replace(tile_k=32))}
    assert len(ids) == 4
    assert build_id(validate(spec, "triton")) == build_id_of(spec.to_l2(), "triton", "sm_90")
    assert build_id_of(KernelSpec(name="x", tile_m=16).to_l2(), "cutlass", "sm_90") == ""   # rule wgmma-tile-m


def test_the_store_serves_only_the_current_build_and_keeps_the_rest(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    store.record(result(1.2))                        # measured now: recorded under the current build
    store.record(result(9.0, build="an old build"))
    assert [r.speedup for r in store.results()] == [1.2]
    assert store.best(PROBLEM, "gpu", "kernel").speedup == 1.2
    assert store.get(PROBLEM, SPEC, "triton", "gpu", "kernel").build == build_id_of(SPEC, "triton", "sm_90")
    assert sorted(r.speedup for r in store.results(stale=True)) == [1.2, 9.0]


def test_a_template_change_retires_the_old_figures_by_itself(tmp_path, change_template):
    store = Store(tmp_path / "r.sqlite")
    before = build_id_of(SPEC, "triton", "sm_90")
    store.record(result(1.3))
    assert store.best(PROBLEM, "gpu", "kernel").speedup == 1.3
    change_template()
    assert build_id_of(SPEC, "triton", "sm_90") != before
    assert store.best(PROBLEM, "gpu", "kernel") is None and store.get(PROBLEM, SPEC, "triton", "gpu", "kernel") is None
    assert [r.speedup for r in store.results(stale=True)] == [1.3]


def test_a_store_written_before_builds_keeps_its_rows_as_unknown_builds(tmp_path):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript("""
            CREATE TABLE results (problem TEXT NOT NULL, spec TEXT NOT NULL, target TEXT NOT NULL, gpu TEXT NOT NULL,
                protocol TEXT NOT NULL, status TEXT NOT NULL, tflops REAL, baseline_tflops REAL, speedup REAL,
                reason TEXT NOT NULL DEFAULT '', source TEXT NOT NULL, params TEXT NOT NULL, time REAL NOT NULL,
                confirmed REAL, PRIMARY KEY (problem, spec, target, gpu, protocol));""")
        db.execute("INSERT INTO results VALUES (?, ?, 'triton', 'gpu', 'kernel', 'ok', 1, 1, 1.5, '', 'tpe', '{}', 1, "
                   "NULL)", (PROBLEM, SPEC))
    store = Store(path)
    assert list(store.results()) == []
    assert [(r.speedup, r.build) for r in store.results(stale=True)] == [(1.5, "unknown")]
    store.record(result(1.1))                        # the new key: the same spec, now with its build
    assert [r.speedup for r in store.results()] == [1.1] and store.count() == 2


def test_imported_bench_rows_count_only_when_they_timed_todays_build():
    env = {"type": "env", "gpu": "gpu", "date": "2026-12-01T00:00:00+00:00"}
    base = {"type": "result", "kernel": "k", "name": "b", "source": "x", "target": "triton", "m": 64, "n": 64,
            "k": 64, "batch": 1, "protocol": "kernel", "dtype": "f16", "layout": "row,row,row", "status": "ok",
            "speedup": 1.2, "candidate_tflops": 1.0, "baseline_tflops": 1.0, "spec": SPEC, "verified": True}
    rows = [env, dict(base, build_id=build_id_of(SPEC, "triton", "sm_90")), dict(base, m=128, build_id="other"),
            dict(base, m=256)]
    results, counts = results_from_rows(json.loads(json.dumps(rows)), "sm_90", {})
    assert counts["imported"] == 3 and counts["stale"] == 2
    assert [r.build for r in results] == [None, "unknown", "unknown"]
