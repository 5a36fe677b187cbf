"""`l2c import`: real `l2c bench` rows (CPU device, Triton interpreter) into a real SQLite results store, and the
tuner and the policy using them."""
from __future__ import annotations

import json

import optuna
import pytest
import torch

from l2c.results_file import read_rows
from l2c.cli import main
from l2c.parser import parse_file, parse_one
from l2c.search.policy import Policy
from l2c.search.runners import FunctionRunner
from l2c.search.space import Problem, params_from_spec, spec_from_params
from l2c.search.store import Store
from l2c.search.study import TuneConfig
from l2c.search.warmstart import warm_start
from l2c.search.workers import StudyWorker, run_studies

POOL = """
kernel in_space {
  target   triton
  problem  m=any n=any k=any
  types    a=f16 b=f16 c=f16 acc=f32
  tile     m=16 n=16 k=16
  swizzle  group=1
}
kernel three_slices {
  target   triton
  problem  m=any n=any k=any
  types    a=f16 b=f16 c=f16 acc=f32
  tile     m=16 n=16 k=16
  split_k  slices=3
}
"""


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A pool of two shape-generic specs measured on two shapes: the first is a point of the search space, the
    second is not (the space has split-K slices 1, 2, 4, ... only)."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    folder = tmp_path_factory.mktemp("import")
    pool, shapes, out = folder / "pool.l2", folder / "shapes.txt", folder / "r.jsonl"
    pool.write_text(POOL)
    shapes.write_text("16 16 32\n32 16 48\n")
    assert main(["bench", str(pool), "--shapes", str(shapes), "--protocol", "kernel", "--device", "cpu",
                 "--reps", "2", "--iters", "2", "--warmup", "1", "-o", str(out)]) == 0
    return folder, pool, out


def test_imported_rows_are_stored_with_their_search_space_point(measured, capsys):
    folder, pool, out = measured
    store_path = folder / "store.sqlite"
    assert main(["import", str(out), "--store", str(store_path)]) == 0
    printed = capsys.readouterr().out
    assert "4 result(s) recorded (2 outside the search space" in printed
    gpu = read_rows(out)[0]["gpu"]
    stored = list(Store(store_path).results(gpu=gpu, protocol="kernel"))
    assert len(stored) == 4 and {r.source for r in stored} == {"import"}
    in_space, outside = parse_file(pool)
    for r in stored:
        problem = Problem.from_key(r.problem)
        assert (problem.m, problem.n, problem.k) in ((16, 16, 32), (32, 16, 48))
        if r.params:
            # the text the tuner itself writes for this point, so a later trial of it is a cache hit
            assert r.params == params_from_spec(in_space, "triton")
            assert r.spec == spec_from_params(r.params, problem, generic=True).to_l2()
        else:
            assert "slices=3" in r.spec
        assert r.status == "ok" and r.speedup > 0
    # importing again replaces, it does not duplicate
    assert main(["import", str(out), "--store", str(store_path)]) == 0
    assert Store(store_path).count() == 4


def test_import_keeps_only_the_shapes_asked_for(measured, capsys):
    folder, pool, out = measured
    only = folder / "only.txt"
    only.write_text("32 16 48\n")
    store_path = folder / "filtered.sqlite"
    assert main(["import", str(out), "--store", str(store_path), "--shapes", str(only)]) == 0
    stored = list(Store(store_path).results())
    assert len(stored) == 2
    assert {Problem.from_key(r.problem).m for r in stored} == {32}


def test_the_tuner_takes_an_imported_result_instead_of_measuring_again(measured):
    folder, pool, out = measured
    store = Store(folder / "tuner.sqlite")
    assert main(["import", str(out), "--store", str(store.path)]) == 0
    gpu = read_rows(out)[0]["gpu"]
    calls = []
    runner = FunctionRunner(lambda params, problem: calls.append(params) or 1.0, gpu=gpu, protocol="kernel")
    problem = Problem(16, 16, 32)
    stored = {r.spec: r for r in store.results(problem=problem.key())}
    in_space = parse_file(pool)[0]
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    cfg = TuneConfig(targets=("triton",), n_trials=1, seed_specs=(in_space,), sampler="random")
    assert warm_start(study, problem, cfg)["seed"] == 1
    run_studies([StudyWorker(study, problem, runner, store, cfg)])
    first = study.trials[0]
    assert first.params == params_from_spec(in_space, "triton")
    assert calls == []   # not measured again
    text = spec_from_params(first.params, problem, generic=True).to_l2()
    assert first.value == pytest.approx(stored[text].speedup)


def test_the_policy_trains_on_imported_points_only(measured):
    folder, pool, out = measured
    store = Store(folder / "policy.sqlite")
    assert main(["import", str(out), "--store", str(store.path)]) == 0
    assert Policy(seed=0).fit_store(store, epochs=5) == 2   # the two in-space rows; the others have no point


def test_rows_that_cannot_be_imported_are_a_usage_error(measured, tmp_path, capsys):
    """A row carries its spec's text, so it imports after the file it came from is gone; one with neither is an
    error naming that file."""
    folder, pool, out = measured
    rows = read_rows(out)
    assert all(r.get("spec") for r in rows[1:])
    moved = tmp_path / "moved.jsonl"
    moved.write_text("\n".join(json.dumps(dict(r, source=str(tmp_path / "gone.l2")) if r.get("spec") else r)
                               for r in rows) + "\n")
    assert main(["import", str(moved), "--store", str(tmp_path / "moved.sqlite")]) == 0
    rows[1] = {k: v for k, v in rows[1].items() if k != "spec"} | {"source": str(tmp_path / "gone.l2")}
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["import", str(broken), "--store", str(tmp_path / "s.sqlite")]) == 2
    assert "gone.l2" in capsys.readouterr().err


def test_a_win_without_verified_figures_is_not_imported(measured, capsys, tmp_path):
    """An `ok` row is trusted as a win only as `l2c bench` writes it: `verified` true and finite numeric figures. A
    hand-made row without verification is skipped and counted, never stored; a damaged one (a speedup in text) makes
    the file one the reader refuses, naming the line and field."""
    _, _, out = measured
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    results = [r for r in rows if r.get("type") == "result" and r.get("status") == "ok"]
    assert results and all(r.get("verified") is True for r in results)
    forged = dict(results[0], speedup=50.0, candidate_tflops=100.0)
    del forged["verified"]
    bad = tmp_path / "forged.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in [rows[0], forged]))
    store = Store(tmp_path / "s.sqlite")
    assert main(["import", str(bad), "--store", str(store.path)]) == 0
    assert "1 win(s) without verified figures and 0 row(s)" in capsys.readouterr().out
    assert store.count() == 0
    texty = tmp_path / "texty.jsonl"
    texty.write_text("".join(json.dumps(r) + "\n" for r in [rows[0], dict(results[1], speedup="9999x")]))
    assert main(["import", str(texty), "--store", str(store.path)]) == 2
    assert f"{texty}:2: 'speedup' must be a number" in capsys.readouterr().err
    assert store.count() == 0


def test_rows_of_a_table_measured_through_a_call_are_skipped_and_counted(measured, capsys, tmp_path):
    """`l2c bench` files often hold `dispatch:`/`linear:` rows (a table measured through l2c.matmul): they carry no
    spec and are no search point. They used to refuse the whole file; they are skipped and counted."""
    _, _, out = measured
    rows = read_rows(out)
    dispatch = {k: v for k, v in rows[1].items() if k not in ("spec", "source")} | {
        "target": "dispatch", "kernel": "dispatch:t.json", "name": "user_call", "served_by": "torch"}
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in rows + [dispatch]))
    store = Store(tmp_path / "s.sqlite")
    assert main(["import", str(mixed), "--store", str(store.path)]) == 0
    assert "1 row(s) of a table or torch measured through a call skipped" in capsys.readouterr().out
    assert store.count() == len(rows) - 1


@pytest.mark.parametrize("arch", ["sm_90:x", "sm_xx"])
def test_an_arch_l2c_does_not_know_is_refused_before_anything_is_stored(arch, measured, capsys, tmp_path):
    """The arch is the last field of every stored problem's key: `sm_90:x` made every later tune on the store die
    (IndexError) after its search, and an unknown one was stored where no tune reads it."""
    _, _, out = measured
    store = Store(tmp_path / "s.sqlite")
    assert main(["import", str(out), "--store", str(store.path), "--arch", arch]) == 2
    assert "--arch" in capsys.readouterr().err and store.count() == 0


def test_a_cutlass_row_imports_as_its_point_with_either_epilogue_store(measured):
    """The epilogue store is the tuner's choice per point (`space.tuner_store`), not a searched knob: a CUTLASS row
    measured with the TMA store or with the staged one is the same search point, and keeps the text of the kernel it
    timed."""
    from l2c.commands.import_results import results_from_rows
    from l2c.search.space import Problem, params_from_spec, spec_from_params
    _, _, out = measured
    rows = read_rows(out)
    env = next(r for r in rows if r.get("type") == "env")
    row = next(r for r in rows if r.get("type") == "result" and r.get("status") == "ok")
    problem = Problem(int(row["m"]), int(row["n"]), int(row["k"]))
    params = {"target": "cutlass", "tile_m": 128, "tile_n": 128, "tile_k": 64, "pipeline_stages": "auto",
              "launch_schedule": "pingpong", "launch_swap": "no", "cluster_m": 1, "cluster_n": 2,
              "swizzle_group": 4, "swizzle_raster": "n", "split_k_slices": 1, "split_k_mode": "workspace"}
    new = spec_from_params(params, problem, generic=True)
    assert new.epilogue_store == "staged"
    for store in ("tma", "staged"):
        text = new.replace(epilogue_store=store).to_l2()
        measured_row = dict(row, target="cutlass", spec=text, name=new.name, kernel=new.name)
        results, counts = results_from_rows([env, measured_row], "sm_90", {})
        assert counts["imported"] == 1 and counts["outside_space"] == 0
        (result,) = results
        assert result.params == params and params_from_spec(parse_one(result.spec), "cutlass") == params
        assert parse_one(result.spec).epilogue_store == store


def test_a_gated_row_imports_into_its_gated_problem(measured):
    """A row of a gated kernel (its `gate` field, as the gated sweep writes it) is a point of the gated problem that
    `l2c tune --gate` searches, never of the plain problem of the same shape."""
    from l2c.commands.import_results import results_from_rows
    _, _, out = measured
    rows = read_rows(out)
    env = next(r for r in rows if r.get("type") == "env")
    row = next(r for r in rows if r.get("type") == "result" and r.get("status") == "ok")
    problem = Problem(int(row["m"]), int(row["n"]), int(row["k"]), layout_b="col", gate="silu")
    params = {"target": "triton", "tile_m": 16, "tile_n": 16, "tile_k": 16, "swizzle_group": 1}
    spec = spec_from_params(params, problem, generic=True)
    gated_row = dict(row, layout="row,col,row", gate="silu", spec=spec.to_l2(), name=spec.name, kernel=spec.name)
    results, counts = results_from_rows([env, gated_row], "sm_90", {})
    assert counts["imported"] == 1 and counts["outside_space"] == 0
    (result,) = results
    assert result.problem == problem.key() and result.params["tile_n"] == 16
    assert parse_one(result.spec).epilogue_gate == "silu"

