"""`l2c bench` and `l2c report` end to end on the CPU device: rows, failures, resume, plots, errors."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from l2c.results_file import read_rows, row_key
from l2c.cli import main

REPO = Path(__file__).resolve().parent.parent

SPECS = """
kernel tiny {
  target   triton
  problem  m=any n=any k=any
  types    a=f16 b=f16 c=f16 acc=f32
  tile     m=16 n=16 k=16
  swizzle  group=1
}
kernel tiny_fixed {
  target   triton
  problem  m=16 n=32 k=16
  types    a=f16 b=f16 c=f16 acc=f32
  tile     m=16 n=16 k=16
}
kernel f32_any_target {
  problem  m=any n=any k=any
  types    a=f32 b=f32 c=f32 acc=f32 math=ieee
  tile     m=16 n=16 k=16
  swizzle  group=1
}
"""

FAST = ["--device", "cpu", "--reps", "2", "--iters", "2", "--warmup", "1"]


def l2c(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "l2c", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def results(path):
    return [r for r in read_rows(path) if r["type"] == "result"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_no_gpu_is_a_clear_exit_2(tmp_path, capsys):
    assert main(["bench", "torch", "--shapes", "square", "-o", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU is visible" in err and "--device cpu" in err
    assert not (tmp_path / "r.jsonl").exists()


def test_bad_shapes_file_names_file_and_line(tmp_path, capsys):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("16 16 16\n16 sixteen 16\n")
    assert main(["bench", "torch", "--shapes", str(shapes), *FAST, "-o", str(tmp_path / "r.jsonl")]) == 2
    assert f"{shapes}:2: dimensions must be whole numbers" in capsys.readouterr().err


def test_generic_spec_needs_shapes_and_output_is_not_overwritten(tmp_path, capsys):
    spec = tmp_path / "k.l2"
    spec.write_text(SPECS)
    assert main(["bench", str(spec), *FAST, "-o", str(tmp_path / "r.jsonl")]) == 2
    assert "shape-generic" in capsys.readouterr().err
    (tmp_path / "r.jsonl").write_text('{"type": "env"}\n')
    assert main(["bench", "torch", "--shapes", "square", *FAST, "-o", str(tmp_path / "r.jsonl")]) == 2
    assert "--resume" in capsys.readouterr().err


def test_bench_specs_end_to_end(tmp_path, capsys):
    """Generic specs run on every shape, the fixed spec on its own; failures are recorded and never timed."""
    spec = tmp_path / "k.l2"
    spec.write_text(SPECS)
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("16 16 16\n16 32 16   # tiny_fixed's shape\n")
    out = tmp_path / "r.jsonl"
    assert main(["bench", str(spec), "--shapes", str(shapes), "--protocol", "kernel,call", *FAST,
                 "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "CPU mode" in captured.err and "CPU mode" in captured.out
    rows = read_rows(out)
    env = rows[0]
    assert env["type"] == "env" and env["device"] == "cpu" and "CPU mode" in env["note"]
    for key in ("gpu", "driver", "cuda", "torch", "triton", "cutlass", "protocols", "command", "date", "hostname"):
        assert key in env
    assert env["protocols"] == ["kernel", "call"] and env["cutlass"] == "4.2.0.0"
    res = rows[1:]
    by = {}
    for r in res:
        by.setdefault(r["kernel"], []).append(r)
    k = f"{spec}:"
    assert sorted(by) == sorted([k + "tiny@triton", k + "tiny_fixed@triton", k + "f32_any_target@triton",
                                 k + "f32_any_target@cutlass"])
    assert len(by[k + "tiny@triton"]) == 4 and len(by[k + "f32_any_target@triton"]) == 4
    assert {(r["m"], r["n"], r["k"]) for r in by[k + "tiny_fixed@triton"]} == {(16, 32, 16)}
    for r in by[k + "tiny@triton"] + by[k + "tiny_fixed@triton"] + by[k + "f32_any_target@triton"]:
        assert r["status"] == "ok" and r["verified"] is True and r["rel_error"] <= r["tolerance"]
        assert r["speedup"] > 0 and len(r["candidate_samples_s"]) == 2
    for r in by[k + "f32_any_target@cutlass"]:
        assert r["status"] == "invalid" and "cutlass-dtypes" in r["reason"] and "speedup" not in r
    assert len({row_key(r) for r in res}) == len(res)
    assert "tiny_fixed@triton (f16) [kernel]: 1 shape(s) measured" in captured.out   # f16 and f32 rows: titles say which

    # l2c report on the same file: summary on stdout, plots written (one scatter per kernel and protocol)
    plots = tmp_path / "plots"
    assert main(["report", str(out), "-o", str(plots)]) == 0
    rep = capsys.readouterr().out
    assert "f32_any_target@cutlass (f32) [kernel]: 0 shape(s) measured; 2 invalid" in rep
    assert "best-of [kernel]" in rep and "NOTE: CPU mode" in rep
    pngs = sorted(plots.glob("*.png"))
    assert len(pngs) == 8 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_report_without_matplotlib_prints_summary_and_skips_plots(tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.jsonl"
    rows = [{"type": "result", "kernel": "x", "m": 64, "n": 64, "k": 64, "batch": 1, "flops": 2 * 64 ** 3,
             "protocol": "call", "status": "ok", "speedup": 1.5}]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import matplotlib now raises ImportError
    assert main(["report", str(out), "-o", str(tmp_path / "plots")]) == 0
    text = capsys.readouterr().out
    assert "x [call]: 1 shape(s) measured" in text and "geomean speedup 1.500x" in text
    assert "plots skipped: matplotlib is not installed" in text
    assert not (tmp_path / "plots").exists()


def test_compressed_results_are_read_but_never_appended_to(tmp_path, capsys):
    """Large finished results files are committed xz-compressed: report and table read them like the plain file;
    bench refuses to append to one (it would have to rewrite the whole file) and says how to continue."""
    import lzma
    rows = [{"type": "env", "gpu": "NVIDIA H200"}] + [
        {"type": "result", "kernel": "x", "name": "x", "target": "triton", "m": m, "n": 64, "k": 64, "batch": 1,
         "flops": 2 * m * 64 * 64, "dtype": "f16", "layout": "row,row,row", "protocol": "kernel", "status": "ok",
         "speedup": 1.25, "candidate_tflops": 1.25, "baseline_tflops": 1.0,
         "spec": "kernel x {\n  target triton\n}\n"} for m in (64, 128)]
    plain = tmp_path / "r.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    packed = tmp_path / "r.jsonl.xz"
    packed.write_bytes(lzma.compress(plain.read_bytes()))
    assert read_rows(packed) == read_rows(plain) == rows
    assert main(["report", str(packed), "--no-plots"]) == 0
    assert "x [kernel]: 2 shape(s) measured" in capsys.readouterr().out
    assert main(["table", str(packed), "-o", str(tmp_path / "t.json")]) == 0
    assert len(json.loads((tmp_path / "t.json").read_text())["entries"]) == 2
    (tmp_path / "shapes.txt").write_text("64 64 64\n")
    assert main(["bench", "torch", "--shapes", str(tmp_path / "shapes.txt"), *FAST, "--resume",
                 "-o", str(packed)]) == 2
    assert "plain .jsonl" in capsys.readouterr().err
    (tmp_path / "bad.jsonl.xz").write_bytes(b"not xz")
    with pytest.raises(Exception, match="not an xz file"):
        read_rows(tmp_path / "bad.jsonl.xz")


def test_resume_after_kill_completes_without_duplicates(tmp_path):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("".join(f"{8 + i % 5 * 8} {8 + i % 3 * 8} {8 + i * 8}\n" for i in range(120)))
    out = tmp_path / "r.jsonl"
    args = [sys.executable, "-m", "l2c", "bench", "torch", "--shapes", str(shapes), "--protocol", "kernel,call",
            "--device", "cpu", "--reps", "2", "--iters", "2", "--warmup", "1", "-o", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_text().count('"type": "result"') >= 6:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run finished before it could be interrupted"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    proc.stdout.close()
    proc.stderr.close()
    done_before = results(out)
    assert 6 <= len(done_before) < 240
    with open(out, "a") as f:                       # a row torn by the kill, as a killed writer can leave
        f.write('{"type": "result", "kernel": "torch", "m": 8')

    resumed = subprocess.run(args + ["--resume"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"({len(done_before)} already in" in resumed.stderr
    rows = results(out)
    assert len(rows) == 240 and len({row_key(r) for r in rows}) == 240
    assert rows[:len(done_before)] == done_before    # finished rows kept as they were
    assert all(r["status"] == "ok" for r in rows)
    assert sum(1 for r in read_rows(out) if r["type"] == "env") == 2   # one header per session


def test_tuned_table_entries_run_on_their_own_shapes(tmp_path, capsys):
    from l2c.parser import parse
    tiny = parse(SPECS)[0].to_l2()
    table = {"format": 1, "arch": "sm_90", "gpu": "NVIDIA H200", "protocol": "kernel", "entries": [
        {"m": 16, "n": 16, "k": 32, "batch": 1, "dtype": "f16", "layout": "row,row,row", "target": "triton",
         "spec": tiny, "tflops": 1.0, "baseline_tflops": 1.0},
        {"m": 8, "n": 24, "k": 16, "batch": 1, "dtype": "f16", "layout": "row,row,row", "target": "triton",
         "spec": tiny, "tflops": 1.0, "baseline_tflops": 1.0},
    ]}
    path = tmp_path / "sm_90.json"
    path.write_text(json.dumps(table))
    out = tmp_path / "r.jsonl"
    assert main(["bench", str(path), "--protocol", "call", *FAST, "-o", str(out)]) == 0
    rows = results(out)
    assert [(r["kernel"], r["m"], r["n"], r["k"], r["status"]) for r in rows] == [
        (f"{path}#0:tiny@triton", 16, 16, 32, "ok"), (f"{path}#1:tiny@triton", 8, 24, 16, "ok")]
    # each row carries its spec's text, so `l2c table` reads the rows after the table they came from is gone
    path.rename(tmp_path / "gone.json")
    made = tmp_path / "made.json"
    assert main(["table", str(out), "--protocol", "call", "--every-shape", "-o", str(made)]) == 0
    assert {e["spec"] for e in json.loads(made.read_text())["entries"]} == {tiny}
    path.write_text(json.dumps(table))
    # --shapes filters table entries to the shapes in the set
    shapes = tmp_path / "s.txt"
    shapes.write_text("8 24 16\n")
    out2 = tmp_path / "r2.jsonl"
    assert main(["bench", str(path), "--shapes", str(shapes), "--protocol", "call", *FAST, "-o", str(out2)]) == 0
    assert [(r["m"], r["n"], r["k"]) for r in results(out2)] == [(8, 24, 16)]
    assert "1 fixed-shape kernel(s)/table entries skipped" in capsys.readouterr().err


def one_entry_table(folder: Path, layout: str) -> Path:
    """A table whose one entry, a Triton kernel t32 in `layout`, serves 32x48x40 (and no other M)."""
    a, b, c = layout.split(",")
    spec = (f"kernel t32 {{\n  target triton\n  problem m=any n=48 k=40\n  layout a={a} b={b} c={c}\n"
            "  tile m=16 n=16 k=16\n  swizzle group=1\n}\n")
    table = folder / "t.json"
    table.write_text(json.dumps({"format": 1, "arch": "sm_90", "entries": [
        {"m": 32, "n": 48, "k": 40, "batch": 1, "dtype": "f16", "layout": layout, "target": "triton",
         "spec": spec, "tflops": 2.0, "baseline_tflops": 1.0}]}))
    return table


def test_bench_measures_what_users_call_through_the_dispatcher(tmp_path):
    """`dispatch:TABLE` and `linear:TABLE` time l2c.matmul / l2c.nn.Linear's path itself: after the background
    worker prepared the kernel, the table's shape is served tuned (the row names the kernel) and a shape the table
    does not hold is served by torch, both verified against the reference."""
    table = one_entry_table(tmp_path, "row,col,row")
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("32 48 40\n31 48 40\n")
    out = tmp_path / "r.jsonl"
    assert main(["bench", f"dispatch:{table}", f"linear:{table}", "--shapes", str(shapes), "--layout",
                 "row,col,row", "-o", str(out), "--protocol", "kernel", *FAST]) == 0
    rows = [r for r in read_rows(out) if r.get("type") == "result"]
    assert len(rows) == 4 and all(r["status"] == "ok" and r["verified"] is True for r in rows)
    served = {(r["kernel"].split(":")[0], r["m"]): r["served_by"] for r in rows}
    assert served[("dispatch", 32)] == served[("linear", 32)] == "t32"
    assert served[("dispatch", 31)] == served[("linear", 31)] == "torch"


def test_a_dispatcher_candidate_that_cannot_allocate_a_shape_is_an_error_row_and_the_run_goes_on(tmp_path):
    """The first calls that let the dispatcher prepare its kernel (`prime`) need the shape's inputs: where they
    cannot be allocated (an LLM's lm_head beside other processes' memory on a GPU; here a process limited to 3 GiB
    of address space, a real allocator failure) the shape gets an `error` row saying why, and the next shapes are
    measured as usual."""
    table = one_entry_table(tmp_path, "row,row,row")
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("32 48 40\n16384 16384 16384\n31 48 40\n")   # the middle one's inputs: 2 x 1 GiB drawn
    out = tmp_path / "r.jsonl"
    program = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
               "from l2c.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", program, "bench", f"dispatch:{table}", "--shapes", str(shapes),
                           "--protocol", "kernel", *FAST, "-o", str(out)], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["m"]: r for r in read_rows(out) if r.get("type") == "result"}
    assert rows[32]["status"] == rows[31]["status"] == "ok" and rows[32]["served_by"] == "t32"
    assert rows[16384]["status"] == "error" and "allocate" in rows[16384]["reason"]
    assert "error at 16384x16384x16384" in done.stderr


def test_bench_dispatch_without_a_table_measures_what_users_get_on_this_gpu(monkeypatch):
    """`dispatch` with no table named is l2c.matmul as users get it: the table shipped for this GPU (the H100's),
    else the arch's default table, which serves only on the GPU it was measured on (the H200); elsewhere it serves
    nothing and its kernels are online choice's candidates. A table named by path is used as it is. (The GPU's
    name is given: this machine has none.)"""
    from l2c import candidates
    from l2c.dispatch import default_table_path
    monkeypatch.delenv("L2C_TUNED_TABLE", raising=False)
    for gpu, serves in (("NVIDIA H200", "NVIDIA H200"), ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
                        ("NVIDIA H20", None)):
        monkeypatch.setattr(candidates, "_gpu_name", lambda: gpu)
        for name in ("dispatch", f"dispatch:{default_table_path('sm_90')}"):
            [cand] = candidates.load_candidates([name])
            dispatcher = cand._kernel.dispatcher
            served_by = dispatcher.table.gpu if dispatcher.table is not None else None
            assert served_by == ("NVIDIA H200" if ":" in name else serves)
            if served_by:   # online choice off: the serving table is the candidates too
                assert dispatcher.candidates is dispatcher.table
            assert dispatcher.candidates is not None and dispatcher.candidates.gpu == (served_by or "NVIDIA H200")


def test_bench_dispatch_none_serves_no_table_and_times_the_arch_tables_kernels(monkeypatch):
    """`dispatch:none` measures online choice alone, whatever table ships for this GPU: no table serves, and the
    candidates are the arch's table (how a GPU's own table's points are measured)."""
    from l2c import candidates
    from l2c.dispatch import shipped_table_path
    from l2c.tuned_table import load_table
    monkeypatch.delenv("L2C_TUNED_TABLE", raising=False)
    general = load_table(shipped_table_path("sm_90"))
    for gpu in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        monkeypatch.setattr(candidates, "_gpu_name", lambda: gpu)
        [cand] = candidates.load_candidates(["dispatch:none"])
        dispatcher = cand._kernel.dispatcher
        assert cand.id == "dispatch:none" and dispatcher.table is None
        assert dispatcher.candidates.gpu == general.gpu and len(dispatcher.candidates) == len(general) > 0


def test_served_shapes_are_what_the_dispatch_table_serves_and_become_its_evidence(tmp_path):
    """`--shapes served`: each entry's M and a token range's ends and middle, in the asked dtype and layout only;
    the rows, through the dispatcher in two protocols, are what `l2c table --protocol kernel,call` reads."""
    spec = ("kernel t32 {\n  target triton\n  problem m=any n=48 k=40\n  layout a=row b=col c=row\n"
            "  tile m=16 n=16 k=16\n  swizzle group=1\n}\n")
    entry = {"n": 48, "k": 40, "batch": 1, "layout": "row,col,row", "target": "triton", "spec": spec,
             "tflops": 2.0, "baseline_tflops": 1.0}
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"format": 1, "arch": "sm_90", "entries": [
        dict(entry, m=32, dtype="f16"), dict(entry, m=8, m_range=[4, 12], dtype="f16"),
        dict(entry, m=64, dtype="bf16")]}))
    out = tmp_path / "r.jsonl"
    assert main(["bench", f"linear:{table}", "--shapes", "served", "-o", str(out), "--protocol", "kernel,call",
                 *FAST]) == 0
    rows = [r for r in read_rows(out) if r.get("type") == "result"]
    assert sorted({(r["m"], r["n"], r["k"]) for r in rows}) == [(4, 48, 40), (8, 48, 40), (12, 48, 40), (32, 48, 40)]
    assert all(r["status"] == "ok" and r["served_by"] == "t32" and r["served_spec"] == spec
               and r["served_target"] == "triton" for r in rows)
    table.write_text(json.dumps({"format": 1, "arch": "sm_90", "entries": []}))   # the rows outlive the table
    made = tmp_path / "made.json"
    assert main(["table", str(out), "--protocol", "kernel,call", "--every-shape", "-o", str(made)]) == 0
    written = json.loads(made.read_text())
    assert written["protocol"] == "kernel,call" and len(written["entries"]) == 4
    assert all(e["spec"] == spec and e["target"] == "triton" and set(e["speedups"]) == {"kernel", "call"}
               for e in written["entries"])
    assert main(["bench", "torch", "--shapes", "served", "-o", str(tmp_path / "x.jsonl")]) == 2


def test_online_rows_record_what_online_tuning_timed(tmp_path, monkeypatch):
    """With online choice on (`L2C_TUNE=online`; the Triton interpreter here, margins 0), a row through the
    dispatcher names the kernel online tuning chose (`served_via: online`) and carries every candidate it timed at
    that shape (`online_timings`), the chosen one among them: the evidence `l2c table --near` reads."""
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("L2C_TUNE", "online")
    monkeypatch.setenv("L2C_TUNE_MARGIN", "0")
    monkeypatch.setenv("L2C_TUNE_EAGER_MARGIN", "0")
    monkeypatch.setenv("L2C_TUNE_TARGETS", "cutlass,triton")
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"format": 1, "arch": "sm_90", "entries": []}))
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("2 48 64\n")
    out = tmp_path / "r.jsonl"
    assert main(["bench", f"linear:{table}", "--shapes", str(shapes), "-o", str(out), *FAST]) == 0
    row, = [r for r in read_rows(out) if r.get("type") == "result"]
    assert row["status"] == "ok" and row["served_via"] == "online" and "family=gemv" in row["served_spec"]
    timed = row["online_timings"]
    assert row["served_spec"] in timed and all(isinstance(v, float) and v > 0 for v in timed.values())


def test_only_served_keeps_the_shapes_the_table_serves(tmp_path):
    """`--only-served`: of a shape set, only the shapes the one dispatch table serves in --dtype and --layout
    are measured; without a shape set, or without a dispatch table, it is a usage error."""
    spec = ("kernel t32 {\n  target triton\n  problem m=any n=48 k=40\n  layout a=row b=row c=row\n"
            "  tile m=16 n=16 k=16\n  swizzle group=1\n}\n")
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"format": 1, "arch": "sm_90", "entries": [
        {"m": 8, "m_range": [4, 12], "n": 48, "k": 40, "batch": 1, "dtype": "f16", "layout": "row,row,row",
         "target": "triton", "spec": spec, "tflops": 2.0, "baseline_tflops": 1.0}]}))
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("3 48 40\n4 48 40\n12 48 40\n13 48 40\n8 56 40\n")
    out = tmp_path / "r.jsonl"
    assert main(["bench", f"dispatch:{table}", "--shapes", str(shapes), "--only-served", "-o", str(out),
                 *FAST]) == 0
    rows = [r for r in read_rows(out) if r.get("type") == "result"]
    assert sorted((r["m"], r["n"]) for r in rows) == [(4, 48), (12, 48)]
    assert all(r["served_by"] == "t32" for r in rows)
    assert main(["bench", f"dispatch:{table}", "--shapes", str(shapes), "--only-served", "--dtype", "bf16",
                 "-o", str(tmp_path / "b.jsonl"), *FAST]) == 2   # it serves no bf16 call: nothing to measure
    assert main(["bench", f"dispatch:{table}", "--only-served", "-o", str(tmp_path / "x.jsonl")]) == 2
    assert main(["bench", "torch", "--shapes", str(shapes), "--only-served", "-o", str(tmp_path / "y.jsonl")]) == 2


# a shape-generic Triton kernel in nn.Linear's layout, which the CPU's interpreter serves at any shape
LINEAR_TRITON_RC = ("kernel rc {\n  target triton\n  problem m=any n=any k=any\n  layout a=row b=col c=row\n"
                    "  tile m=16 n=16 k=16\n  swizzle group=1\n}\n")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_serving_measures_each_spec_through_the_dispatcher_at_every_shape(tmp_path, capsys):
    """`serving:FILE.l2`: l2c.matmul serves each shape-generic spec at every shape of the set, in the spec's layouts
    (nn.Linear's path for a column-major B), verified; each row names the spec that served it, which `l2c table`
    makes entries of. A spec fixed in a dimension is refused, naming it."""
    specs = tmp_path / "s.l2"
    specs.write_text("kernel rr {\n  target triton\n  problem m=any n=any k=any\n  tile m=16 n=16 k=16\n"
                     "  swizzle group=1\n}\n"
                     + LINEAR_TRITON_RC)
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("16 32 16\n24 16 32\n")
    out = tmp_path / "r.jsonl"
    assert main(["bench", f"serving:{specs}", "--shapes", str(shapes), "-o", str(out), "--protocol", "kernel",
                 *FAST]) == 0
    rows = results(out)
    assert len(rows) == 4 and all(r["status"] == "ok" and r["verified"] is True for r in rows)
    assert {(r["served_by"], r["layout"]) for r in rows} == {("rr", "row,row,row"), ("rc", "row,col,row")}
    assert all(r["served_spec"].startswith(f"kernel {r['served_by']} ") for r in rows)
    made = tmp_path / "made.json"
    assert main(["table", str(out), "--every-shape", "-o", str(made)]) == 0
    assert len(json.loads(made.read_text())["entries"]) == 4
    fixed = tmp_path / "f.l2"
    fixed.write_text("kernel f {\n  target triton\n  problem m=any n=32 k=any\n  tile m=16 n=16 k=16\n}\n")
    capsys.readouterr()
    assert main(["bench", f"serving:{fixed}", "--shapes", str(shapes), "-o", str(tmp_path / "x.jsonl"), *FAST]) == 2
    assert "f must be a valid shape-generic spec" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_serving_kernel_torch_stood_in_for_is_a_failed_row_naming_why(tmp_path):
    """A `serving:` kernel the dispatcher could not serve at a shape (a build or a verification that failed, a
    declined signature: here a CUDA kernel on CPU tensors) is recorded as `not_served` with the dispatcher's reason
    and the spec it was to serve, never as a timing of torch against itself; `l2c table` makes no entry of it. The
    Triton kernel beside it is measured as before."""
    specs = tmp_path / "s.l2"
    specs.write_text("kernel gv {\n  target cutlass\n  problem m=any n=any k=any\n  layout a=row b=col c=row\n"
                     "  launch family=gemv cores=cuda warps=4 evict=first\n  tile m=1 n=8 k=256\n}\n"
                     + LINEAR_TRITON_RC)
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("16 64 64\n")
    out = tmp_path / "r.jsonl"
    assert main(["bench", f"serving:{specs}", "--shapes", str(shapes), "-o", str(out), "--protocol", "kernel,call",
                 *FAST]) == 0
    rows = {(r["kernel"].rsplit(":", 1)[1], r["protocol"]): r for r in results(out)}
    assert len(rows) == 4
    for protocol in ("kernel", "call"):
        failed, ok = rows[("gv@cutlass", protocol)], rows[("rc@triton", protocol)]
        assert failed["status"] == "not_served" and "speedup" not in failed and failed["served_by"] == "torch"
        assert "CUTLASS kernels run on CUDA tensors" in failed["reason"]
        assert failed["served_spec"].startswith("kernel gv ") and failed["served_target"] == "cutlass"
        assert ok["status"] == "ok" and ok["served_by"] == "rc"
    made = tmp_path / "made.json"
    assert main(["table", str(out), "--every-shape", "--protocol", "kernel,call", "-o", str(made)]) == 0
    assert [e["spec"].split()[1] for e in json.loads(made.read_text())["entries"]] == ["rc"]


def test_cold_rotation_reads_every_operand_from_memory():
    """--roofline rotates at least two operand sets, with three L2s of other operands between two uses of one."""
    from l2c.measure import Problem, rotation_sets
    from l2c.roofline import Ceilings, roofline_fields
    l2 = 60 * 2**20
    for n, k in ((4096, 4096), (14336, 4096), (28672, 8192), (1024, 1024)):
        p = Problem(1, n, k, layout_b="col")
        sets = rotation_sets(p, l2, cold=True)
        assert sets >= 2 and (sets - 1) * p.footprint_bytes() >= 3 * l2
    assert rotation_sets(Problem(1, 64, 64), l2, cold=True) == 4096     # capped: tiny operands stay warm
    assert rotation_sets(Problem(8192, 8192, 8192), l2, cold=False) == 1   # warm: past 2 x L2 already
    ceilings = Ceilings(4.0e12, {"f16": 800e12})
    p = Problem(1, 4096, 4096)
    floor = p.footprint_bytes() / 4.0e12                  # one token: memory-bound
    fields = roofline_fields(p, type("T", (), {"candidate_s": 2 * floor, "baseline_s": 4 * floor})(), ceilings)
    assert fields["roofline_fraction"] == pytest.approx(0.5) and fields["baseline_roofline_fraction"] == pytest.approx(0.25)
    big = Problem(8192, 8192, 8192)                       # compute-bound: the dense rate sets the floor
    assert ceilings.roofline_s(big) == pytest.approx(2 * 8192 ** 3 / 800e12)
    single = Problem(64, 64, 64, dtype="f32")             # no dense rate measured for it: no fraction, no error
    assert roofline_fields(single, type("T", (), {"candidate_s": 1.0, "baseline_s": 1.0})(), ceilings) == {}


def test_roofline_without_rotation_is_refused(tmp_path):
    """--roofline counts every operand byte as read from HBM: with --no-rotate the weights would stay in L2, so the
    combination is refused before anything runs."""
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("8 8 8\n")
    done = l2c("bench", "torch", "--shapes", shapes, "--roofline", "--no-rotate", "-o", tmp_path / "r.jsonl", *FAST)
    assert done.returncode == 2 and "--no-rotate" in done.stderr and "Traceback" not in done.stderr


GOOD_ROW = {"type": "result", "kernel": "k", "target": "triton", "m": 64, "n": 64, "k": 64, "batch": 1,
            "flops": 524288, "protocol": "kernel", "dtype": "f16", "layout": "row,row,row", "status": "ok",
            "speedup": 1.1}
BAD_ROWS = {
    "a list": [1, 2, 3], "m 0": {"m": 0}, "m -4": {"m": -4}, "m float": {"m": 64.0}, "m list": {"m": [64]},
    "m bool": {"m": True}, "m 2^31": {"m": 2**31}, "batch -2": {"batch": -2}, "no m": {"m": None},
    "spec 5": {"spec": 5}, "source 7": {"source": 7}, "dtype f64": {"dtype": "f64"}, "dtype null": {"dtype": None},
    "layout row": {"layout": "row"}, "protocol nope": {"protocol": "nope"}, "target path": {"target": "../x"},
    "gate zz": {"gate": "zz"}, "speedup -1": {"speedup": -1}, "speedup text": {"speedup": "1.1"},
    "ok without speedup": {"speedup": None}, "flops null": {"flops": None}, "served_target": {"served_target": "x"},
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_a_malformed_results_row_is_one_line_naming_file_line_and_field(case, tmp_path, capsys):
    """Every reader of results (report, table, import, bench --resume) takes rows through one check: a row a reader
    would trip on is an exit 2 with the file, the line and the field, never a traceback or a table entry."""
    bad = BAD_ROWS[case]
    row = bad if isinstance(bad, list) else {k: v for k, v in {**GOOD_ROW, **bad}.items()
                                            if not (k == "kernel" and v is None)}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"type": "env", "gpu": "X", "device": "cuda"}) + "\n" + json.dumps(row) + "\n"
                    + json.dumps(GOOD_ROW) + "\n")
    assert main(["report", str(path), "-o", str(tmp_path / "report")]) == 2
    assert main(["table", str(path), "-o", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2:" in err and "Traceback" not in err
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("field", ["kernel", "protocol", "flops"])
def test_report_refuses_a_row_without_what_it_groups_and_plots_by(field, tmp_path, capsys):
    """Scripts write rows of their own without a kernel or protocol, which the row check lets through; the report
    groups by both and plots by flops, so it names the missing field instead of a KeyError."""
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({k: v for k, v in GOOD_ROW.items() if k != field}) + "\n")
    assert main(["report", str(path), "-o", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert f"without '{field}'" in err and "64x64x64" in err and "Traceback" not in err


def test_the_committed_results_pass_the_row_check():
    """The check refuses nothing l2c bench has written: every committed results file reads."""
    root = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    files = sorted(root.glob("**/*.jsonl*"))
    assert len(files) > 100
    assert sum(len(read_rows(f)) for f in files) > 100000


def test_bad_numbers_on_the_command_line_are_refused(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(GOOD_ROW) + "\n")
    assert main(["table", str(path), "--min-speedup", "nan", "-o", str(tmp_path / "t.json")]) == 2
    with pytest.raises(SystemExit) as exit_:
        main(["verify", "examples/hgemm_generic.l2", "--seed", str(2**64)])
    assert exit_.value.code == 2
    assert "--min-speedup must be a positive number" in capsys.readouterr().err


def test_warmup_counts_the_malformed_entries_a_table_read_left_out(tmp_path, capsys):
    """A table whose entries are malformed is no table warmed up: they are named and the exit status is 1."""
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"arch": "sm_90", "entries": [{"m": -1, "n": 8, "k": 8}]}))
    assert main(["warmup", str(table), "--device", "cpu"]) == 1
    assert "1 malformed entries left out" in capsys.readouterr().out


def test_bench_of_a_table_marks_the_entries_the_dispatcher_does_not_serve_at_their_shape(tmp_path, capsys):
    """An exact entry and a token-range entry at one shape: both are measured, the row of the range (which the
    exact entry shadows there) says so, and the report's table summary holds the exact entry's row."""
    from l2c.parser import parse
    tiny = parse(SPECS)[0].to_l2()
    entry = {"m": 16, "n": 32, "k": 32, "batch": 1, "dtype": "f16", "layout": "row,row,row", "target": "triton",
             "spec": tiny, "tflops": 2.0, "baseline_tflops": 1.0, "speedup": 2.0}
    path = tmp_path / "t.json"
    losing = dict(entry, m=8, tflops=0.9, speedup=0.9)   # no faster than torch: left out of the table, not shadowed
    path.write_text(json.dumps({"format": 1, "arch": "sm_90", "entries": [
        entry, dict(entry, speedup=1.2, m_range=[16, 64], range_min_speedup=1.2), losing]}))
    out = tmp_path / "r.jsonl"
    assert main(["bench", str(path), *FAST, "-o", str(out)]) == 0
    assert sorted((r["kernel"], r["table_served"]) for r in results(out)) == [
        (f"{path}#0:tiny@triton", True), (f"{path}#1:tiny@triton", False), (f"{path}#2:tiny@triton", True)]
    assert "1 row(s) of table entries that another entry shadows" in capsys.readouterr().out


def test_resume_refuses_a_file_measured_on_another_machine_or_method(tmp_path, capsys):
    shapes = tmp_path / "s.txt"
    shapes.write_text("8 8 8\n")
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps({"type": "env", "device": "cuda", "gpu": "NVIDIA H200"}) + "\n")
    assert main(["bench", "torch", "--shapes", str(shapes), *FAST, "--resume", "-o", str(out)]) == 2
    assert "measured otherwise (device 'cuda' there, 'cpu' now" in capsys.readouterr().err
    out.unlink()
    assert main(["bench", "torch", "--shapes", str(shapes), *FAST, "-o", str(out)]) == 0
    assert main(["bench", "torch", "--shapes", str(shapes), *FAST, "--no-graphs", "--resume", "-o", str(out)]) == 2
    assert "graphs True there, False now" in capsys.readouterr().err


def test_batched_shapes_go_to_torch_in_every_dtype_and_a_plan_of_nothing_is_an_error(tmp_path, capsys):
    shapes = tmp_path / "s.txt"
    shapes.write_text("16 32 32 4\n")
    for dtype in ("f16", "bf16"):
        out = tmp_path / f"{dtype}.jsonl"
        assert main(["bench", "torch", "--shapes", str(shapes), "--dtype", dtype, *FAST, "-o", str(out)]) == 0
        assert [(r["batch"], r["status"]) for r in results(out)] == [(4, "ok")]
    spec = tmp_path / "k.l2"
    spec.write_text(SPECS)
    assert main(["bench", str(spec), "--shapes", str(shapes), *FAST, "-o", str(tmp_path / "k.jsonl")]) == 2
    assert "nothing to measure: no kernel takes any shape" in capsys.readouterr().err
    assert not (tmp_path / "k.jsonl").exists()


@pytest.mark.parametrize("extra, fragment", [
    (["--protocol", "kernl"], "unknown protocol(s) kernl"),
    (["--only-faster", "nan", "--into", "t.json"], "--only-faster must be a positive number"),
])
def test_table_refuses_bad_options_before_writing(extra, fragment, tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(GOOD_ROW) + "\n")
    assert main(["table", str(path), *extra, "-o", str(tmp_path / "t.json")]) == 2
    assert fragment in capsys.readouterr().err and not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("change, fragment", [
    ({"dtype": None}, "no 'dtype'"),
    ({"candidate_tflops": None}, "no 'candidate_tflops'"),
    ({"candidate_s": "fast"}, "'candidate_s' must be a positive finite number"),
])
def test_table_names_a_measured_row_it_cannot_make_an_entry_of(change, fragment, tmp_path, capsys):
    row = {**GOOD_ROW, "spec": parse_spec_text(), "candidate_tflops": 2.0, "baseline_tflops": 1.0,
           "candidate_s": 1e-5, "baseline_s": 2e-5, **change}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({k: v for k, v in row.items() if v is not None}) + "\n")
    assert main(["table", str(path), "-o", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: row 1 (64x64x64): {fragment}" in err and "Traceback" not in err


def test_table_leaves_out_rows_of_a_dtype_no_table_serves(tmp_path, capsys):
    row = {**GOOD_ROW, "spec": parse_spec_text(), "candidate_tflops": 2.0, "baseline_tflops": 1.0, "speedup": 2.0}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "m": 128, "dtype": "f32"}) + "\n")
    assert main(["table", str(path), "-o", str(tmp_path / "t.json")]) == 0
    assert [e["m"] for e in json.loads((tmp_path / "t.json").read_text())["entries"]] == [64]
    assert "1 measured row(s) of a dtype a table does not serve" in capsys.readouterr().err


def parse_spec_text():
    from l2c.parser import parse
    return parse(SPECS)[0].to_l2()
