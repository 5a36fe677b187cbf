"""The tuner (issue #5): search space, store, driver with real interpreter kernels, policy transfer,
resume after a kill, and concurrent writers. Everything here runs on CPU."""
from __future__ import annotations

import itertools
import json
import math
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState

from l2c.parser import parse_one
from l2c.search.driver import tune
from l2c.search.export import export
from l2c.search.runners import FunctionRunner, InterpreterRunner, ModelRunner
from l2c.search.space import (KNOB_PARAMS, Problem, check_point, params_from_spec, params_for, parse_shape, problems,
                              shapes_from_arg, spec_from_params, suggest_params)
from l2c.search.storage import parse_storage
from l2c.search.store import Result, Store
from l2c.search.study import COUNTED, TuneConfig, counted_trials, point_key
from l2c.search.workers import StudyWorker, run_studies
from l2c.validate import validate
from tests.toolchain import needs_nvcc

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ space

def test_space_is_the_searchable_knob_table_and_conditional_on_target():
    from l2c.knobs import KNOBS
    assert [p.name for p in KNOB_PARAMS] == [k.field for k in KNOBS if k.searchable]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = set()
    for _ in range(30):
        t = study.ask()
        params = suggest_params(t, ["triton", "cutlass"])
        target = params["target"]
        seen.add(target)
        assert set(t.params) == {"target"} | {p.name for p in params_for(target)}
        if target == "triton":
            assert "cluster_m" not in params and "launch_warps" in params
        else:
            assert "launch_warps" not in params and "cluster_m" in params
        study.tell(t, 1.0)
    assert seen == {"triton", "cutlass"}


def test_spec_from_params_round_trips_and_generic_keeps_dims_open():
    p = Problem(256, 512, 128, dtype="bf16", layout_b="col")
    params = {"target": "cutlass", "tile_m": 128, "tile_n": 128, "tile_k": 64, "pipeline_stages": "auto",
              "launch_schedule": "cooperative", "launch_swap": "no", "cluster_m": 2, "cluster_n": 1,
              "swizzle_group": 8, "swizzle_raster": "m", "split_k_slices": 1, "split_k_mode": "workspace"}
    spec = spec_from_params(params, p)
    assert (spec.problem_m, spec.types_a, spec.layout_b, spec.target) == (256, "bf16", "col", "cutlass")
    assert params_from_spec(parse_one(spec.to_l2())) == params
    generic = spec_from_params(params, p, generic=True)
    assert generic.fixed_shape is None
    valid, reason = check_point(params, p)
    assert valid is not None and reason is None
    bad, reason = check_point(dict(params, tile_m=32), p)
    assert bad is None and reason.startswith("wgmma-tile-m")
    assert Problem.from_key(p.key()) == p


def test_shapes_argument():
    assert shapes_from_arg("64x32x16,8x8x8x4") == [(64, 32, 16, 1), (8, 8, 8, 4)]
    assert len(shapes_from_arg("square")) > 5
    with pytest.raises(ValueError):
        shapes_from_arg("64x32")
    with pytest.raises(ValueError):
        problems([(1, 2, 3)], layout="row,row")


# ------------------------------------------------------------------------------------------------ store

def _writer(path: str, who: int, n: int) -> None:
    store = Store(path, timeout_s=60)
    for i in range(n):
        store.record(Result(problem=f"p{i % 5}", spec=f"spec {who}-{i}", target="triton", gpu="g", protocol="kernel",
                            status="ok", speedup=1.0 + i, source="tpe", params={"i": i}))


def test_store_two_processes_write_one_sqlite_file(tmp_path):
    path = str(tmp_path / "results.sqlite")
    Store(path)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 150)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    store = Store(path)
    assert store.count() == 300
    assert store.best("p4", "g", "kernel").speedup == 150.0
    rows = list(store.results(problem="p0"))
    assert len(rows) == 60 and rows[0].params["i"] % 5 == 0


def test_store_failures_never_win(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    base = dict(problem="p", target="triton", gpu="g", protocol="kernel", source="tpe")
    store.record(Result(spec="a", status="verify_failed", speedup=99.0, reason="wrong", **base))
    store.record(Result(spec="b", status="ok", speedup=0.5, **base))
    assert store.best("p", "g", "kernel").spec == "b"


# ------------------------------------------------------------------------------- driver, real kernels

def test_tune_with_interpreter_kernels_builds_valid_points_only_and_once(tmp_path, monkeypatch):
    import l2c.build
    real_build = l2c.build.build
    built = []

    def counting_build(valid):
        built.append((valid.spec.to_l2(), valid.target))
        return real_build(valid)

    monkeypatch.setattr(l2c.build, "build", counting_build)
    probs = [Problem(32, 32, 32), Problem(48, 32, 16)]
    store = Store(tmp_path / "r.sqlite")
    runner = InterpreterRunner()
    cfg = TuneConfig(targets=("triton",), n_trials=4, seed=0)
    studies = tune(probs, cfg, runner, store, storage_arg=f"journal:{tmp_path / 'j.log'}", log=lambda s: None)

    # every invalid point was recorded with its rule and told PRUNED; build() saw only evaluated points
    invalid = [t for s in studies for t in s.trials if t.user_attrs.get("status") == "invalid"]
    assert invalid and all(t.state == TrialState.PRUNED and t.user_attrs["reason"] for t in invalid)
    assert all(check_point(t.params, p)[0] is None for s, p in zip(studies, probs) for t in s.trials
               if t.user_attrs.get("status") == "invalid")
    evaluated = {spec_from_params(t.params, p, generic=True).to_l2()
                 for s, p in zip(studies, probs) for t in counted_trials(s)}
    # compile once: one build per distinct shape-generic spec, however many shapes measured it
    assert {spec for spec, _ in built} == evaluated
    assert len(built) == len(evaluated) == runner.builds
    for s in studies:
        counted = counted_trials(s)
        assert len(counted) == cfg.n_trials
        assert len({tuple(sorted(t.params.items())) for t in counted}) == len(counted)
    ok = list(store.results(status="ok"))
    assert ok and all(r.speedup > 0 and r.tflops > 0 for r in ok)
    # the tuned table follows docs/CONTRACTS.md and its specs parse and validate
    written = export(store, probs, runner.gpu, "kernel", tmp_path / "out")
    table = json.loads(written["sm_90"].read_text())
    assert table["format"] == 1 and table["arch"] == "sm_90" and table["protocol"] == "kernel"
    assert {(e["m"], e["n"], e["k"]) for e in table["entries"]} == {(32, 32, 32), (48, 32, 16)}
    for e in table["entries"]:
        assert e["layout"] == "row,row,row" and e["dtype"] == "f16" and e["tflops"] > 0 and e["baseline_tflops"] > 0
        validate(parse_one(e["spec"]), e["target"])
    assert len(list((tmp_path / "out" / "specs").glob("*.l2"))) == 2
    from l2c.dispatch import TunedTable
    TunedTable.load(written["sm_90"])    # the dispatcher reads what the tuner writes


def test_invalid_points_are_never_built_and_failures_cannot_win(tmp_path):
    calls = []

    def reward(params, problem):
        calls.append(params)
        assert check_point(params, problem)[0] is not None   # the runner only ever sees valid points
        return -1.0 if params["tile_k"] == 16 else params["tile_m"] / 64   # tile_k 16 "fails verification"

    runner = FunctionRunner(reward)
    store = Store(":memory:")
    p = Problem(256, 256, 256)
    cfg = TuneConfig(targets=("triton", "cutlass"), n_trials=25, seed=1, sampler="random")
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    run_studies([StudyWorker(study, p, runner, store, cfg)])
    states = {t.user_attrs.get("status") for t in study.trials}
    assert "invalid" in states and "verify_failed" in states
    assert len(calls) == 25
    assert study.best_trial.user_attrs["status"] == "ok"
    assert store.best(p.key(), runner.gpu, "kernel").status == "ok"


# ----------------------------------------------------------------------------- confirmation of leaders

_CUTLASS_POINT = {"target": "cutlass", "tile_m": 128, "tile_n": 128, "tile_k": 64, "pipeline_stages": "auto",
                  "launch_schedule": "cooperative", "launch_swap": "no", "cluster_m": 1, "cluster_n": 1,
                  "swizzle_group": 8, "swizzle_raster": "m", "split_k_slices": 1, "split_k_mode": "workspace"}


def _stale_store(tmp_path, runner, p, stale):
    """A store whose rows say `stale` (tile_n -> speedup): figures of earlier runs, as `l2c import` leaves them."""
    store = Store(tmp_path / "s.sqlite")
    for tile_n, speedup in stale.items():
        params = dict(_CUTLASS_POINT, tile_n=tile_n)
        assert check_point(params, p)[0] is not None
        store.record(Result(problem=p.key(), spec=spec_from_params(params, p, generic=True).to_l2(),
                            target="cutlass", gpu=runner.gpu, protocol="kernel", status="ok", speedup=speedup,
                            source="import", params=params))
    return store


def test_confirmation_measures_leaders_until_one_holds_and_only_confirmed_results_are_exported(tmp_path):
    from l2c.search.confirm import confirm, confirm_leaders
    today = {64: 1.2, 128: 1.0, 192: -1.0, 256: 0.8}   # what each spec measures now; 192 now fails to verify
    measured = []

    def reward(params, problem):
        measured.append(params["tile_n"])
        return today[params["tile_n"]]

    runner = FunctionRunner(reward)
    p = Problem(512, 1024, 1024)
    stale = {128: 3.0, 192: 2.5, 256: 2.0, 64: 1.1}
    store = _stale_store(tmp_path, runner, p, stale)
    since = confirm([p], runner, store, "kernel", budget=10, log=lambda s: None)
    # the stale leaders fall one by one, the failure replaces its stored success, and 64 takes and holds the lead
    assert measured == [128, 192, 256, 64]
    best = store.best(p.key(), runner.gpu, "kernel", confirmed_since=since)
    assert best.params["tile_n"] == 64 and best.speedup == 1.2 and best.source == "import"
    rows = {r.params["tile_n"]: r for r in store.results(problem=p.key())}
    assert rows[192].status == "verify_failed" and rows[192].confirmed >= since
    earlier = tmp_path / "out" / "specs" / "gemm_512x1024x1024_f16_rrr_triton.l2"   # an earlier export's winner
    earlier.parent.mkdir(parents=True)
    earlier.write_text("kernel old {}")
    table = json.loads(export(store, [p], runner.gpu, "kernel", tmp_path / "out", confirmed_since=since)["sm_90"]
                       .read_text())
    (entry,) = table["entries"]
    assert parse_one(entry["spec"]).tile_n == 64 and entry["speedup"] == 1.2
    assert [f.name for f in earlier.parent.iterdir()] == ["gemm_512x1024x1024_f16_rrr_cutlass.l2"]
    # resumable: a restarted round finds its leader confirmed and measures nothing
    assert confirm_leaders([p], runner, store, since, budget=10, log=lambda s: None)[p.key()].speedup == 1.2
    assert measured == [128, 192, 256, 64]

    # a budget of one: the only confirmed result wins, however much higher the unconfirmed stale figures are
    measured.clear()
    store = _stale_store(tmp_path / "b", runner, p, stale)
    since = confirm([p], runner, store, "kernel", budget=1, log=lambda s: None)
    assert measured == [128]
    assert store.best(p.key(), runner.gpu, "kernel").speedup == 2.5          # stale, unconfirmed
    assert store.best(p.key(), runner.gpu, "kernel", confirmed_since=since).speedup == 1.0
    assert store.best(p.key(), runner.gpu, "kernel", confirmed_since=time.time() + 1) is None


def _confirm_dying_on(store_path, since, tile_n, marks_path):
    """A confirming worker whose measurement of the `tile_n` leader kills its own process (SIGKILL: no handler runs,
    as when the supervisor stops a hung worker); each `evaluating` mark is appended to `marks_path`."""
    from l2c.search.confirm import confirm_leaders

    def reward(params, problem):
        if params["tile_n"] == tile_n:
            os.kill(os.getpid(), signal.SIGKILL)
        return 1.1

    def mark(t):
        with open(marks_path, "a") as f:
            f.write(f"{t}\n")
    confirm_leaders([Problem(512, 1024, 1024)], FunctionRunner(reward), Store(store_path), since, budget=3,
                    log=lambda s: None, evaluating=mark)


def test_a_leader_whose_confirmation_never_returns_is_a_failed_candidate_to_the_restarted_worker(tmp_path):
    """A measurement that never returns ends with its worker (killed past the trial time limit): the leader is on
    record as failed before it is measured, so the restarted worker confirms the next one instead of hanging on it
    again; `evaluating` marks when each measurement began and that it ended, for the supervisor."""
    from l2c.search.confirm import HUNG, confirm_leaders
    p = Problem(512, 1024, 1024)
    store = _stale_store(tmp_path, FunctionRunner(lambda params, problem: 1.1), p, {128: 3.0, 64: 1.5})
    since, marks = time.time(), tmp_path / "marks"
    worker = mp.get_context("fork").Process(target=_confirm_dying_on, args=(store.path, since, 128, str(marks)))
    worker.start()
    worker.join(60)
    assert worker.exitcode == -9
    rows = {r.params["tile_n"]: r for r in store.results(problem=p.key())}
    assert rows[128].status == "verify_failed" and rows[128].reason == HUNG and rows[128].confirmed >= since
    began = [float(t) for t in marks.read_text().split()]
    assert len(began) == 1 and began[0] >= since   # began, never ended
    restarted = mp.get_context("fork").Process(target=_confirm_dying_on, args=(store.path, since, 128, str(marks)))
    restarted.start()
    restarted.join(60)
    assert restarted.exitcode == 0
    assert [float(t) for t in marks.read_text().split()][1:] == [pytest.approx(time.time(), abs=60), 0.0]
    won = store.best(p.key(), "function", "kernel", confirmed_since=since)
    assert won.params["tile_n"] == 64 and won.speedup == 1.1
    # an exception instead (its user's Ctrl-C, or a fault of the measuring code itself): the leader keeps its record
    # (and in a process no supervisor watches, no `evaluating`, nothing is written before the outcome)
    for raised, watched in itertools.product((KeyboardInterrupt, RuntimeError, SystemExit), (True, False)):
        store = _stale_store(tmp_path / f"{raised.__name__}{watched}", FunctionRunner(lambda params, problem: 1.1), p,
                             {128: 3.0})
        runner = FunctionRunner(lambda params, problem: (_ for _ in ()).throw(raised()))
        with pytest.raises(raised):
            confirm_leaders([p], runner, store, time.time(), budget=3, log=lambda s: None,
                            evaluating=(lambda t: None) if watched else None)
        (kept,) = store.results(problem=p.key())
        assert kept.status == "ok" and kept.speedup == 3.0 and kept.confirmed is None


def test_a_store_written_before_confirmation_existed_opens_and_records(tmp_path):
    import sqlite3
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""CREATE TABLE results (
        problem TEXT NOT NULL, spec TEXT NOT NULL, target TEXT NOT NULL, gpu TEXT NOT NULL,
        protocol TEXT NOT NULL, status TEXT NOT NULL, tflops REAL, baseline_tflops REAL, speedup REAL,
        reason TEXT NOT NULL DEFAULT '', source TEXT NOT NULL, params TEXT NOT NULL, time REAL NOT NULL,
        PRIMARY KEY (problem, spec, target, gpu, protocol));
        INSERT INTO results VALUES ('p', 'a', 'triton', 'g', 'kernel', 'ok', 1, 1, 1.5, '', 'tpe', '{}', 1.0);""")
    db.commit()
    db.close()
    store = Store(path)
    assert store.best("p", "g", "kernel") is None     # which build it timed cannot be told: kept, not served
    (old,) = store.results(stale=True)
    assert old.speedup == 1.5 and old.confirmed is None and old.build == "unknown"
    store.record(replace(old, speedup=1.25, confirmed=5.0, build=None))   # measured again now
    assert store.best("p", "g", "kernel", confirmed_since=5.0).speedup == 1.25


def test_confirmation_builds_ahead_no_leader_that_loads_without_a_compiler(tmp_path, monkeypatch):
    """The pool that builds leaders before confirmation takes only CUTLASS leaders that need nvcc: one the pack holds
    installs in milliseconds at its first build (a Triton leader compiles in the measuring process)."""
    from l2c.search.confirm import prebuild_leaders
    from l2c.search.warmstart import prebuilt_points
    from l2c.targets.cutlass.build import loads_without_compiler
    from l2c.lower import render
    from l2c.validate import validate
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "cache"))
    p = Problem(16, 14336, 4096, layout_b="col")
    store = Store(tmp_path / "r.sqlite")
    cutlass = spec_from_params(prebuilt_points(p)[0], p, generic=True)
    triton = spec_from_params({"target": "triton", "tile_m": 16, "tile_n": 64, "tile_k": 64}, p, generic=True)
    assert loads_without_compiler(render(validate(cutlass, "cutlass", "sm_90")), cutlass.name)
    for spec, speedup in ((cutlass, 1.2), (triton, 1.1)):
        store.record(Result(problem=p.key(), spec=spec.to_l2(), target=spec.target, gpu="g", protocol="kernel",
                            status="ok", tflops=speedup, baseline_tflops=1.0, speedup=speedup))
    said = []
    assert prebuild_leaders([p], store, "g", "kernel", 2, 2, said.append) == 0 and said == []


def test_tune_command_confirms_leaders_with_interpreter_kernels_and_exports_them(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "l2c", "tune", "--runner", "interpreter", "--shapes", "32x32x32", "--target", "triton",
         "--trials", "3", "--store", str(tmp_path / "r.sqlite"), "--storage", f"journal:{tmp_path / 'j.log'}",
         "--policy", "off", "--seed", "0", "--no-llm", "--confirm", "2", "--compile-workers", "2",
         "--export", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    import re
    # interpreter timings are noise: the first leader may drop below the second, which is then measured too
    spent = int(re.search(r"32x32x32: confirmed .* after (\d) re-measurement", out.stderr).group(1))
    # Triton leaders compile in the measuring process (the tune just ran them): no compile pool is started for them
    assert "confirmation: built" not in out.stderr
    assert re.search(r"32x32x32: confirmed .* re-measurement\(s\) \(build [\d.]+ s · measure [\d.]+ s\)", out.stderr)
    assert re.search(r"trials 3/3 .* build [\d.]+ s · measure [\d.]+ s ", out.stderr)   # the tune's status line
    (entry,) = json.loads((tmp_path / "out" / "sm_90.json").read_text())["entries"]
    store = Store(tmp_path / "r.sqlite")
    confirmed = sorted((r for r in store.results(status="ok") if r.confirmed is not None), key=lambda r: -r.speedup)
    assert 1 <= len(confirmed) == spent <= 2
    assert confirmed[0].spec == parse_one(entry["spec"]).to_l2() and entry["speedup"] == confirmed[0].speedup


def test_gated_problems_search_gated_kernels_and_keep_their_own_keys():
    """A gated problem (`l2c tune --gate`): its key says the gate (plain keys unchanged) and reads back, its FLOPs
    count B's 2N columns, every point becomes a gated spec, and the pack (plain GEMMs) offers it no prebuilt point."""
    from l2c.search.space import prebuilt_index, spec_from_params
    from l2c.search.store import arch_of
    plain = Problem(64, 128, 256, layout_b="col")
    gated = replace(plain, gate="silu")
    assert plain.key() == "64x128x256:f16:row,col,row:sm_90"
    assert gated.key() == "64x128x256:f16:row,col,row:gate=silu:sm_90"
    assert Problem.from_key(gated.key()) == gated and Problem.from_key(plain.key()) == plain
    assert arch_of(gated.key()) == "sm_90"
    assert gated.flops() == 2 * plain.flops()
    params = {"target": "triton", **{p.name: p.choices[0] for p in params_for("triton")}}
    assert spec_from_params(params, gated).epilogue_gate == "silu"
    assert spec_from_params(params, plain).epilogue_gate == "none"
    assert prebuilt_index(gated) == {}
    assert [p.gate for p in problems([(8, 16, 32)], layout="row,col,row", gate="gelu_tanh")] == ["gelu_tanh"]


def test_a_plain_and_a_gated_export_of_one_shape_keep_each_other(tmp_path):
    """Exporting a shape's plain winner leaves the same shape's gated winner (its spec file and table entry), and the
    other way round."""
    from l2c.search.space import spec_from_params
    store = Store(tmp_path / "r.sqlite")
    plain = Problem(64, 128, 256, layout_b="col")
    gated = replace(plain, gate="silu")
    params = {"target": "triton", **{p.name: p.choices[0] for p in params_for("triton")}, "split_k_slices": 1}
    for p in (plain, gated):
        spec = spec_from_params(params, p, generic=True)
        store.record(Result(problem=p.key(), spec=spec.to_l2(), target="triton", gpu="g", protocol="kernel",
                            status="ok", tflops=2.0, baseline_tflops=1.0, speedup=2.0))
    for p in (gated, plain):
        table = json.loads(export(store, [p], "g", "kernel", tmp_path / "out")["sm_90"].read_text())
    assert sorted(e.get("gate", "none") for e in table["entries"]) == ["none", "silu"]
    assert sorted(f.name.split("_")[0] for f in (tmp_path / "out" / "specs").iterdir()) == ["gated", "gemm"]


@pytest.mark.parametrize("existing", [
    {"format": 1, "arch": "sm_90", "gpu": "NVIDIA H200", "protocol": "kernel,call", "entries": []},
    {"format": 1, "arch": "sm_90", "gpu": "g", "protocol": "call", "entries": []},
    {"format": 1, "arch": "sm_90", "gpu": "g", "protocol": "kernel", "entries": [{"m": 1}]},
    "{", [1, 2]], ids=["other-gpu", "other-protocol", "malformed-entry", "not-json", "not-a-table"])
def test_an_export_never_replaces_a_table_it_cannot_merge_with(existing, tmp_path):
    """An export merged with a table of its own GPU and protocol and silently replaced any other (3,339 shipped
    entries became 1); one that did not read raised after the whole tune. Both are refused, before tuning
    (`check_export`) and at the export, and the file is left as it was."""
    from l2c.errors import DataFileError
    from l2c.search.export import check_export
    from l2c.search.space import spec_from_params
    out = tmp_path / "out"
    out.mkdir()
    text = existing if isinstance(existing, str) else json.dumps(existing)
    (out / "sm_90.json").write_text(text)
    store = Store(tmp_path / "r.sqlite")
    problem = Problem(64, 128, 256)
    params = {"target": "triton", **{p.name: p.choices[0] for p in params_for("triton")}, "split_k_slices": 1}
    store.record(Result(problem=problem.key(), spec=spec_from_params(params, problem, generic=True).to_l2(),
                        target="triton", gpu="g", protocol="kernel", status="ok", tflops=2.0, baseline_tflops=1.0,
                        speedup=2.0))
    with pytest.raises(DataFileError, match="export into another folder|move it away"):
        check_export(out, [problem], "g", "kernel")
    with pytest.raises(DataFileError):
        export(store, [problem], "g", "kernel", out)
    assert (out / "sm_90.json").read_text() == text


def test_tune_command_tunes_a_gated_projection_with_interpreter_kernels(tmp_path):
    """`l2c tune --gate silu`: the search measures gated Triton kernels against torch's gated projection, and the
    export's entry carries the gate, so only gated calls meet it."""
    from l2c.tuned_table import TunedTable, entry_from_row
    out = subprocess.run(
        [sys.executable, "-m", "l2c", "tune", "--runner", "interpreter", "--shapes", "32x32x32", "--target", "triton",
         "--layout", "row,col,row", "--gate", "silu", "--trials", "3", "--store", str(tmp_path / "r.sqlite"),
         "--storage", f"journal:{tmp_path / 'j.log'}", "--policy", "off", "--seed", "0", "--no-llm", "--confirm", "1",
         "--export", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    store = Store(tmp_path / "r.sqlite")
    results = list(store.results())
    assert results and {r.problem for r in results} == {"32x32x32:f16:row,col,row:gate=silu:sm_90"}
    assert all(parse_one(r.spec).epilogue_gate == "silu" for r in results)
    assert any(r.status == "ok" for r in results)
    (entry,) = json.loads((tmp_path / "out" / "sm_90.json").read_text())["entries"]
    assert entry["gate"] == "silu" and parse_one(entry["spec"]).epilogue_gate == "silu"
    # the dispatch rule serves it to gated calls only (interpreter figures lose to torch: served here as if won)
    won = [entry_from_row({**entry, "speedup": 2.0})]
    table = TunedTable(won, arch="sm_90")
    assert table.lookup("f16", "row,col,row", 32, 32, 32, gate="silu") is won[0]
    assert table.lookup("f16", "row,col,row", 32, 32, 32) is None


# -------------------------------------------------------------------------------------- the policy

def _clip(x: int) -> int:
    return min(256, max(16, x))


def planted_reward(params, p: Problem) -> float:
    """Planted structure: the best tile is (M/8, N/8, K/32) clipped to the tile range, without split-K (the planted
    best is a kernel the rules accept: a 256x256 Triton tile that splits K stores an fp32 tile too large for shared
    memory, so split-K must carry signal where it decides validity)."""
    want = (_clip(p.m // 8), _clip(p.n // 8), _clip(p.k // 32))
    got = (params["tile_m"], params["tile_n"], params["tile_k"])
    split = 0.5 * math.log2(params.get("split_k_slices", 1))
    return 2.0 * math.exp(-0.5 * sum(abs(math.log2(g) - math.log2(w)) for g, w in zip(got, want)) - split)


def test_policy_learns_planted_structure_and_beats_tpe_and_random_on_held_out_shapes():
    from l2c.search.efficiency import compare
    rng = random.Random(7)
    sizes = [128, 256, 512, 1024, 2048]
    shapes = [(m, n, k) for m in sizes for n in sizes for k in (512, 1024, 2048, 4096, 8192)]
    rng.shuffle(shapes)
    train = [Problem(*s) for s in shapes[:16]]
    held = [Problem(*s) for s in shapes[16:20]]
    r = compare(train, held, FunctionRunner(planted_reward), targets=("triton",), n_train_trials=30,
                n_trials=10, seeds=(0, 1, 2), warm=4)
    final = {m: r["methods"][m]["final"] for m in ("random", "tpe", "policy")}
    early = {m: r["methods"][m]["geomean_best_after_n"][4] for m in ("random", "tpe", "policy")}
    assert final["policy"] > 1.2 * final["tpe"] and final["policy"] > 1.2 * final["random"], final
    assert early["policy"] > 1.2 * max(early["tpe"], early["random"]), early


def test_policy_save_load_and_proposals_are_valid(tmp_path):
    from l2c.search.policy import Policy, PolicySampler
    p = Problem(512, 512, 512)
    samples = []
    for tm in (64, 128, 256):
        params = {"target": "cutlass", "tile_m": tm, "tile_n": 128, "tile_k": 64, "pipeline_stages": "auto",
                  "launch_schedule": "auto", "cluster_m": 1, "cluster_n": 1, "swizzle_group": 8,
                  "swizzle_raster": "m", "split_k_slices": 1, "split_k_mode": "workspace"}
        samples.append((p, params, math.log(2.0 if tm == 128 else 0.5)))
    pol = Policy(seed=0)
    pol.fit(samples, epochs=150)
    assert pol.mode(p, ["cutlass"])["tile_m"] == 128
    pol.save(tmp_path / "policy.pt")
    again = Policy.load(tmp_path / "policy.pt")
    assert again.mode(p, ["cutlass"]) == pol.mode(p, ["cutlass"])
    props = again.propose(p, ["triton", "cutlass"], 6)
    assert 1 <= len(props) <= 6 and props[0]["tile_m"] == 128
    assert all(check_point(x, p)[0] is not None for x in props)
    assert len({tuple(sorted((k, str(v)) for k, v in x.items())) for x in props}) == len(props)
    # as a sampler inside a study, mixed with TPE, tagging which one drew each trial
    sampler = PolicySampler(again, p, ["triton", "cutlass"], fraction=0.5, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    run_studies([StudyWorker(study, p, ModelRunner(), Store(":memory:"), TuneConfig(n_trials=12))])
    sources = {t.user_attrs["source"] for t in study.trials}   # pack: prebuilt CUTLASS points run before new ones
    assert {"policy", "tpe"} <= sources <= {"policy", "tpe", "pack"}


def test_a_policy_saved_before_the_space_grew_loads_as_itself(tmp_path):
    """A policy trained before a knob was added (launch evict) and a knob's choices extended (tile m 1, 2, 4) loads
    with the same distribution over what it knew, no mass on what it never saw and the new knob at its default, so it
    proposes what it proposed before; the shipped policy (l2c/policy/sm_90.pt) is one of these."""
    import torch
    from l2c.search.policy import Policy
    p = Problem(256, 1024, 4096)
    samples = [(p, {"target": "triton", "tile_m": tm, "tile_n": 64, "tile_k": 64, "launch_evict": "normal"},
                math.log(2.0 if tm == 64 else 0.5)) for tm in (16, 32, 64, 128)]
    pol = Policy(seed=0)
    pol.fit(samples, epochs=100)
    pol.save(tmp_path / "new.pt")
    blob = torch.load(tmp_path / "new.pt", weights_only=True)
    space = dict(blob["space"])
    keep = [i for i, c in enumerate(space["tile_m"]) if c not in ("1", "2", "4")]
    blob["space"] = [(name, [space["tile_m"][i] for i in keep] if name == "tile_m" else choices)
                     for name, choices in blob["space"] if name != "launch_evict"]
    for part in ("weight", "bias"):
        del blob["state"][f"heads.launch_evict.{part}"]
        blob["state"][f"heads.tile_m.{part}"] = blob["state"][f"heads.tile_m.{part}"][keep]
    torch.save(blob, tmp_path / "old.pt")
    old = Policy.load(tmp_path / "old.pt")
    for q in (p, Problem(1, 4096, 4096, layout_b="col"), Problem(8192, 8192, 512)):
        was = pol.probabilities(q, "triton")["tile_m"][keep]
        now = old.probabilities(q, "triton")
        assert abs(now["tile_m"][keep] - was / was.sum()).max() < 1e-6
        assert max(x for i, x in enumerate(now["tile_m"]) if i not in keep) < 1e-9
        evict = next(x for x in KNOB_PARAMS if x.name == "launch_evict")
        assert now["launch_evict"][evict.choices.index("normal")] > 1 - 1e-6
    blob["space"] = [(name, choices + ["1024"] if name == "tile_k" else choices) for name, choices in blob["space"]]
    torch.save(blob, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="retrain"):   # a space with choices the current one lacks
        Policy.load(tmp_path / "other.pt")
    from l2c.search.policy import shipped_policy_path
    shipped = Policy.load(shipped_policy_path("sm_90"))
    assert shipped.mode(Problem(1, 4096, 4096, layout_b="col"), ["triton"])["launch_evict"] == "normal"


def test_a_gpu_tune_without_enough_stored_results_starts_from_the_shipped_policy(tmp_path):
    """The policy for sm_90 ships in the package (package data beside the tuned tables), so a new user's GPU tune,
    whose store holds nothing to train on, warm-starts from it; the interpreter and model runners, whose figures
    are not GPU measurements, and an architecture without a shipped policy start without one."""
    import argparse
    from l2c.commands.tune import _shipped_policy
    from l2c.search.warmstart import warm_start
    from l2c.search.policy import shipped_policy_path
    path = shipped_policy_path("sm_90")
    assert path == ROOT / "l2c" / "policy" / "sm_90.pt"
    assert shipped_policy_path("sm_80") is None
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"policy/*.pt"' in pyproject
    said = []
    policy, used = _shipped_policy(argparse.Namespace(runner="gpu", arch="sm_90"), said.append)
    assert used == path and policy.trained_on > 1000 and not said
    for runner, arch in (("model", "sm_90"), ("interpreter", "sm_90"), ("gpu", "sm_80")):
        assert _shipped_policy(argparse.Namespace(runner=runner, arch=arch), said.append) == (None, None)
    p = Problem(2048, 4096, 4096)
    study = optuna.create_study(direction="maximize")
    added = warm_start(study, p, TuneConfig(n_trials=8, warm_start=4), policy=policy, store=Store(tmp_path / "r.sqlite"))
    assert added["pack"] == 2 and added["policy"] == 2      # half the warm start from the pack: no nvcc for those
    for trial in study.get_trials(deepcopy=False):   # every proposal validates for the problem
        assert trial.user_attrs["source"] in ("pack", "policy")
        assert check_point(trial.system_attrs["fixed_params"], p)[0]


def test_the_pack_warm_start_holds_kernels_the_pack_has_byte_for_byte():
    """A tune searching CUTLASS starts with prebuilt kernels: points whose shape-generic build (what a trial builds)
    renders to a library the shipped pack holds, so they are measured with no nvcc run; ranked by the policy."""
    from l2c.lower import render
    from l2c.search.policy import Policy, shipped_policy_path
    from l2c.search.warmstart import prebuilt_points, warm_start
    from l2c.targets.cutlass.pack import default_pack_path, read_pack
    from l2c.targets.cutlass.toolchain import pack_key
    from l2c.validate import validate
    held = read_pack(default_pack_path("sm_90")).entries
    p = Problem(16, 14336, 4096, layout_b="col")
    points = prebuilt_points(p)
    assert len(points) >= 8
    for params in points:
        assert params["target"] == "cutlass" and check_point(params, p)[0] is not None
        assert pack_key(render(validate(spec_from_params(params, p, generic=True), "cutlass", "sm_90"))) in held
    policy = Policy.load(shipped_policy_path("sm_90"))
    ranked = prebuilt_points(p, policy)
    scores = [policy.log_prob(p, params) for params in ranked]
    assert sorted(map(point_key, ranked)) == sorted(map(point_key, points)) and scores == sorted(scores, reverse=True)
    for targets, expect in ((("triton", "cutlass"), 3), (("triton",), 0)):
        study = optuna.create_study(direction="maximize")
        added = warm_start(study, p, TuneConfig(targets=targets, warm_start=6))
        assert added["pack"] == expect
        assert [t.user_attrs["source"] for t in study.get_trials(deepcopy=False)] == ["pack"] * expect


# ------------------------------------------------------------------------------ resume and workers

@pytest.fixture(scope="module")
def postgres():
    """A real PostgreSQL server on 127.0.0.1 (tests/pg_server.py). `.ci/run` sets L2C_REQUIRE_POSTGRES=1, so
    in CI a missing server is a failure, not a skip."""
    from . import pg_server
    why = pg_server.available()
    if why:
        if os.environ.get("L2C_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"L2C_REQUIRE_POSTGRES=1 but {why}")
        pytest.skip(why)
    yield from pg_server.server()


def _tune_cmd(tmp_path, trials, storage=None, seed=5):
    return [sys.executable, "-m", "l2c", "tune", "--runner", "model", "--shapes", "512x512x512,64x64x8192",
            "--trials", str(trials), "--store", str(tmp_path / "r.sqlite"), "--storage",
            storage or f"journal:{tmp_path / 'studies.journal'}", "--policy", "off", "--seed", str(seed), "--no-llm"]


@pytest.mark.parametrize("backend", ["journal", "postgresql"])
def test_resume_after_kill_keeps_trials_and_finishes_without_duplicates(tmp_path, backend, request):
    trials = 30
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    url = request.getfixturevalue("postgres").new_database() if backend == "postgresql" else None
    cmd = _tune_cmd(tmp_path, trials, storage=url)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    store_path = tmp_path / "r.sqlite"
    while time.time() < deadline:   # kill mid-study: some points evaluated, the study far from done
        if store_path.exists() and sum(1 for r in Store(store_path).results() if r.status != "invalid") >= 12:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    storage = parse_storage(url or f"journal:{tmp_path / 'studies.journal'}", tmp_path)
    before = {}
    for s in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        before[s.study_name] = {t.number: t.params for t in counted_trials(study)}
    assert 0 < sum(map(len, before.values())) < 2 * trials

    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "512x512x512:" in out.stdout and "64x64x8192:" in out.stdout
    for name, old in before.items():
        study = optuna.load_study(study_name=name, storage=storage)
        counted = counted_trials(study)
        assert len(counted) == trials
        now = {t.number: t.params for t in counted}
        assert all(now[n] == params for n, params in old.items())        # nothing lost
        points = [tuple(sorted((k, str(v)) for k, v in t.params.items())) for t in counted]
        assert len(set(points)) == len(points)                             # nothing evaluated twice
        assert not study.get_trials(states=(TrialState.RUNNING,))
    # the store holds exactly one row per evaluated point and problem
    assert sum(1 for r in Store(store_path).results() if r.status in COUNTED) == 2 * trials


def _sqlite_worker(storage_url: str, store_path: str, n: int) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    p = Problem(1024, 1024, 1024)
    cfg = TuneConfig(n_trials=n)
    storage = parse_storage(storage_url, Path(store_path).parent)
    study = optuna.create_study(storage=storage, study_name="shared", direction="maximize", load_if_exists=True,
                                sampler=optuna.samplers.TPESampler(seed=os.getpid()))
    run_studies([StudyWorker(study, p, ModelRunner(), Store(store_path), cfg)])


def _open_store(path: str, barrier, results) -> None:
    barrier.wait()
    try:
        Store(path).record(Result(problem="1x1x1", spec="s", target="triton", gpu="g", protocol="kernel",
                                  status="ok", speedup=1.0, build="b"))
        results.put("ok")
    except Exception as err:  # noqa: BLE001 - reported to the test
        results.put(repr(err))


def test_processes_opening_a_new_store_at_once_all_open_it(tmp_path):
    """Tuners started together on one new results store: SQLite refuses the switch to write-ahead logging at once,
    without its busy handler, while another process holds the file (before the retry, 26% of such rounds failed)."""
    ctx = mp.get_context("fork")
    for round_ in range(20):
        path = str(tmp_path / f"r{round_}.sqlite")
        barrier, results = ctx.Barrier(3), ctx.Queue()
        procs = [ctx.Process(target=_open_store, args=(path, barrier, results)) for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [results.get(timeout=5) for _ in procs] == ["ok"] * 3
        assert Store(path).count() == 1


def test_a_relative_journal_path_gives_a_lock_whose_target_resolves(tmp_path, monkeypatch):
    """Optuna's journal lock is a symlink to the journal made beside it: with a relative path (`--store DIR/s.sqlite`
    from the default journal, or `journal:DIR/j.log`) its target dangled, Optuna's stale-lock check could not stat
    it, and a lock a killed tune left made every resume spin forever. The path is made absolute first."""
    import os
    monkeypatch.chdir(tmp_path)
    storage = parse_storage("journal:sub/j.log", tmp_path)
    optuna.create_study(storage=storage, study_name="s")
    lock = storage._backend._lock   # the lock Optuna takes around each write (no public handle)
    assert lock.acquire()
    try:
        target = os.readlink(tmp_path / "sub" / "j.log.lock")
        assert os.path.isabs(target) and (tmp_path / "sub" / "j.log.lock").resolve() == tmp_path / "sub" / "j.log"
    finally:
        lock.release()


def _open_storage(url: str, ready, results) -> None:
    ready.wait(60)   # all at once: the race the first tunes on a new database run
    try:
        parse_storage(url, Path("."))
        results.put("ok")
    except Exception as err:  # noqa: BLE001 - reported to the test
        results.put(f"{type(err).__name__}: {err}")


def test_tunes_opening_a_new_database_together_all_open_it(tmp_path):
    """Tunes started together on a new RDB storage race to create its tables; the losers died ('UNIQUE constraint
    failed', 'table ... already exists': 4 of 8 pairs on SQLite). Each now opens it once the winner is done."""
    ctx = mp.get_context("spawn")
    for round_ in range(3):
        url = f"sqlite:///{tmp_path / f'fresh{round_}.db'}"
        ready, results = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_open_storage, args=(url, ready, results)) for _ in range(4)]
        for p in procs:
            p.start()
        time.sleep(3)   # every process has imported optuna and waits
        ready.set()
        outcomes = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
        assert outcomes == ["ok"] * 4, outcomes


def test_two_workers_share_one_sqlite_study(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.sqlite'}"
    store_path = str(tmp_path / "r.sqlite")
    parse_storage(url, tmp_path)   # create the schema once, before the race
    optuna.create_study(storage=url, study_name="shared", direction="maximize")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_sqlite_worker, args=(url, store_path, 12)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    assert [p.exitcode for p in procs] == [0, 0]
    study = optuna.load_study(study_name="shared", storage=url)
    counted = counted_trials(study)
    assert 12 <= len(counted) <= 13     # the budget check races at most one trial per extra worker
    workers = {t.user_attrs["worker"] for t in counted}
    assert len(workers) == 2
    assert sum(1 for r in Store(store_path).results() if r.status in COUNTED) == len(counted)


def test_two_tune_processes_share_studies_on_postgresql(tmp_path, postgres):
    """Two `l2c tune` processes (as on two hosts) on one PostgreSQL database: both work on every study, each
    study ends with its budget evaluated (the budget check races at most one trial per extra process), nothing
    is left RUNNING, and the shared results store holds one row per evaluated trial."""
    url = postgres.new_database()
    trials = 40   # seconds of work for each process, so both are at it together whatever their start-up times
    parse_storage(url, tmp_path)   # create the schema once, before the two processes race to
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen(_tune_cmd(tmp_path, trials, storage=url, seed=seed), cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    storage = parse_storage(url, tmp_path)
    summaries = optuna.get_all_study_summaries(storage)
    assert len(summaries) == 2
    points = set()
    workers = set()
    for s in summaries:
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        counted = counted_trials(study)
        assert trials <= len(counted) <= trials + 1
        assert not study.get_trials(states=(TrialState.RUNNING,))
        workers |= {t.user_attrs["worker"] for t in counted}
        points |= {(s.study_name, tuple(sorted((k, str(v)) for k, v in t.params.items()))) for t in counted}
    assert len(workers) == 2
    # one store row per distinct evaluated point (two processes racing to one point share its row)
    assert sum(1 for r in Store(tmp_path / "r.sqlite").results() if r.status in COUNTED) == len(points)


def test_trials_of_a_dead_worker_are_failed_and_retried(tmp_path):
    from l2c.search.recovery import reclaim_lost_trials
    storage = parse_storage(f"journal:{tmp_path / 'j.log'}", tmp_path)
    p = Problem(512, 512, 512)
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    study.enqueue_trial({"target": "cutlass", "tile_m": 128, "tile_n": 128, "tile_k": 64, "pipeline_stages": "auto",
                         "launch_schedule": "auto", "cluster_m": 1, "cluster_n": 1, "swizzle_group": 8,
                         "swizzle_raster": "m", "split_k_slices": 1, "split_k_mode": "workspace"})
    t = study.ask()
    t.set_user_attr("worker", f"{__import__('socket').gethostname()}:{dead.pid}")
    params = suggest_params(t, ["cutlass"])            # killed after sampling, before telling
    alive = study.ask()
    alive.set_user_attr("worker", f"{__import__('socket').gethostname()}:{os.getpid()}")
    assert reclaim_lost_trials(study) == 1             # only the dead worker's trial
    lost = study.trials[t.number]
    assert lost.state == TrialState.FAIL and lost.user_attrs["status"] == "lost"
    assert study.trials[alive.number].state == TrialState.RUNNING
    study.tell(alive, state=TrialState.FAIL)
    run_studies([StudyWorker(study, p, ModelRunner(), Store(":memory:"), TuneConfig(targets=("cutlass",), n_trials=3))])
    retried = [x for x in study.trials if x.user_attrs.get("retry_of") == t.number]
    assert len(retried) == 1 and retried[0].params == params and retried[0].user_attrs["status"] in COUNTED


def test_a_point_that_kills_its_worker_twice_is_a_failed_candidate(tmp_path):
    """A point whose worker died while measuring it is retried once; lost again, it is a failed candidate (status
    killed_worker, counted in the budget) and never enqueued again, so resuming a tune cannot loop on it."""
    from l2c.search.recovery import KILLED_WORKER, reclaim_lost_trials
    storage = parse_storage(f"journal:{tmp_path / 'j.log'}", tmp_path)
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    point = {"target": "cutlass", "tile_m": 128, "tile_n": 128, "tile_k": 64, "pipeline_stages": "auto",
             "launch_schedule": "auto", "cluster_m": 1, "cluster_n": 1, "swizzle_group": 8, "swizzle_raster": "m",
             "split_k_slices": 1, "split_k_mode": "workspace"}
    study.enqueue_trial(point)
    for lost_before in range(2):
        t = study.ask()
        t.set_user_attr("worker", f"{__import__('socket').gethostname()}:{dead.pid}")
        suggest_params(t, ["cutlass"])
        assert reclaim_lost_trials(study) == 1
        waiting = study.get_trials(states=(TrialState.WAITING,))
        assert len(waiting) == (1 if lost_before == 0 else 0)
    statuses = [x.user_attrs["status"] for x in study.trials]
    assert statuses == ["lost", KILLED_WORKER] and KILLED_WORKER in COUNTED


def _hangs_on_its_first_start(busy, marker):
    """A worker process whose first start "evaluates" forever (a kernel that hangs the GPU) and whose next one
    finishes."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        busy.value = time.time()
        time.sleep(600)


def test_a_worker_past_the_trial_time_limit_is_stopped_and_started_again(tmp_path):
    """A worker that has evaluated one trial longer than `trial_timeout_s` is killed (its trial is then a lost one,
    retried once, then failed: the tests above) and a fresh worker started after `on_restart` reclaims."""
    import multiprocessing as mp
    from l2c.search.supervisor import supervise
    ctx = mp.get_context("fork")
    busy, marker, started, restarts, said = ctx.Value("d", 0.0), str(tmp_path / "started"), [], [], []

    def start(i):
        busy.value = 0.0
        pr = ctx.Process(target=_hangs_on_its_first_start, args=(busy, marker))
        pr.start()
        started.append(pr)
        return pr

    t0 = time.time()
    supervise(start, 1, on_restart=lambda: restarts.append(1), log=said.append, busy_since=[lambda: busy.value],
              trial_timeout_s=1.0, poll_s=0.1)
    assert time.time() - t0 < 60 and len(started) == 2 and len(restarts) == 1
    assert started[0].exitcode == -9 and started[1].exitcode == 0
    assert any("past the 1 s limit" in line for line in said)


def test_the_trial_loop_marks_each_evaluation_for_the_time_limit():
    """StudyWorker tells `evaluating` when each evaluation starts (wall-clock time) and that it ended (0.0)."""
    marks = []
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    cfg = TuneConfig(targets=("cutlass",), n_trials=3)
    run_studies([StudyWorker(study, Problem(512, 512, 512), ModelRunner(), Store(":memory:"), cfg,
                             evaluating=marks.append)])
    assert len(marks) == 6 and marks[1::2] == [0.0] * 3 and all(abs(m - time.time()) < 60 for m in marks[::2])


def test_trials_killed_before_naming_their_worker_are_reclaimed_once_old(tmp_path):
    """A run killed between `ask` and naming the trial leaves a RUNNING trial nobody owns. A resumed run must
    not count it against the budget forever: it waits until the orphan is `orphan_after_s` old, reclaims it
    (re-enqueueing a popped seed's point), and finishes with exactly n evaluated points and nothing RUNNING."""
    storage = parse_storage(f"journal:{tmp_path / 'j.log'}", tmp_path)
    p = Problem(512, 512, 512)
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=1))
    seed = {"target": "cutlass", "tile_m": 128, "tile_n": 256, "tile_k": 64, "pipeline_stages": "auto",
            "launch_schedule": "auto", "launch_swap": "no", "cluster_m": 1, "cluster_n": 1, "swizzle_group": 8,
            "swizzle_raster": "m", "split_k_slices": 1, "split_k_mode": "workspace"}
    study.enqueue_trial(seed, user_attrs={"source": "seed"})
    popped = study.ask()                               # the queued seed, popped; killed before naming it
    fresh = study.ask()                                # a sampled trial, killed before naming it
    assert not popped.params and not fresh.params
    cfg = TuneConfig(targets=("cutlass",), n_trials=4, orphan_after_s=0.5, max_ask_factor=100)
    t0 = time.time()
    run_studies([StudyWorker(study, p, ModelRunner(), Store(":memory:"), cfg)])
    counted = counted_trials(study)
    assert len(counted) == 4 and not study.get_trials(states=(TrialState.RUNNING,))
    assert time.time() - t0 >= 0.5                     # the orphans were not taken while possibly alive
    for orphan in (popped, fresh):
        assert study.trials[orphan.number].user_attrs["status"] == "lost"
    retried = [t for t in counted if t.user_attrs.get("retry_of") == popped.number]
    assert len(retried) == 1 and retried[0].params == seed
    points = [tuple(sorted((k, str(v)) for k, v in t.params.items())) for t in counted]
    assert len(set(points)) == len(points)


def test_compile_pool_builds_ahead_of_measurement_and_progress_shows_build_and_measure_time(tmp_path):
    import io
    from l2c.search.progress import time_spent
    runner = InterpreterRunner()
    runner.uses_compile_pool = True          # as the GPU runner: builds go to a CPU process pool first
    store = Store(tmp_path / "r.sqlite")
    # K=32 makes most split-K draws invalid: allow enough asks that 3 valid points are found whatever the space
    cfg = TuneConfig(targets=("triton",), n_trials=3, seed=2, compile_workers=2, max_ask_factor=200)
    shown = io.StringIO()
    (study,) = tune([Problem(32, 16, 32)], cfg, runner, store, storage_arg=":memory:", log=lambda s: None,
                    progress_stream=shown)
    counted = counted_trials(study)
    assert len(counted) == 3
    assert all(r.status == "ok" for r in store.results() if r.status != "invalid")
    # each evaluated trial carries where its time went: the pool's build (plus loading it here) and the measurement
    assert all(t.user_attrs["build_s"] > 0 and t.user_attrs["measure_s"] > 0 for t in counted)
    build, measure, timed = time_spent([study])
    assert timed == 3 and build == pytest.approx(sum(t.user_attrs["build_s"] for t in counted))
    # the status line shows them apart, in all and per trial
    import re
    line = shown.getvalue().strip().splitlines()[-1]
    got = re.search(r"build ([\d.]+) s · measure ([\d.]+) s \(([\d.]+) s · ([\d.]+) s per trial\)", line)
    assert got, line
    assert [float(x) for x in got.groups()] == [round(build, 1), round(measure, 1), round(build / 3, 1),
                                                round(measure / 3, 1)]


def _shipped_cutlass_point(problem):
    """The search point of a CUTLASS entry of the shipped table: the tuner's spec of it is in the shipped pack."""
    entry = next(e for e in json.loads((ROOT / "l2c" / "tuned" / "sm_90.json").read_text())["entries"]
                 if e["target"] == "cutlass" and e["dtype"] == "f16" and e["layout"] == "row,row,row"
                 and "m=any n=any k=any" in e["spec"])
    params = params_from_spec(parse_one(entry["spec"]), "cutlass")
    assert check_point(params, problem)[0] is not None
    return params


def test_compile_pool_jobs_put_cutlass_candidates_several_to_an_nvcc_run_and_triton_alone():
    from l2c.search.compile_pool import plan_jobs
    from l2c.targets.cutlass.build import BATCH_SIZE
    members = [("cutlass", f"c{i}") for i in range(20)] + [("triton", "t0"), ("triton", "t1")]
    for free, runs in ((8, 6), (4, 3), (0, 3), (30, 20)):   # runs: at least one per idle process, <= 8 kernels each
        jobs = plan_jobs(members, free)
        assert sorted(i for job in jobs for i in job) == list(range(len(members)))
        assert [job for job in jobs if members[job[0]][0] == "triton"] == [[20], [21]]
        cutlass = [job for job in jobs if members[job[0]][0] == "cutlass"]
        assert len(cutlass) == runs and all(len(job) <= BATCH_SIZE for job in cutlass)
    assert plan_jobs([("triton", "t")], 4) == [[0]] and plan_jobs([], 4) == []


def test_a_failed_build_in_the_compile_pool_is_a_failed_candidate_and_the_others_build(tmp_path, monkeypatch):
    """No nvcc here (as on a machine without the CUDA toolkit): the compile pool installs what the shipped pack
    holds and fails what it does not; in one job, one verdict each. In the trial loop such a failure is a failed
    trial, recorded with the compiler's reason, never built again where it is measured, never the best."""
    from l2c.search.compile_pool import CompilePool
    from tests.test_pack import _hide_nvcc
    _hide_nvcc(monkeypatch, tmp_path)
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "cache"))
    p = Problem(32, 32, 32)
    packed = _shipped_cutlass_point(p)
    unpacked = dict(_CUTLASS_POINT, tile_n=64)
    from l2c.ir import KernelSpec
    triton = params_from_spec(KernelSpec(name="t", target="triton", tile_m=32, tile_n=32, tile_k=32), "triton")
    assert check_point(triton, p)[0] is not None
    specs = [spec_from_params(params, p, generic=True) for params in (packed, unpacked, triton)]
    with CompilePool(1) as pool:   # one idle process: both CUTLASS candidates in one job
        built = pool.build([(spec, spec.target, "sm_90") for spec in specs] + [(specs[1], "cutlass", "sm_90")])
    assert built[0].failure is None and built[0].kernels == 0                 # installed from the pack
    assert "not in l2c's prebuilt pack" in built[1].failure and built[1].failure.startswith("build: ")
    assert built[2].failure is None and built[2].kernels == 1 and built[2].seconds > 0
    assert built[3].failure == built[1].failure and built[3].seconds == 0    # asked twice: built (and timed) once
    assert list((tmp_path / "cache" / "cutlass").glob(f"{specs[0].name}_*.so"))

    runner = InterpreterRunner()
    runner.uses_compile_pool = True
    store = Store(":memory:")
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    for params in (unpacked, triton):
        study.enqueue_trial(params)
    cfg = TuneConfig(targets=("triton", "cutlass"), n_trials=2, compile_workers=2)
    with CompilePool(2) as pool:
        run_studies([StudyWorker(study, p, runner, store, cfg, pool=pool)], batch=2)
    failed, ok = study.trials[:2]
    assert failed.state == TrialState.FAIL and failed.user_attrs["status"] == "build_failed"
    assert "not in l2c's prebuilt pack" in failed.user_attrs["reason"]
    assert ok.user_attrs["status"] == "ok" and study.best_trial.number == ok.number
    assert runner.builds == 1                  # only the Triton candidate was built (loaded) in this process
    assert store.best(p.key(), runner.gpu, "kernel").target == "triton"
    assert all("build_s" in t.user_attrs and "measure_s" in t.user_attrs for t in (failed, ok))


@needs_nvcc
def test_the_compile_pool_builds_a_round_of_cutlass_candidates_in_one_nvcc_run(tmp_path, monkeypatch):
    """Real nvcc, the smallest batch: two CUTLASS candidates of a round in one job are one nvcc run (one library
    under both cache names, each told it was one of 2); a spec that no longer validates (a stored leader after a
    rule change) fails as a candidate in the same job while the others build. About a minute of one core."""
    from l2c.search.compile_pool import CompilePool
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("L2C_PACK", str(tmp_path / "no-pack.zip"))   # compiled here, not installed
    p = Problem(512, 1024, 1024)
    specs = [spec_from_params(dict(_CUTLASS_POINT, **knobs), p, generic=True)
             for knobs in ({}, {"tile_n": 64}, {"tile_m": 32})]   # tile m=32: not a CUTLASS sm90 tile
    with CompilePool(1) as pool:
        built = pool.build([(spec, "cutlass", "sm_90") for spec in specs])
    good = built[:2]
    assert [b.failure for b in good] == [None, None] and [b.kernels for b in good] == [2, 2]
    assert good[0].seconds == good[1].seconds > 0                   # the run's time, shared by its kernels
    libraries = [next((tmp_path / "cache" / "cutlass").glob(f"{spec.name}_*.so")) for spec in specs[:2]]
    assert os.path.samefile(*libraries)
    assert built[2].failure.startswith("build: ") and "tile m=32" in built[2].failure and built[2].kernels == 0


def test_two_worker_processes_through_tune(tmp_path):
    probs = [Problem(256, 4096, 4096), Problem(64, 1024, 8192)]
    store = Store(tmp_path / "r.sqlite")
    cfg = TuneConfig(n_trials=8, seed=0)
    studies = tune(probs, cfg, "model", store, storage_arg=f"journal:{tmp_path / 'j.log'}", workers=2,
                   log=lambda s: None)
    for s in studies:
        s = optuna.load_study(study_name=s.study_name, storage=parse_storage(f"journal:{tmp_path / 'j.log'}", tmp_path))
        counted = counted_trials(s)
        assert 8 <= len(counted) <= 9
        assert not s.get_trials(states=(TrialState.RUNNING,))
    pids = {t.user_attrs["worker"] for s in studies for t in counted_trials(
        optuna.load_study(study_name=s.study_name, storage=parse_storage(f"journal:{tmp_path / 'j.log'}", tmp_path)))}
    assert len(pids) == 2 and os.getpid() not in {int(w.rsplit(":", 1)[1]) for w in pids}
    # the status line, in this process, reads the workers' trial timings from the shared storage
    from l2c.search.progress import time_spent
    assert time_spent([optuna.load_study(study_name=s.study_name, storage=parse_storage(
        f"journal:{tmp_path / 'j.log'}", tmp_path)) for s in studies])[2] >= 16
    # confirmation in worker processes too, each taking every other shape
    from l2c.search.confirm import confirm
    gpu = ModelRunner().gpu
    since = confirm(probs, "model", store, "kernel", budget=2, workers=2, log=lambda s: None)
    for p in probs:
        win = store.best(p.key(), gpu, "kernel", confirmed_since=since)
        assert win is not None and win.confirmed >= since


def test_sampled_new_cutlass_kernels_wait_until_the_prebuilt_ones_are_tried():
    """While the pack holds CUTLASS kernels of the problem the study has not run, a sampled new CUTLASS point (an
    nvcc run of 40-60 s) is set aside, not counted, and a prebuilt point runs in its place; a point that was
    enqueued runs as it is."""
    from l2c.search.warmstart import prebuilt_points
    p = Problem(16, 14336, 4096, layout_b="col")
    prebuilt = {point_key(q) for q in prebuilt_points(p)}
    novel = {"target": "cutlass", **{k: v for k, v in next(iter(prebuilt_points(p))).items() if k != "target"}}
    novel["swizzle_group"] = 2 if novel["swizzle_group"] != 2 else 4
    assert point_key(novel) not in prebuilt and check_point(novel, p)[0] is not None
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=3))
    study.enqueue_trial(novel, user_attrs={"source": "seed"})
    cfg = TuneConfig(targets=("cutlass",), n_trials=6)
    run_studies([StudyWorker(study, p, ModelRunner(), Store(":memory:"), cfg)])
    ran = [t for t in study.trials if t.user_attrs.get("status") in COUNTED]
    deferred = [t for t in study.trials if t.user_attrs.get("status") == "deferred"]
    assert len(ran) == 6 and deferred and all(t.state == TrialState.PRUNED for t in deferred)
    assert point_key(ran[0].params) == point_key(novel)                  # enqueued: run although new
    assert all(point_key(t.params) in prebuilt for t in ran[1:])
    assert all(t.user_attrs["source"] == "pack" for t in ran[1:])


def test_llm_proposals_enter_the_study_tagged_llm():
    from l2c.search.warmstart import warm_start
    from l2c.search.llm import Proposal
    p = Problem(512, 512, 512)
    text = spec_from_params({"target": "cutlass", "tile_m": 128, "tile_n": 64, "tile_k": 64, "pipeline_stages": 4,
                             "launch_schedule": "cooperative", "cluster_m": 2, "cluster_n": 1, "swizzle_group": 4,
                             "swizzle_raster": "n", "split_k_slices": 1, "split_k_mode": "workspace"}, p).to_l2()

    class OneSpecProposer:   # the LLMProposer seam: propose(problem, history, n, target) -> [Proposal]
        def __init__(self):
            self.calls = []

        def propose(self, problem, history, n, target=None):
            self.calls.append((problem, list(history), n, target))
            spec = parse_one(text)
            return [Proposal(spec, text, "llm:test", "cutlass")] if target == "cutlass" else []

    llm = OneSpecProposer()
    study = optuna.create_study(direction="maximize")
    added = warm_start(study, p, TuneConfig(n_trials=3, warm_start=0), llm=llm, store=Store(":memory:"))
    assert added == {"seed": 0, "pack": 0, "policy": 0, "llm": 1}
    assert [c[3] for c in llm.calls] == ["triton", "cutlass"]
    run_studies([StudyWorker(study, p, ModelRunner(), Store(":memory:"), TuneConfig(n_trials=3))])
    first = study.trials[0]
    assert first.user_attrs["source"] == "llm" and first.params == params_from_spec(parse_one(text))


def test_shipped_pool_specs_are_exactly_what_the_tuner_builds():
    """benchmarks/pool_h200.l2 is prebuilt with `l2c build` so the GPU spends no time compiling: each spec must
    be byte-identical to the spec the tuner makes from the same knobs (same text -> same build-cache key), but
    for the epilogue store, the tuner's choice per point (the pool's CUTLASS kernels predate the staged store)."""
    from pathlib import Path

    from l2c.ir import config_name
    from l2c.parser import parse_file
    from l2c.search.space import Problem, params_from_spec, spec_from_params
    pool = [s for f in sorted((Path(__file__).resolve().parent.parent / "benchmarks").glob("pool_*.l2"))
            for s in parse_file(f)]
    assert len(pool) >= 8
    for spec in pool:
        assert spec.name == config_name(spec)
        problem = Problem(64, 64, 64, dtype=spec.types_a, layout_a=spec.layout_a, layout_b=spec.layout_b,
                          layout_c=spec.layout_c)
        made = spec_from_params(params_from_spec(spec, spec.target), problem, generic=True)
        made = made.replace(epilogue_store=spec.epilogue_store)
        assert made.replace(name=config_name(made)).to_l2() == spec.to_l2()


def test_config_names_differ_exactly_when_knobs_differ():
    from l2c.ir import KernelSpec, config_name
    a = KernelSpec(name="x", target="cutlass", tile_m=128)
    assert config_name(a) == config_name(a.replace(name="y"))
    assert config_name(a) != config_name(a.replace(swizzle_group=4))


def test_seed_specs_enter_a_resumed_study_once():
    """New seed specs given to a resumed tune are tried; seeds already tried are not enqueued again, and
    policy/LLM warm starts stay reserved for fresh studies."""
    from l2c.search.warmstart import warm_start
    p = Problem(64, 64, 4096)
    seed_a = parse_one("kernel a { target triton tile m=32 n=32 k=64 split_k slices=16 mode=workspace }")
    seed_b = parse_one("kernel b { target triton tile m=64 n=64 k=64 }")
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    cfg = TuneConfig(targets=("triton",), n_trials=2, seed_specs=(seed_a,), sampler="random")
    assert warm_start(study, p, cfg)["seed"] == 1
    run_studies([StudyWorker(study, p, ModelRunner(), Store(":memory:"), cfg)])
    assert study.trials[0].params == params_from_spec(seed_a, "triton")
    # resumed with one old and one new seed: only the new one is enqueued, and it is evaluated first
    cfg = replace(cfg, n_trials=3, seed_specs=(seed_a, seed_b))
    first_new = len(study.trials)   # the first run's trials (invalid random draws are trials too)
    assert warm_start(study, p, cfg) == {"seed": 1, "pack": 0, "policy": 0, "llm": 0}
    assert warm_start(study, p, cfg)["seed"] == 0
    run_studies([StudyWorker(study, p, ModelRunner(), Store(":memory:"), cfg)])
    assert study.trials[first_new].params == params_from_spec(seed_b, "triton")


def test_a_seed_spec_for_a_target_not_searched_is_named_not_dropped_silently():
    from l2c.search.warmstart import warm_start
    seed = parse_one("kernel mine { target cutlass tile m=128 n=128 k=64 }")
    study = optuna.create_study(direction="maximize")
    said = []
    cfg = TuneConfig(targets=("triton",), n_trials=1, seed_specs=(seed,))
    assert warm_start(study, Problem(64, 64, 64), cfg, log=said.append)["seed"] == 0
    assert any("seed spec mine is for cutlass" in s and "--target triton" in s for s in said), said


@pytest.mark.parametrize("shape", ["99999999999x1x1", "1x2147483648x1", "0x1x1"])
def test_a_tune_shape_past_32_bits_is_refused_at_once(shape):
    """It ran minutes of invalid trials before saying 'no verified kernel'; `l2c bench` caps dimensions alike."""
    with pytest.raises(ValueError, match="from 1 to 2147483647"):
        parse_shape(shape)


def test_policy_pool_script_writes_buildable_generic_specs(tmp_path):
    """scripts/policy_pool.py: the policy's proposals for a shapes list as a .l2 pool that `l2c build` takes —
    shape-generic, named by their knobs, valid for the target, at most n per shape."""
    from l2c.ir import config_name
    from l2c.parser import parse_file
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    tune = subprocess.run(_tune_cmd(tmp_path, 12), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert tune.returncode == 0, tune.stderr
    out = tmp_path / "pool.l2"
    done = subprocess.run([sys.executable, "scripts/policy_pool.py", "--shapes", "256x4096x4096,64x1024x8192",
                           "--store", str(tmp_path / "r.sqlite"), "--target", "cutlass", "-n", "3", "-o", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    specs = parse_file(out)
    assert 1 <= len(specs) <= 6 and len({s.name for s in specs}) == len(specs)
    for spec in specs:
        assert spec.target == "cutlass" and spec.name == config_name(spec)
        assert (spec.problem_m, spec.problem_n, spec.problem_k) == ("any", "any", "any")
        validate(spec, "cutlass", "sm_90")


def test_runners_and_our_mixing_sampler_declare_what_the_search_calls():
    from l2c.search.policy import PolicySampler
    from l2c.search.runners import GPURunner, Runner
    from l2c.search.samplers import SourcedSampler, source_of
    assert all(issubclass(c, Runner) for c in (GPURunner, InterpreterRunner, ModelRunner, FunctionRunner))
    r = FunctionRunner(lambda params, problem: 1.0)
    assert r.uses_compile_pool is False and r.poisoned() is None and GPURunner.uses_compile_pool
    assert issubclass(PolicySampler, SourcedSampler)
    assert source_of(optuna.samplers.RandomSampler(), 0) == "random"
    assert source_of(optuna.samplers.TPESampler(), 0) == "tpe"


def test_a_store_trained_policy_replaces_the_shipped_one_only_once_the_store_is_as_large():
    from l2c.commands.tune import MIN_STORE_RESULTS, policy_source
    assert policy_source("auto", False, 35, 4965) == "shipped"          # one tune's results do not undo 4,965
    assert policy_source("auto", False, 4965, 4965) == "store"
    assert policy_source("auto", False, MIN_STORE_RESULTS - 1, None) == "none"
    assert policy_source("auto", False, MIN_STORE_RESULTS, None) == "store"
    assert policy_source("my.pt", True, 0, None) == "file"
    assert policy_source("my.pt", False, MIN_STORE_RESULTS, None) == "store"


def _valid_cutlass_point(rng: random.Random, problem: Problem) -> dict:
    """A random valid CUTLASS point of `problem`, drawn from the space's own choices."""
    for _ in range(20_000):
        params = {"target": "cutlass", **{p.name: rng.choice(p.choices) for p in params_for("cutlass")}}
        if check_point(params, problem)[0] is not None:
            return params
    raise AssertionError("no valid CUTLASS point in 20,000 draws")


@given(seed=st.integers(0, 2**32 - 1), pick=st.integers(0, 10**6),
       shape=st.sampled_from([(16, 14336, 4096, "row,col,row"), (304, 1000, 704, "col,row,row"),
                              (4096, 4096, 4096, "row,row,row")]))
@settings(max_examples=25, deadline=None)
def test_new_cutlass_points_take_the_staged_store_and_prebuilt_ones_the_packs_build(seed, pick, shape):
    """The tuner builds a CUTLASS point with the staged epilogue (half the TMA store's build), except a point whose
    TMA build the pack holds byte for byte: that one keeps it (no compile at all)."""
    from l2c.lower import render
    from l2c.search.space import NEW_KERNEL_STORE, prebuilt_index, tuner_store
    from l2c.targets.cutlass.pack import default_pack_path, read_pack
    from l2c.targets.cutlass.toolchain import pack_key
    m, n, k, layout = shape
    la, lb, lc = layout.split(",")
    p = Problem(m, n, k, layout_a=la, layout_b=lb, layout_c=lc)
    held = read_pack(default_pack_path("sm_90")).entries
    prebuilt = list(prebuilt_index(p).values())
    drawn = _valid_cutlass_point(random.Random(seed), p)
    points = [drawn] + ([prebuilt[pick % len(prebuilt)]] if prebuilt else [])
    for params in points:
        spec = spec_from_params(params, p, generic=True)
        in_pack = point_key(params) in prebuilt_index(p)
        assert spec.epilogue_store == tuner_store(params, p) == ("tma" if in_pack else NEW_KERNEL_STORE)
        assert (pack_key(render(validate(spec, "cutlass", "sm_90"))) in held) == in_pack
        assert params_from_spec(spec, "cutlass") == params   # the store is no searched knob: the point round-trips
    assert NEW_KERNEL_STORE == "staged"
