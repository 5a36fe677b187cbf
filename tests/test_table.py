"""`l2c table`: a tuned table from recorded bench rows — the per-shape best verified candidate above a margin."""
import itertools
import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from l2c.dispatch import TunedTable
from l2c.ir import KernelSpec


def row(kernel, m, speedup, status="ok", protocol="kernel", spec=None):
    return {"type": "result", "kernel": kernel, "name": kernel, "source": "x", "target": "triton", "m": m, "n": 64,
            "k": 64, "batch": 1, "dtype": "f16", "layout": "row,row,row", "protocol": protocol, "status": status,
            "speedup": speedup, "candidate_tflops": speedup, "baseline_tflops": 1.0,
            "spec": spec if spec is not None else KernelSpec(name=kernel, tile_m=64).to_l2()}


def test_table_keeps_the_best_verified_candidate_above_the_margin(tmp_path):
    rows = [{"type": "env", "gpu": "NVIDIA H200"},
            row("a", 128, 1.20), row("b", 128, 1.30), row("c", 128, 9.0, status="verify_failed"),
            row("torch", 128, 5.0), row("a", 256, 1.02), row("b", 512, 1.5, protocol="call"),
            row("a", 1024, 1.10), row("b", 1024, 1.06)]
    results = tmp_path / "r.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "t.json"
    done = subprocess.run([sys.executable, "-m", "l2c", "table", str(results), "-o", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    table = json.loads(out.read_text())
    got = {(e["m"], e["spec"].split()[1]) for e in table["entries"]}
    assert got == {(128, "b"), (1024, "a")}      # 256: below 1.05; 512: another protocol; c failed; torch is A/A
    assert table["gpu"] == "NVIDIA H200" and table["protocol"] == "kernel"
    loaded = TunedTable.load(out)
    assert loaded.lookup("f16", "row,row,row", 128, 64, 64).speedup == 1.30


def test_host_overhead_charge_drops_wins_that_a_launch_would_eat(tmp_path):
    """With --host-overhead, a kernel-protocol win must survive the extra host time of each launch: a 3 us
    problem won by 10% is dropped, a 300 us one kept; a Triton split-K spec pays for a finalize launch only when
    it has one (`split_k reduce=finalize`).
    The margin (1.05) still applies to the uncharged speedup."""
    split = KernelSpec(name="s", target="triton", tile_m=64, split_k_slices=4).to_l2()
    finalized = KernelSpec(name="f", target="triton", tile_m=64, split_k_slices=4, split_k_reduce="finalize").to_l2()

    def timed(kernel, m, cand, base, spec=None, target="triton"):
        r = row(kernel, m, base / cand, spec=spec)
        return dict(r, candidate_s=cand, baseline_s=base, target=target)

    rows = [{"type": "env", "gpu": "NVIDIA H200"},
            timed("small", 64, 3.0e-6, 3.3e-6),          # 1.10x, but 3.3 / (3 + 20) << 1
            timed("large", 128, 300e-6, 330e-6),         # 1.10x -> 330 / 320 = 1.03 >= 1: kept
            timed("tie", 256, 300e-6, 312e-6),           # 1.04x: under the margin
            timed("one", 512, 200e-6, 240e-6),           # 1 launch: 240 / 220 = 1.09: kept
            timed("split", 1024, 200e-6, 225e-6, spec=split),   # 1.125x, 1 launch: kept
            timed("finalized", 4096, 200e-6, 225e-6, spec=finalized),   # the same, 2 launches: dropped
            timed("cut", 2048, 3.0e-6, 3.6e-6, target="cutlass")]   # cutlass charged 0.1 us: 3.6 / 3.1
    results = tmp_path / "r.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "t.json"
    cmd = [sys.executable, "-m", "l2c", "table", str(results), "-o", str(out),
           "--host-overhead", "triton=20e-6,cutlass=0.1e-6"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    table = json.loads(out.read_text())
    assert {e["m"] for e in table["entries"]} == {128, 512, 1024, 2048}   # split-K reduced in one launch
    assert table["host_overhead_s"] == {"triton": 20e-6, "cutlass": 0.1e-6}
    # without the charge all but the tie clear 1.05
    done = subprocess.run(cmd[:-2], capture_output=True, text=True)
    assert {e["m"] for e in json.loads(out.read_text())["entries"]} == {64, 128, 512, 1024, 2048, 4096}
    bad = subprocess.run(cmd[:-1] + ["gpu=1e-6"], capture_output=True, text=True)
    assert bad.returncode == 2 and "TARGET=SECONDS" in bad.stderr and "Traceback" not in bad.stderr


def test_confirmed_by_keeps_only_entries_that_won_again(tmp_path):
    """--confirmed-by: only specs that won again (>= 1.0) on that shape in the later results are candidates, so each
    shape keeps its best confirmed candidate above the margin; a shape whose candidates the later run lost, did not
    measure, or measured with another spec only, is dropped."""
    first = [{"type": "env", "gpu": "NVIDIA H200"},
             row("a", 64, 1.20), row("b", 128, 1.30), row("c", 256, 1.10), row("d", 512, 1.10),
             row("e", 1024, 1.30), row("f", 1024, 1.12), row("g", 1024, 1.03)]
    again = [{"type": "env", "gpu": "NVIDIA H200"},
             row("a", 64, 1.02),                        # won again: kept
             row("b", 128, 0.97),                       # lost: dropped
             row("x", 256, 1.40),                       # another spec on c's shape: c dropped
             row("a", 64, 1.01, protocol="call"),       # another protocol: does not count
             row("e", 1024, 0.99), row("f", 1024, 1.04),  # the best lost again: the next best confirmed one stays
             row("g", 1024, 1.20)]                      # (g won again, but its first measurement is under 1.05)
    paths = []
    for name, rows in (("first", first), ("again", again)):
        paths.append(tmp_path / f"{name}.jsonl")
        paths[-1].write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "t.json"
    done = subprocess.run([sys.executable, "-m", "l2c", "table", str(paths[0]), "-o", str(out),
                           "--confirmed-by", str(paths[1])], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    table = json.loads(out.read_text())
    assert [(e["m"], e["spec"].split()[1]) for e in table["entries"]] == [(64, "a"), (1024, "f")]
    assert table["confirmed_by"] == [str(paths[1])]
    # confirmations from another GPU are refused
    paths[1].write_text("\n".join(json.dumps(r) for r in [{"type": "env", "gpu": "NVIDIA H100"}] + again[1:]) + "\n")
    bad = subprocess.run([sys.executable, "-m", "l2c", "table", str(paths[0]), "-o", str(out),
                          "--confirmed-by", str(paths[1])], capture_output=True, text=True)
    assert bad.returncode == 2 and "different GPUs" in bad.stderr


def test_rows_whose_spec_cannot_be_found_are_refused_not_skipped(tmp_path):
    """A results row may name its spec by the file it was measured from (`source`); if that file is not there (a
    path on the GPU machine), the table would be the best of fewer candidates than were measured: refused."""
    spec = KernelSpec(name="far", tile_m=64)
    source = tmp_path / "elsewhere" / "pool.l2"
    rows = [{"type": "env", "gpu": "NVIDIA H200"}, row("far", 128, 1.3, spec=""), row("near", 128, 1.1)]
    rows[1]["source"] = str(source)
    results = tmp_path / "r.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "t.json"
    command = [sys.executable, "-m", "l2c", "table", str(results), "-o", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 2 and "far in " + str(source) in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()
    source.parent.mkdir()
    source.write_text(spec.to_l2())
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    entries = json.loads(out.read_text())["entries"]
    assert [e["spec"] for e in entries] == [spec.to_l2()]


def test_ranges_cover_runs_of_consecutive_measured_wins_and_never_cross_a_loss(tmp_path):
    """--ranges: a shape-generic spec that won at 3+ consecutive measured M serves the M between its first and
    last win; a loss (of that spec) at a measured M in between splits the run, and a run of two serves nothing
    beyond its own shapes. The dispatcher then serves an unmeasured M inside a range and nothing outside."""
    generic = KernelSpec(name="g", tile_m=16, problem_m="any").to_l2()
    other = KernelSpec(name="h", tile_m=32, problem_m="any").to_l2()
    speeds = {1: 1.3, 2: 1.2, 4: 1.25, 8: 1.01, 16: 1.3, 24: 1.2, 32: 1.1, 48: 1.2}
    rows = [{"type": "env", "gpu": "NVIDIA H200"}]
    rows += [row("g", m, s, spec=generic) for m, s in speeds.items()]
    rows += [row("torch", m, 1.0) for m in (64, 96)]                       # measured there, nothing won
    rows += [row("h", 64, 1.4, spec=other), row("h", 96, 1.4, spec=other)]   # a run of two: exact only
    results = tmp_path / "r.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "t.json"
    done = subprocess.run([sys.executable, "-m", "l2c", "table", str(results), "-o", str(out), "--ranges"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ranges = sorted(tuple(e["m_range"]) for e in json.loads(out.read_text())["entries"] if "m_range" in e)
    assert ranges == [(1, 4), (16, 48)]
    table = TunedTable.load(out)
    served = {m for m in range(1, 129) if table.lookup("f16", "row,row,row", m, 64, 64) is not None}
    assert served == {1, 2, 3, 4} | set(range(16, 49)) | {64, 96}


def _table(*args):
    """`l2c table` with these arguments, in a subprocess."""
    return subprocess.run([sys.executable, "-m", "l2c", "table", *map(str, args)], capture_output=True, text=True)


def _base_table(tmp_path, base_rows, new_rows):
    """base.jsonl and new.jsonl written from the rows, base.json made from base.jsonl: (base.json, merged.json)."""
    for name, rows in (("base", base_rows), ("new", new_rows)):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    base, out = tmp_path / "base.json", tmp_path / "merged.json"
    assert _table(tmp_path / "base.jsonl", "-o", base).returncode == 0
    return base, out


def test_only_faster_adds_a_new_entry_only_where_it_beats_what_serves_its_shape(tmp_path):
    """--into with --only-faster 1.03: a new kernel family displaces an entry only where it is faster by the ratio;
    a shape the table does not serve takes the new entry; without --into the flag is refused (exit 2)."""
    base_rows = [{"type": "env", "gpu": "NVIDIA H200"}, row("a", 128, 1.20), row("b", 256, 1.30)]
    new_rows = [{"type": "env", "gpu": "NVIDIA H200"}, row("c", 128, 1.22), row("d", 256, 1.40), row("e", 512, 1.10)]
    base, out = _base_table(tmp_path, base_rows, new_rows)
    done = _table(tmp_path / "new.jsonl", "-o", out, "--into", base, "--only-faster", "1.03")
    assert done.returncode == 0, done.stderr
    got = sorted((e["m"], e["spec"].split()[1]) for e in json.loads(out.read_text())["entries"])
    assert got == [(128, "a"), (256, "d"), (512, "e")]   # 1.22 < 1.20 x 1.03: "a" stays
    refused = _table(tmp_path / "new.jsonl", "-o", out, "--only-faster", "1.03")
    assert refused.returncode == 2 and "--into" in refused.stderr and "Traceback" not in refused.stderr


def test_into_adds_new_entries_to_a_table_replacing_those_of_the_same_problem(tmp_path):
    """--into: a shipped table gains a new set of shapes; an entry of a problem the new results cover is replaced,
    the others are kept, and a table of another protocol or GPU is refused (exit 2, no traceback)."""
    base_rows = [{"type": "env", "gpu": "NVIDIA H200"}, row("a", 128, 1.20), row("b", 256, 1.30)]
    new_rows = [{"type": "env", "gpu": "NVIDIA H200"}, row("c", 256, 1.40), row("d", 512, 1.10),
                dict(row("e", 256, 1.25), gate="silu")]
    base, out = _base_table(tmp_path, base_rows, new_rows)
    done = _table(tmp_path / "new.jsonl", "-o", out, "--into", base)
    assert done.returncode == 0, done.stderr
    merged = json.loads(out.read_text())
    got = sorted((e["m"], e.get("gate", "none"), e["spec"].split()[1]) for e in merged["entries"])
    assert got == [(128, "none", "a"), (256, "none", "c"), (256, "silu", "e"), (512, "none", "d")]
    assert merged["sources"] == [str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl")]
    assert TunedTable.load(out).lookup("f16", "row,row,row", 256, 64, 64).speedup == 1.40
    call = dict(json.loads(base.read_text()), protocol="call")
    base.write_text(json.dumps(call))
    refused = _table(tmp_path / "new.jsonl", "-o", out, "--into", base)
    assert refused.returncode == 2 and "call protocol" in refused.stderr and "Traceback" not in refused.stderr


def test_ranges_with_confirmed_by_keep_the_ranges_of_specs_that_won_again(tmp_path):
    """--ranges with --confirmed-by: a range's spec must have won again wherever the later results measured it (the
    bench of a candidate table measures a range at one M); a spec that lost again makes no range, and the M where
    only an unconfirmed spec won still counts as measured, so no range crosses it."""
    g = KernelSpec(name="g", tile_m=16, problem_m="any").to_l2()
    h = KernelSpec(name="h", tile_m=32, problem_m="any").to_l2()
    first = [{"type": "env", "gpu": "NVIDIA H200"}]
    first += [row("g", m, 1.2, spec=g) for m in (1, 2, 4, 16, 32, 64)] + [row("h", 8, 1.3, spec=h)]
    first += [row("h", m, 1.25, spec=h) for m in (128, 256, 512)]
    again = [{"type": "env", "gpu": "NVIDIA H200"}, row("g", 2, 1.1, spec=g), row("g", 32, 1.15, spec=g),
             row("h", 256, 0.98, spec=h)]
    paths = [tmp_path / "first.jsonl", tmp_path / "again.jsonl"]
    for path, rows in zip(paths, (first, again)):
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "t.json"
    done = subprocess.run([sys.executable, "-m", "l2c", "table", str(paths[0]), "-o", str(out), "--ranges",
                           "--confirmed-by", str(paths[1])], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ranges = sorted(tuple(e["m_range"]) for e in json.loads(out.read_text())["entries"] if "m_range" in e)
    assert ranges == [(1, 4), (16, 64)]       # g's runs either side of M = 8 (h's, unconfirmed); h lost again


def _table_command(tmp_path, rows, *args):
    """`l2c table` over `rows` (after an H200 env row) into tmp_path/t.json: the finished process."""
    results = tmp_path / "r.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in [{"type": "env", "gpu": "NVIDIA H200"}] + rows) + "\n")
    return subprocess.run([sys.executable, "-m", "l2c", "table", str(results), "-o", str(tmp_path / "t.json"), *args],
                          capture_output=True, text=True)


def _table_run(tmp_path, rows, *args):
    done = _table_command(tmp_path, rows, *args)
    assert done.returncode == 0, done.stderr
    return json.loads((tmp_path / "t.json").read_text())


def test_two_protocols_admit_a_kernel_only_where_it_is_slower_in_neither(tmp_path):
    """--protocol kernel,call: a win by the margin in one protocol and no loss in the other; no evidence in one of
    them is no entry (a kernel measured only back to back says nothing of what an eager call costs)."""
    rows = [row("both", 64, 1.10), row("both", 64, 1.01, protocol="call"),          # kept: kernel win, call >= 1
            row("eager", 128, 1.00, protocol="kernel"), row("eager", 128, 1.08, protocol="call"),   # kept
            row("device", 256, 1.12), row("device", 256, 0.93, protocol="call"),    # loses in call
            row("tie", 512, 1.02), row("tie", 512, 1.01, protocol="call"),          # no margin anywhere
            row("half", 1024, 1.20),                                                  # no call rows at all
            row("twice", 2048, 1.10), row("twice", 2048, 1.02, protocol="call"),
            row("twice", 2048, 0.98, protocol="call")]                              # its worst call row loses
    table = _table_run(tmp_path, rows, "--protocol", "kernel,call", "--min-speedup", "1.05")
    got = {e["m"]: e for e in table["entries"]}
    assert set(got) == {64, 128}
    assert got[64]["speedups"] == {"kernel": 1.1, "call": 1.01} and got[64]["speedup"] == 1.1
    assert got[128]["speedups"] == {"kernel": 1.0, "call": 1.08}
    assert table["protocol"] == "kernel,call"


_APART_FIGURES = st.dictionaries(st.sampled_from("abc"),
                                 st.tuples(st.floats(0.9, 1.3, allow_nan=False),
                                           st.none() | st.just("error") | st.floats(0.9, 1.3, allow_nan=False)),
                                 max_size=3)


@settings(max_examples=80, deadline=None)
@given(st.tuples(_APART_FIGURES, _APART_FIGURES), st.sampled_from(["kernel", "kernel,call"]), st.booleans())
def test_a_kernel_counts_at_the_worse_of_back_to_back_and_apart(figures, protocol, torch_apart):
    """Rows in kernel_apart count as kernel rows: a kernel counts at the worse of its two figures. At a shape where
    some kernel has a verified apart row, a kernel with none there wins nothing, so that leaving a kernel unmeasured
    apart never favours it; where none has, the back-to-back figure decides as before. Shape by shape, in one
    protocol or two (a failed row loses in two; alone, the kernel protocol skips it)."""
    import tempfile
    from pathlib import Path
    rows, expected = [], {}
    for m, at_m in zip((64, 128), figures):
        for kernel, (back_to_back, apart) in at_m.items():
            rows.append(row(kernel, m, back_to_back))
            rows.append(row(kernel, m, 1.0, protocol="call"))   # no margin: the kernel figure must carry it
            if apart == "error":
                rows.append(row(kernel, m, None, status="error", protocol="kernel_apart"))
            elif apart is not None:
                rows.append(row(kernel, m, apart, protocol="kernel_apart"))
        if torch_apart:   # torch measured apart: not a kernel's apart figure
            rows.append(row("torch", m, 1.0, protocol="kernel_apart"))
        measured_apart = any(isinstance(apart, float) for _, apart in at_m.values())
        worth = {}
        for kernel, (back_to_back, apart) in at_m.items():
            if isinstance(apart, float):
                worth[kernel] = min(back_to_back, apart)
            elif not measured_apart and not (apart == "error" and protocol == "kernel,call"):
                worth[kernel] = back_to_back
        eligible = [v for v in worth.values() if v >= 1.05]
        expected[m] = (max(eligible), {k for k, v in worth.items() if v == max(eligible)}) if eligible else None
    with tempfile.TemporaryDirectory() as tmp:
        table = _table_run(Path(tmp), rows, "--protocol", protocol, "--min-speedup", "1.05")
    got = {e["m"]: (e["speedup"], e["spec"].split()[1]) for e in table["entries"]}
    assert set(got) == {m for m, want in expected.items() if want is not None}
    for m, (speedup, kernel) in got.items():
        assert speedup == expected[m][0] and kernel in expected[m][1]


def test_kernel_apart_is_not_a_table_protocol_of_its_own(tmp_path):
    done = _table_command(tmp_path, [row("a", 64, 1.2, protocol="kernel_apart")], "--protocol", "kernel_apart")
    assert done.returncode == 2 and "count as kernel rows" in done.stderr and "Traceback" not in done.stderr


def test_a_range_under_two_protocols_holds_only_ms_won_in_the_first(tmp_path):
    """With --protocol kernel,call a range's figures are the first protocol's: an M that tied in device time (1.0)
    and won only the eager call ends a run rather than joining it with a worst of 1.0, which the dispatcher would
    refuse to load (a range serves only where it won)."""
    generic = KernelSpec(name="g", tile_m=16, problem_m="any").to_l2()
    kernel = {1: 1.10, 2: 1.08, 4: 1.00, 8: 1.06, 16: 1.07, 32: 1.09}
    rows = [{"type": "env", "gpu": "NVIDIA H200"}]
    rows += [row("g", m, s, spec=generic) for m, s in kernel.items()]
    rows += [row("g", m, 1.2, protocol="call", spec=generic) for m in kernel]
    table = _table_run(tmp_path, rows, "--protocol", "kernel,call", "--min-speedup", "1.03", "--ranges")
    ranges = [(tuple(e["m_range"]), e["range_min_speedup"]) for e in table["entries"] if "m_range" in e]
    assert ranges == [((8, 32), 1.06)]
    loaded = TunedTable.load(tmp_path / "t.json")
    assert loaded.skipped == 0 and loaded.lookup("f16", "row,row,row", 3, 64, 64) is None


def test_rows_of_what_users_call_count_for_the_entry_that_served_them(tmp_path):
    """`l2c bench dispatch:TABLE` rows carry no spec: each is evidence for TABLE's entry at that shape (its spec
    and target); a row torch served is no candidate."""
    spec = KernelSpec(name="served", target="cutlass", tile_m=128).to_l2()
    served = tmp_path / "served.json"
    served.write_text(json.dumps({"format": 1, "arch": "sm_90", "gpu": "NVIDIA H200", "protocol": "kernel", "entries": [
        {"m": 64, "n": 64, "k": 64, "batch": 1, "dtype": "f16", "layout": "row,row,row", "target": "cutlass",
         "spec": spec, "tflops": 1.2, "baseline_tflops": 1.0}]}))

    def user_row(m, speedup, protocol, served_by):
        return dict(row("dispatch", m, speedup, protocol=protocol), kernel=f"dispatch:{served}", name="user_call",
                    source=str(served), target="dispatch", served_by=served_by, spec=None)

    rows = [user_row(64, 1.09, "kernel", "cutlass_served"), user_row(64, 1.02, "call", "cutlass_served"),
            user_row(128, 1.30, "kernel", "torch"), user_row(128, 1.30, "call", "torch")]
    for r in rows:
        r.pop("spec")
    table = _table_run(tmp_path, rows, "--protocol", "kernel,call")
    assert [(e["m"], e["target"], e["spec"]) for e in table["entries"]] == [(64, "cutlass", spec)]
    # a row that recorded the serving entry's spec (`served_spec`, as l2c bench writes them) needs no table file
    other = KernelSpec(name="recorded", target="triton", tile_m=32).to_l2()
    recorded = [dict(r, m=96, served_spec=other, served_target="triton", source="gone.json") for r in rows[:2]]
    table = _table_run(tmp_path, recorded, "--protocol", "kernel,call")
    assert [(e["m"], e["target"], e["spec"]) for e in table["entries"]] == [(96, "triton", other)]
    # a row a kernel served, with neither its spec recorded nor its table there, is refused, never counted as torch
    lost = [dict(r, source=str(tmp_path / "gone.json")) for r in rows[:2]]
    refused = _table_command(tmp_path, lost, "--protocol", "kernel,call")
    assert refused.returncode == 2 and "gone.json" in refused.stderr and "Traceback" not in refused.stderr


def _at(kernel, m, n, k, speedup, spec):
    return dict(row(kernel, m, speedup, spec=spec), n=n, k=k)


_CELL_POINTS = st.dictionaries(st.tuples(st.sampled_from("gh"), st.sampled_from([16, 32, 64]),
                                         st.sampled_from([64, 128, 256]), st.sampled_from([64, 128])),
                               st.floats(0.8, 1.3, allow_nan=False), min_size=1, max_size=36)


@settings(max_examples=80, deadline=None)
@given(_CELL_POINTS)
def test_cells_are_boxes_whose_every_corner_one_kernel_won(points):
    """--cells: a cell's eight corners are measured wins of its kernel by the margin, its sides join consecutive
    values at which that kernel was measured, its figure is the worst corner's; and every such box is a cell (of
    that kernel or of one with a better worst corner)."""
    from l2c.commands.table import cell_rows
    specs = {name: KernelSpec(name=name, tile_m=16 if name == "g" else 32, tile_n=16).to_l2() for name in "gh"}
    rows = [_at(name, m, n, k, s, specs[name]) for (name, m, n, k), s in points.items()]
    cells = {(ms, ns, ks): worst for worst, ms, ns, ks in cell_rows(rows, "kernel", 1.05, 132)}
    for name, spec in specs.items():
        measured = {(m, n, k): s for (p, m, n, k), s in points.items() if p == name}
        axes = [sorted({at[i] for at in measured}) for i in range(3)]
        for sides in itertools.product(*(list(zip(a, a[1:])) for a in axes)):
            corners = [measured.get(c) for c in itertools.product(*sides)]
            if all(s is not None and s >= 1.05 for s in corners):
                assert cells[sides]["speedup"] >= min(corners)
    for sides, worst in cells.items():
        measured = {(m, n, k): s for (p, m, n, k), s in points.items() if specs[p] == worst["spec"]}
        corners = [measured[c] for c in itertools.product(*sides)]
        assert min(corners) >= 1.05 and worst["speedup"] == min(corners)
        for axis, (lo, hi) in enumerate(sides):
            assert lo < hi and not any(lo < at[axis] < hi for at in measured)


def test_cells_serve_the_shapes_inside_their_box_and_merge_by_box(tmp_path):
    """`l2c table --cells` writes a box one kernel won at every corner; the dispatcher serves a shape inside it
    and nothing past a side; `--into` keeps cells of other boxes and replaces the same box."""
    spec = KernelSpec(name="g", tile_m=16, tile_n=16).to_l2()
    fixed_n = KernelSpec(name="f", tile_m=16, tile_n=16, problem_n=64).to_l2()   # not generic in N: no cell
    wide = KernelSpec(name="w", tile_m=16, tile_n=32).to_l2()     # wider than MAX_CELL_TILE_N: no cell
    corners = list(itertools.product((16, 32), (64, 128), (64, 128)))
    rows = [_at("g", m, n, k, 1.2, spec) for m, n, k in corners]
    rows += [_at("w", m, n, k, 1.5, wide) for m, n, k in corners]
    rows += [_at("f", m, 64, k, 1.5, fixed_n) for m in (16, 32) for k in (64, 128)]
    data = _table_run(tmp_path, rows, "--cells")
    cells = [e for e in data["entries"] if "n_range" in e]
    assert [(e["m_range"], e["n_range"], e["k_range"]) for e in cells] == [([16, 32], [64, 128], [64, 128])]
    table = TunedTable.load(tmp_path / "t.json")
    assert table.lookup("f16", "row,row,row", 20, 100, 72).spec_text == spec
    for m, n, k in ((15, 100, 72), (20, 129, 72), (20, 100, 130)):
        assert table.lookup("f16", "row,row,row", m, n, k) is None
    base = tmp_path / "base.json"
    (tmp_path / "t.json").rename(base)
    data = _table_run(tmp_path, [_at("g", m, n, k, 1.3, spec) for m, n, k in corners], "--cells", "--into", str(base))
    assert sum(1 for e in data["entries"] if "n_range" in e) == 1   # the same box: replaced


def test_wide_kernels_make_cells_only_from_32_tiles_along_n_and_k_1024_in_one_wave(tmp_path):
    """A kernel wider than MAX_CELL_TILE_N pads a ragged N, steps in time where its tiles cross a wave over the SMs
    and ties torch at short K; its cell needs N >= WIDE_CELL_MIN_TILES tiles, K >= WIDE_CELL_MIN_K and one wave
    count across the box: a 64-wide kernel won at every corner makes the box of N = 2048-4096 (32-64 tiles) and
    K = 1024-2048, not N = 1024-2048 (16 tiles at N = 1024), nor 4096-16384 (64 tiles, one wave on the H200's 132
    SMs, to 256, two), nor K = 512-1024."""
    from l2c.commands.table import WIDE_CELL_MIN_K, WIDE_CELL_MIN_TILES
    wide = KernelSpec(name="w", tile_m=16, tile_n=64).to_l2()
    assert WIDE_CELL_MIN_TILES * 64 == 2048 and WIDE_CELL_MIN_K == 1024
    corners = list(itertools.product((1, 8), (1024, 2048, 4096, 16384), (512, 1024, 2048)))
    data = _table_run(tmp_path, [_at("w", m, n, k, 1.2, wide) for m, n, k in corners], "--cells")
    cells = [(e["m_range"], e["n_range"], e["k_range"]) for e in data["entries"] if "n_range" in e]
    assert cells == [([1, 8], [2048, 4096], [1024, 2048])]
    table = TunedTable.load(tmp_path / "t.json")
    assert table.lookup("f16", "row,row,row", 3, 3000, 1500).spec_text == wide
    for n, k in ((1500, 1500), (5000, 1500), (3000, 800)):
        assert table.lookup("f16", "row,row,row", 3, n, k) is None


_WIDE_TILINGS = st.sampled_from([(8, 64, 1), (16, 64, 1), (8, 64, 4), (64, 32, 1), (128, 128, 2)])


@st.composite
def _wide_boxes(draw):
    """A wide kernel's tiling and a box near the floors: N from 24-40 tiles, K around 1024, M over one or two
    tiles, N up to 120 tiles wide (one wave or two)."""
    tiling = draw(_WIDE_TILINGS)
    tile_m, tile_n, _ = tiling
    m_lo = draw(st.integers(1, tile_m))
    n_lo = tile_n * draw(st.integers(24, 40)) + draw(st.sampled_from([0, 0, 8]))
    k_lo = draw(st.sampled_from([512, 1016, 1024, 1032, 2048]))
    ms = (m_lo, m_lo + draw(st.integers(1, tile_m)))
    ns = (n_lo, n_lo + tile_n * draw(st.integers(1, 120)))
    ks = (k_lo, 2 * k_lo)
    inside = (draw(st.integers(*ms)), draw(st.integers(*ns)))
    return tiling, ms, ns, ks, inside


@settings(max_examples=300, deadline=None)
@given(_wide_boxes())
def test_a_wide_cell_fits_exactly_where_its_box_holds_one_wave_count_32_tiles_along_n_and_k_from_1024(box):
    """cell_fits for a kernel wider than MAX_CELL_TILE_N: a box it accepts launches the same number of waves of
    tiles over 132 SMs at every shape inside (a drawn one and the far corners), with N >= WIDE_CELL_MIN_TILES tiles
    and K >= WIDE_CELL_MIN_K; a box it refuses breaks one of these."""
    from l2c.commands.table import WIDE_CELL_MIN_K, WIDE_CELL_MIN_TILES, cell_fits
    tiling, ms, ns, ks, (m, n) = box
    tile_m, tile_n, slices = tiling
    spec = KernelSpec(name="w", tile_m=tile_m, tile_n=tile_n, split_k_slices=slices).to_l2()

    def waves(m, n):
        return math.ceil(math.ceil(m / tile_m) * math.ceil(n / tile_n) * slices / 132)
    floors = ns[0] >= WIDE_CELL_MIN_TILES * tile_n and ks[0] >= WIDE_CELL_MIN_K
    if cell_fits(spec, ms, ns, ks, 132):
        assert floors and waves(m, n) == waves(ms[0], ns[0]) == waves(ms[1], ns[1])
    else:
        assert not floors or waves(ms[0], ns[0]) != waves(ms[1], ns[1])


def test_cell_rows_count_waves_over_the_sm_count_they_are_given():
    """The same corners make a 64-wide kernel's box of N = 2048-8192 (32-128 tiles) on 132 SMs, one wave, and not
    on 114, where N = 8192 is two."""
    from l2c.commands.table import cell_rows
    wide = KernelSpec(name="w", tile_m=16, tile_n=64).to_l2()
    rows = [_at("w", m, n, k, 1.2, wide) for m, n, k in itertools.product((1, 8), (2048, 8192), (1024, 2048))]
    assert [sides for _, *sides in cell_rows(rows, "kernel", 1.05, 132)] == [[(1, 8), (2048, 8192), (1024, 2048)]]
    assert cell_rows(rows, "kernel", 1.05, 114) == []


def test_cell_inside_draws_shapes_the_wide_cells_serve(tmp_path):
    """scripts/cell_inside.py: every shape it draws lies inside a cell of a kernel wider than 16 along N, off the
    corners, with N and K multiples of 8, and that cell's kernel serves it; narrow cells are not drawn from; the
    draw is fixed by its seed."""
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "scripts" / "cell_inside.py"
    wide = KernelSpec(name="w", tile_m=16, tile_n=64).to_l2()
    narrow = KernelSpec(name="g", tile_m=16, tile_n=16).to_l2()
    rows = [_at("w", m, n, k, 1.2, wide) for m, n, k in itertools.product((1, 8), (2048, 4096), (1024, 2048))]
    rows += [_at("g", m, n, k, 1.2, narrow) for m, n, k in itertools.product((16, 32), (64, 128), (64, 128))]
    _table_run(tmp_path, rows, "--cells")
    out = tmp_path / "inside.txt"
    args = [sys.executable, str(script), str(tmp_path / "t.json"), str(out), "--count", "25"]
    draws = []
    for _ in range(2):
        done = subprocess.run(args, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        draws.append(out.read_text())
    drawn = draws[0]
    assert draws[1] == drawn
    shapes = [tuple(map(int, line.split())) for line in drawn.splitlines() if not line.startswith("#")]
    assert len(shapes) == 25
    table = TunedTable.load(tmp_path / "t.json")
    for m, n, k in shapes:
        assert n % 8 == 0 and k % 8 == 0 and 1 <= m <= 8 and 2048 <= n <= 4096 and 1024 <= k <= 2048
        assert not (m in (1, 8) and n in (2048, 4096) and k in (1024, 2048))
        assert table.lookup("f16", "row,row,row", m, n, k).spec_text == wide


def test_cells_refuse_results_of_different_sm_counts(tmp_path):
    """Waves are counted over one SM count: results whose env rows report two are refused with a message, exit 2."""
    wide = KernelSpec(name="w", tile_m=16, tile_n=64).to_l2()
    results = tmp_path / "r.jsonl"
    rows = [{"type": "env", "gpu": "NVIDIA H200", "sm_count": count} for count in (132, 114)]
    rows += [_at("w", m, n, k, 1.2, wide) for m, n, k in itertools.product((1, 8), (2048, 4096), (1024, 2048))]
    results.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    done = subprocess.run([sys.executable, "-m", "l2c", "table", str(results), "-o", str(tmp_path / "t.json"),
                           "--cells"], capture_output=True, text=True)
    assert done.returncode == 2 and "different SM counts" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("name", ["sm_90.json", "sm_90.nvidia-h100-80gb-hbm3.json"])
def test_the_default_tables_are_what_l2c_table_makes_of_their_recorded_sources(tmp_path, name):
    """Each GPU's shipped default table is reproducible: `l2c table` over the committed results it names in
    `sources`, with its protocol and margin, token-count ranges, cells and the neighbourhood cells of its `near`
    points, writes the same entries. A results file added to (or left out of) the README's command, or a change to
    the rules of `l2c table`, shows here first."""
    from pathlib import Path
    repo = Path(__file__).resolve().parent.parent
    shipped = json.loads((repo / "l2c" / "tuned" / name).read_text())
    assert shipped["sources"] and not shipped["confirmed_by"]
    out = tmp_path / "remade.json"
    near = ["--near", *shipped["near"]] if shipped.get("near") else []
    done = subprocess.run([sys.executable, "-m", "l2c", "table", *shipped["sources"], "--protocol",
                           shipped["protocol"], "--min-speedup", str(shipped["min_speedup"]), "--ranges", "--cells",
                           *near, "-o", str(out)], capture_output=True, text=True, cwd=repo)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["entries"] == shipped["entries"]


_NEAR_POINTS = st.lists(st.tuples(st.integers(1, 24), st.integers(8, 20), st.integers(8, 20),
                                  st.sampled_from(["g", "g", "g", "h", "torch"]), st.floats(1.01, 1.4)),
                        min_size=3, max_size=60, unique_by=lambda p: p[:3])


@settings(max_examples=120, deadline=None)
@given(_NEAR_POINTS)
def test_a_neighbourhood_cell_lies_between_wins_of_its_kernel_and_near_no_loss(points):
    """--near: every box served holds, among the NEAR_COUNT measured shapes nearest its centre (within NEAR_RADIUS
    octaves), at least NEAR_SUPPORT, none of them a shape every kernel lost, two in three or more won by the box's
    kernel, and wins of that kernel on both sides of the box along M, N and K; its figure is the worst of those
    wins."""
    from l2c.commands import table as T
    specs = {name: KernelSpec(name=name, tile_m=16 if name == "g" else 32, tile_n=16).to_l2() for name in "gh"}
    rows, won_by = [], {}
    for m, n8, k8, who, speedup in points:
        at = (m, 8 * n8, 8 * k8)
        rows.append(_at(who, *at, 1.0 if who == "torch" else speedup, specs.get(who)))
        won_by[at] = 0.0 if who == "torch" else speedup
    for worst, ms, ns, ks in T.near_boxes(rows, ["kernel"], 1.05):
        centre = [(math.log2(lo) + math.log2(hi)) / 2 for lo, hi in (ms, ns, ks)]
        shapes = sorted((sum((math.log2(x) - c) ** 2 for x, c in zip((m, 8 * n8, 8 * k8), centre)), i,
                         (m, 8 * n8, 8 * k8), who) for i, (m, n8, k8, who, _) in enumerate(points))
        near = [(at, who) for d2, _, at, who in shapes[:T.NEAR_COUNT] if d2 <= T.NEAR_RADIUS ** 2]
        assert len(near) >= T.NEAR_SUPPORT and all(who != "torch" for _, who in near)
        assert all(won_by[at] >= 1.05 for at, _ in near)     # a win by the margin, never a tie
        won = [at for at, who in near if specs[who] == worst["spec"]]
        assert len(won) >= T.NEAR_SUPPORT and 3 * len(won) >= 2 * len(near)
        for axis, (lo, hi) in enumerate((ms, ns, ks)):
            assert min(at[axis] for at in won) <= lo and max(at[axis] for at in won) >= hi
        assert worst["speedup"] == min(r["speedup"] for r in rows if r["spec"] == worst["spec"]
                                       and (r["m"], r["n"], r["k"]) in won)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 24), st.integers(8, 20), st.integers(8, 20)), min_size=3, max_size=40,
                unique=True))
def test_where_one_kernel_won_every_point_each_box_between_its_wins_is_served(points):
    """--near, the other way round: with every measured shape won by one kernel, each lattice box that lies between
    its wins along M, N and K and has at least NEAR_SUPPORT of its NEAR_COUNT nearest within NEAR_RADIUS is a
    cell."""
    from l2c.commands import table as T
    spec = KernelSpec(name="g", tile_m=16, tile_n=16).to_l2()
    shapes = [(m, 8 * n8, 8 * k8) for m, n8, k8 in points]
    boxes = {tuple(sides) for _, *sides in T.near_boxes([_at("g", *at, 1.2, spec) for at in shapes], ["kernel"], 1.05)}
    for sides in itertools.product(zip(T.NEAR_M_EDGES, T.NEAR_M_EDGES[1:]), zip(T.NEAR_NK_EDGES, T.NEAR_NK_EDGES[1:]),
                                   zip(T.NEAR_NK_EDGES, T.NEAR_NK_EDGES[1:])):
        if sides[0][1] > 32 or sides[1][1] > 256 or sides[2][1] > 256:
            continue
        centre = [(math.log2(lo) + math.log2(hi)) / 2 for lo, hi in sides]
        ranked = sorted((sum((math.log2(x) - c) ** 2 for x, c in zip(at, centre)), at) for at in shapes)
        if len(ranked) > T.NEAR_COUNT and ranked[T.NEAR_COUNT][0] == ranked[T.NEAR_COUNT - 1][0]:
            continue   # a tie at the cut: which shapes are nearest is the implementation's choice
        near = [at for d2, at in ranked[:T.NEAR_COUNT] if d2 <= T.NEAR_RADIUS ** 2]
        if len(near) < T.NEAR_SUPPORT or len(near) < min(len(ranked), T.NEAR_COUNT):
            continue   # this check asks no more than: every one of the nearest within the radius
        if all(min(at[i] for at in near) <= lo and max(at[i] for at in near) >= hi for i, (lo, hi) in enumerate(sides)):
            assert sides in boxes


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16]),
       st.lists(st.tuples(st.integers(1, 24), st.integers(8, 20), st.integers(8, 20)), min_size=3, max_size=40,
                unique=True))
def test_a_gemv_kernels_box_never_spans_a_second_pass_over_the_weight(tile_m, points):
    """--near with a gemv-family kernel (each block owns tile m rows of A and streams its whole slab of B): however
    many points it won, no box of it holds two Ms that take a different number of row tiles, since the second
    reads the weight again where cuBLAS reads it once (a one-row gemv's box over M = 1-2 held 2 x 832 x 3872 at
    0.80 on the H100's points); between such steps its boxes are served as any kernel's."""
    from l2c.commands import table as T
    spec = KernelSpec(name="v", target="cutlass", tile_m=tile_m, tile_n=8, tile_k=256, launch_family="gemv",
                      layout_b="col").to_l2()
    shapes = [(m, 8 * n8, 8 * k8) for m, n8, k8 in points]
    gemv = {tuple(sides) for _, *sides in T.near_boxes([_at("v", *at, 1.2, spec) for at in shapes], ["kernel"], 1.05)}
    assert all(-(-ms[0] // tile_m) == -(-ms[1] // tile_m) for ms, _, _ in gemv)
    # the same points won by a kernel with no such step (a tensor-core tile as wide as the whole M range) give the
    # same boxes where the gemv takes one number of row tiles
    wide = KernelSpec(name="g", tile_m=256, tile_n=16).to_l2()
    others = {tuple(sides) for _, *sides in T.near_boxes([_at("g", *at, 1.2, wide) for at in shapes], ["kernel"], 1.05)}
    assert gemv == {sides for sides in others if -(-sides[0][0] // tile_m) == -(-sides[0][1] // tile_m)}


_BOXES = st.lists(st.tuples(st.sampled_from("gh"), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
                  max_size=30, unique=True)


@settings(max_examples=100, deadline=None)
@given(_BOXES)
def test_joined_neighbourhood_boxes_serve_the_same_shapes_with_the_same_kernel(boxes):
    """_merged_boxes joins touching boxes of one kernel: every shape a box held is held by one joined box of the
    same kernel, and a joined box holds no shape that no box of its kernel held."""
    from l2c.commands.table import _merged_boxes
    edges = [1, 2, 4, 8, 16]
    cells = [({"spec": name, "speedup": 1.1 + i / 100, "m": 1, "n": 1, "k": 1, "batch": 1, "dtype": "f16",
               "layout": "row,row,row"}, *((edges[a], edges[a + 1]) for a in at))
             for i, (name, *at) in enumerate(boxes)]
    joined = _merged_boxes(cells)

    def holders(group, x):
        return {c[0]["spec"] for c in group if all(lo <= v <= hi for v, (lo, hi) in zip(x, c[1:]))}
    for x in itertools.product(range(1, 17), repeat=3):
        assert holders(cells, x) == holders(joined, x)
    assert len(joined) <= len(cells)


def test_near_points_make_neighbourhood_cells_and_no_other_entry(tmp_path):
    """`l2c table R --near P`: P's shapes make neighbourhood cells (marked `near`) the dispatcher serves, and no exact
    entry, range or corner cell; the table records P under `near` (and not under `sources`); a corner cell serves
    before a neighbourhood cell that overlaps it."""
    from l2c.commands.table import NEAR_LATTICES
    spec = KernelSpec(name="g", tile_m=16, tile_n=16).to_l2()
    points = [_at("g", m, n, k, 1.2, spec) for m in (4, 8, 16) for n in (128, 256, 512) for k in (128, 256, 512)]
    near = tmp_path / "points.jsonl"
    near.write_text("\n".join(json.dumps(r) for r in [{"type": "env", "gpu": "NVIDIA H200"}] + points) + "\n")
    other = KernelSpec(name="c", tile_m=32, tile_n=8).to_l2()
    corners = [_at("c", m, n, k, 1.1, other) for m in (8, 16) for n in (256, 512) for k in (256, 512)]
    sources = [_at("g", 1, 64, 64, 1.2, spec)] + corners
    without = _table_run(tmp_path, sources, "--ranges", "--cells")["entries"]
    data = _table_run(tmp_path, sources, "--near", str(near), "--ranges", "--cells")
    assert data["near"] == [str(near)] and str(near) not in data["sources"]
    near_cells = [e for e in data["entries"] if e.get("near")]
    assert near_cells and all(any(e["m_range"][0] in m_edges and e["n_range"][0] in nk_edges and e["k_range"][0]
                                  in nk_edges for m_edges, nk_edges in NEAR_LATTICES) and e["spec"] == spec
                              for e in near_cells)
    shifted = NEAR_LATTICES[1][1]
    assert any(e["n_range"][0] in shifted and e["n_range"][0] not in NEAR_LATTICES[0][1] for e in near_cells)
    assert [e for e in data["entries"] if not e.get("near")] == without   # the points made no other entry
    assert any("n_range" in e for e in without)
    table = TunedTable.load(tmp_path / "t.json")
    assert table.lookup("f16", "row,row,row", 5, 300, 200).spec_text == spec
    assert table.lookup("f16", "row,row,row", 10, 300, 300).spec_text == other   # the corner cell first
    assert table.lookup("f16", "row,row,row", 40, 300, 200) is None   # past the wins along M


@pytest.mark.parametrize("how", ["served", "timed", "neither"])
def test_a_corner_cell_holding_a_point_where_its_kernel_lost_is_dropped(tmp_path, how):
    """--cells with --near: a corner cell whose box holds a measured point where its kernel was slower than torch in
    device time (it served the point, or online tuning timed it there) is no entry; a loss elsewhere leaves it."""
    spec = KernelSpec(name="c", tile_m=32, tile_n=8).to_l2()
    corners = [_at("c", m, n, k, 1.1, spec) for m in (8, 16) for n in (256, 512) for k in (256, 512)]
    other = KernelSpec(name="o", tile_m=16, tile_n=16).to_l2()
    at = (12, 300, 300) if how != "neither" else (40, 300, 300)
    point = (_at("c", *at, 0.95, spec) if how == "served" else
             dict(_at("o", *at, 1.2, other), online_timings={spec: 0.97}) if how == "timed" else
             _at("c", *at, 0.9, spec))
    near = tmp_path / "points.jsonl"
    near.write_text("\n".join(json.dumps(r) for r in [{"type": "env", "gpu": "NVIDIA H200"}, point]) + "\n")
    data = _table_run(tmp_path, corners, "--near", str(near), "--cells")
    cells = [e for e in data["entries"] if "n_range" in e and not e.get("near")]
    assert bool(cells) == (how == "neither")


def test_a_box_whose_best_kernel_lost_inside_goes_to_the_next_kernel_that_won_its_corners(tmp_path):
    """--cells: where the kernel with the best worst corner lost at a point inside the box, the box is the cell of
    another kernel that won all its corners and lost nowhere inside, if there is one."""
    best = KernelSpec(name="c", tile_m=32, tile_n=8).to_l2()
    next_ = KernelSpec(name="d", tile_m=16, tile_n=8).to_l2()
    corners = [_at(name, m, n, k, speedup, spec) for name, spec, speedup in (("c", best, 1.3), ("d", next_, 1.1))
               for m in (8, 16) for n in (256, 512) for k in (256, 512)]
    near = tmp_path / "points.jsonl"
    near.write_text("\n".join(json.dumps(r) for r in [{"type": "env", "gpu": "NVIDIA H200"},
                                                      _at("c", 12, 300, 300, 0.95, best)]) + "\n")
    assert {e["spec"] for e in _table_run(tmp_path, corners, "--cells")["entries"] if "n_range" in e} == {best}
    cells = [e for e in _table_run(tmp_path, corners, "--near", str(near), "--cells")["entries"]
             if "n_range" in e and not e.get("near")]
    assert [e["spec"] for e in cells] == [next_] and cells[0]["range_min_speedup"] == 1.1


def test_near_points_count_a_failed_shape_as_lost_and_a_tie_or_a_candidate_online_choice_passed_over_as_no_win():
    """measured_points: a shape where a kernel failed a row, or torch served one that records no online timings (no
    entry, or a measured kernel that declined), holds no kernel; a kernel holds a shape only where every row of it
    there won by the margin, and online choice neither timed it there below its margin nor timed it and left the
    shape to torch (in any protocol's row); online choice's torch says nothing of kernels it did not time."""
    from l2c.commands.table import measured_points
    spec = KernelSpec(name="g", tile_m=16, tile_n=16).to_l2()
    other = KernelSpec(name="o", tile_m=16, tile_n=32).to_l2()
    rows = [_at("g", 1, 64, 64, 1.2, spec),
            _at("g", 2, 64, 64, 1.2, spec), dict(_at("torch", 2, 64, 64, 1.0, spec), online_timings={spec: 1.1}),
            _at("g", 3, 64, 64, 1.2, spec), dict(_at("g", 3, 64, 64, 1.2, spec), status="verify_failed"),
            _at("g", 4, 64, 64, 1.2, spec), _at("g", 4, 64, 64, 0.9, spec), _at("g", 5, 64, 64, 1.02, spec),
            _at("g", 6, 64, 64, 1.2, spec), dict(_at("torch", 6, 64, 64, 1.0, spec), online_timings={other: 0.9}),
            _at("g", 7, 64, 64, 1.2, spec), dict(_at("o", 7, 64, 64, 1.2, other), online_timings={spec: 1.02}),
            _at("g", 8, 64, 64, 1.2, spec), _at("torch", 8, 64, 64, 1.0, spec)]
    (points,) = measured_points(rows, ["kernel"], 1.05).values()
    assert {at[0]: sorted(won) for at, won in points.items()} == {1: [spec], 2: [], 3: [], 4: [], 5: [], 6: [spec],
                                                                 7: [other], 8: []}
    # with two protocols, online choice's torch in the second protocol's row passes over what it timed too
    both = [dict(r, protocol=p) for r in (_at("g", 1, 64, 64, 1.2, spec), _at("g", 2, 64, 64, 1.2, spec))
            for p in ("kernel", "call")]
    both.append(dict(_at("torch", 2, 64, 64, 1.0, spec), protocol="call", online_timings={spec: 1.01}))
    (points,) = measured_points(both, ["kernel", "call"], 1.03).values()
    assert {at[0]: sorted(won) for at, won in points.items()} == {1: [spec], 2: []}


def test_near_points_take_online_tunings_timings_as_wins_from_its_margin():
    """measured_points: a candidate online tuning timed at a shape (`online_timings`) holds that shape where its
    timing reached NEAR_TIMED_MARGIN, at the lower of its timing and any row of it, with its own target and figures
    (device time only); never at a shape torch served."""
    from l2c.commands.table import NEAR_TIMED_MARGIN, measured_points
    g, w = (KernelSpec(name=name, tile_m=16, tile_n=16).to_l2() for name in "gw")
    h = KernelSpec(name="h", target="cutlass", tile_m=64, tile_n=16).to_l2()
    fixed = KernelSpec(name="f", tile_m=16, tile_n=16, problem_m=7).to_l2()   # serves one M: no neighbourhood
    timed = {h: NEAR_TIMED_MARGIN, w: NEAR_TIMED_MARGIN - 0.01, g: 1.1, fixed: 1.5}
    rows = [dict(_at("g", 1, 64, 64, 1.2, g), online_timings=timed),
            dict(_at("torch", 2, 64, 64, 1.0, g), online_timings={h: 1.3})]
    (points,) = measured_points(rows, ["kernel"], 1.03).values()
    assert set(points[1, 64, 64]) == {g, h} and points[2, 64, 64] == {}
    assert points[1, 64, 64][g]["speedup"] == 1.1 and points[1, 64, 64][h]["speedup"] == NEAR_TIMED_MARGIN
    timed_win = points[1, 64, 64][h]   # its own figures, not those of the row's served kernel
    assert timed_win["target"] == "cutlass" and timed_win["speedups"] == {"kernel": NEAR_TIMED_MARGIN}
    assert timed_win["candidate_tflops"] == timed_win["baseline_tflops"] * NEAR_TIMED_MARGIN


def test_near_points_of_a_two_protocol_table_take_timings_of_cutlass_candidates_only():
    """Online tuning times device time only: in a `kernel,call` table it stands for an eager call only where the C++
    call table launches the kernel (CUTLASS); a Triton candidate's timing is no win there."""
    from l2c.commands.table import measured_points
    g, w = (KernelSpec(name=name, tile_m=16, tile_n=16).to_l2() for name in "gw")
    h = KernelSpec(name="h", target="cutlass", tile_m=64, tile_n=16).to_l2()
    rows = [dict(_at("g", 1, 64, 64, 1.2, g), online_timings={h: 1.1, w: 1.1}),
            dict(_at("g", 1, 64, 64, 1.2, g), protocol="call")]
    (points,) = measured_points(rows, ["kernel", "call"], 1.03).values()
    assert set(points[1, 64, 64]) == {g, h}
    (points,) = measured_points(rows[:1], ["kernel"], 1.03).values()
    assert set(points[1, 64, 64]) == {g, h, w}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([8, 16, 64, 128]), st.sampled_from([8, 16, 32, 64, 128]), st.sampled_from([1, 2, 4]),
       st.sampled_from([(1, 1), (1, 2), (2, 1), (1, 4), (4, 1), (2, 2)]), st.integers(1, 20000),
       st.integers(1, 20000))
def test_launch_waves_count_clusters_over_what_the_gpu_runs_at_once(tile_m, tile_n, slices, cluster, m, n):
    """launch_waves: output tiles grouped in clusters, times the split-K slices, over the clusters of that size the
    GPU runs at once; never fewer for a larger M or N."""
    from l2c.arch import ARCHS
    from l2c.commands.table import launch_waves
    spec = KernelSpec(name="g", target="cutlass", tile_m=tile_m, tile_n=tile_n, split_k_slices=slices,
                      cluster_m=cluster[0], cluster_n=cluster[1]).to_l2()
    capacity = ARCHS["sm_90"].max_active_clusters[cluster[0] * cluster[1]]
    clusters = math.ceil(math.ceil(m / tile_m) / cluster[0]) * math.ceil(math.ceil(n / tile_n) / cluster[1]) * slices
    assert launch_waves(spec, m, n) == math.ceil(clusters / capacity)
    assert launch_waves(spec, m + 1, n) >= launch_waves(spec, m, n) <= launch_waves(spec, m, n + 1)


def test_launch_waves_at_known_shapes():
    """Measured on the H200 (benchmarks/NOTES.md, session 30): 30 clusters of 4 run at once, so a 64x16 kernel in
    clusters of 1x4 launches 82x1000 (2 x 16 clusters) in two waves and 76x936 (2 x 15) in one; unclustered, 132
    tiles are one wave and 133 two; 114 SMs count 114 tiles; stream-K's slices are not launched as slices; the gemv
    family's blocks are no output tiles."""
    from l2c.commands.table import launch_waves
    clustered = KernelSpec(name="c", target="cutlass", tile_m=64, tile_n=16, cluster_n=4).to_l2()
    assert (launch_waves(clustered, 82, 1000), launch_waves(clustered, 76, 936)) == (2, 1)
    plain = KernelSpec(name="p", target="cutlass", tile_m=64, tile_n=64).to_l2()
    assert (launch_waves(plain, 64, 132 * 64), launch_waves(plain, 128, 66 * 64 + 1)) == (1, 2)
    assert (launch_waves(plain, 64, 114 * 64, 114), launch_waves(plain, 64, 115 * 64, 114)) == (1, 2)
    stream_k = KernelSpec(name="s", target="cutlass", tile_m=64, tile_n=64, split_k_slices=4,
                          split_k_mode="stream_k").to_l2()
    assert launch_waves(stream_k, 64, 132 * 64) == 1
    gemv = KernelSpec(name="g", target="cutlass", launch_family="gemv", tile_m=1, tile_n=8, tile_k=256).to_l2()
    assert launch_waves(gemv, 1, 4096) == 0


def test_no_neighbourhood_cell_holds_a_step_in_launch_waves():
    """A 64x16 kernel in clusters of 4 (30 run at once: 120 blocks) won at every point around M = 32-128,
    N = 512-1448: two M tiles from N = 961 launch 32 clusters, a second wave that doubles the time (0.72x of torch on
    the H200 at 82x1000x680), so no box holds both sides of that step; with M in one tile the boxes stand."""
    from l2c.commands.table import launch_waves, near_boxes
    spec = KernelSpec(name="c", target="cutlass", tile_m=64, tile_n=16, cluster_n=4).to_l2()
    assert launch_waves(spec, 64, 1100) == launch_waves(spec, 65, 960) == 1 and launch_waves(spec, 65, 961) == 2
    rows = [_at("c", m, n, k, 1.2, spec) for m in (32, 45, 64, 91, 128) for n in (512, 728, 1024, 1448)
            for k in (512, 728, 1024)]   # at the lattice's edges: each box's corners are among its nearest
    boxes = near_boxes(rows, ["kernel"], 1.05)
    assert any(ms[1] <= 64 and ns[0] <= 1000 <= ns[1] for _, ms, ns, _ in boxes)
    for _, ms, ns, _ in boxes:
        assert launch_waves(spec, ms[0], ns[0]) == launch_waves(spec, ms[1], ns[1])
        assert not (ms[0] <= 82 <= ms[1] and ns[0] <= 1000 <= ns[1])


def test_near_points_of_another_gpu_are_refused(tmp_path):
    """The points of `--near` are checked like the sources: results of two GPUs make no table."""
    spec = KernelSpec(name="g", tile_m=16, tile_n=16).to_l2()
    near = tmp_path / "points.jsonl"
    near.write_text("\n".join(json.dumps(r) for r in [{"type": "env", "gpu": "NVIDIA H100"},
                                                      _at("g", 2, 64, 64, 1.2, spec)]) + "\n")
    done = _table_command(tmp_path, [_at("g", 1, 64, 64, 1.2, spec)], "--near", str(near))
    assert done.returncode == 2 and "different GPUs" in done.stderr and "Traceback" not in done.stderr


def test_near_is_a_flag_of_cells_only():
    """The table format: `near` is true or false, and true only on a cell (docs/CONTRACTS.md)."""
    from l2c.tuned_table import entry_from_row
    base = {"m": 4, "n": 128, "k": 128, "dtype": "f16", "layout": "row,row,row", "target": "cutlass",
            "spec": KernelSpec(name="g", tile_m=16, tile_n=16).to_l2(), "tflops": 1.2, "baseline_tflops": 1.0}
    cell = dict(base, m_range=[4, 6], n_range=[128, 184], k_range=[128, 184], range_min_speedup=1.1)
    assert entry_from_row(dict(cell, near=True)).near and not entry_from_row(cell).near
    assert entry_from_row(dict(cell, near=True)).to_row()["near"] is True
    for bad in (dict(base, near=True), dict(cell, near="yes"), dict(base, m_range=[4, 6], near=True)):
        with pytest.raises(ValueError, match="near"):
            entry_from_row(bad)


def test_a_spec_measured_twice_at_a_shape_counts_at_its_slower_figure():
    """Single-protocol tables choose among specs by each one's worst row at a shape, as every other rule does: a
    lucky re-measurement never makes an entry of a spec that also lost there."""
    from l2c.commands.table import best_rows

    def row(spec, speedup):
        return {"type": "result", "status": "ok", "protocol": "kernel", "kernel": spec, "spec": spec, "m": 64,
                "n": 64, "k": 64, "dtype": "f16", "layout": "row,row,row", "speedup": speedup}
    rows = [row("kernel a {}", 1.08), row("kernel a {}", 0.95), row("kernel b {}", 1.04)]
    [best] = best_rows(rows, "kernel", 1.03)
    assert (best["spec"], best["speedup"]) == ("kernel b {}", 1.04)
    assert best_rows(rows[:2], "kernel", 1.03) == []


def test_a_token_count_range_never_spans_an_m_whose_row_failed():
    """An M whose measurement failed (an error or a failed check, in any protocol) is no win: it breaks a run of wins
    as a loss does, so no range serves it, whatever the other protocol's row says there."""
    from l2c.commands.table import combined_rows, range_rows
    spec = "kernel g {\n  target triton\n  problem m=any n=64 k=64\n}\n"

    def row(m, protocol, speedup=1.2, status="ok"):
        return {"type": "result", "status": status, "protocol": protocol, "kernel": "g", "spec": spec, "m": m,
                "n": 64, "k": 64, "dtype": "f16", "layout": "row,row,row", "speedup": speedup}
    wins = [(m, p) for m in (8, 16, 32, 128, 256, 512) for p in ("kernel", "call")]
    single = [row(m, "kernel") for m, p in wins if p == "kernel"] + [row(64, "kernel", None, "error")]
    both = [row(m, p) for m, p in wins] + [row(64, "kernel"), row(64, "call", None, "error")]
    for made in (range_rows(single, "kernel", 1.03),
                 range_rows(combined_rows(both, ["kernel", "call"], 1.03, {}), "kernel,call", 1.03)):
        assert made and all(not lo <= 64 <= hi for _, lo, hi, _ in made)


def test_a_row_of_a_table_file_names_the_spec_of_its_own_dtype(tmp_path):
    """A table holds one spec name in several dtypes (an f16 and a bf16 kernel of one tiling): a row of
    `l2c bench TABLE.json` is the spec of its own dtype and layouts, never the other's."""
    from l2c.commands.table import spec_text
    f16 = KernelSpec(name="g", tile_m=16, tile_n=16).to_l2()
    bf16 = KernelSpec(name="g", tile_m=16, tile_n=16, types_a="bf16", types_b="bf16", types_c="bf16").to_l2()
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"entries": [{"spec": f16}, {"spec": bf16}]}))
    row = {"source": str(table), "name": "g", "layout": "row,row,row"}
    assert spec_text(dict(row, dtype="bf16"), {}) == bf16
    assert spec_text(dict(row, dtype="f16"), {}) == f16
    assert spec_text(dict(row, dtype="f32"), {}) == ""


def test_a_range_under_two_protocols_never_spans_an_m_where_every_row_failed():
    """With two protocols an M whose every row failed (in both) still counts as measured: a range never spans it."""
    from l2c.commands.table import combined_rows, range_rows
    spec = KernelSpec(name="g", tile_m=16, problem_m="any").to_l2()
    rows = [row("g", m, 1.2, protocol=p, spec=spec) for m in (8, 16, 32, 128, 256, 512) for p in ("kernel", "call")]
    rows += [row("g", 64, None, status="verify_failed", protocol=p, spec=spec) for p in ("kernel", "call")]
    made = range_rows(combined_rows(rows, ["kernel", "call"], 1.03, {}), "kernel,call", 1.03)
    assert made and all(not lo <= 64 <= hi for _, lo, hi, _ in made)


def test_a_cell_never_spans_a_value_where_its_kernel_failed():
    """A kernel measured (and failed) at N = 128 between wins at 64 and 256: no box of it joins 64 to 256."""
    from l2c.commands.table import cell_rows
    spec = KernelSpec(name="g", tile_m=16, tile_n=16).to_l2()
    rows = [_at("g", m, n, k, 1.2, spec) for m in (16, 32) for n in (64, 256) for k in (64, 128)]
    rows += [dict(_at("g", m, 128, k, None, spec), status="error") for m in (16, 32) for k in (64, 128)]
    cells = cell_rows(rows, "kernel", 1.05, 132)
    assert not any(ns[0] < 128 < ns[1] or ns == (64, 256) for _, _, ns, _ in cells)


def test_a_kernel_measured_with_another_epilogue_is_no_evidence_for_plain_calls(tmp_path):
    """A win measured with a fused activation, an alpha or an f32 output makes no entry (the dispatcher would serve
    plain calls with the plain epilogue); a win with nn.Linear's column bias does."""
    fused = KernelSpec(name="fused", tile_m=64, epilogue_activation="gelu").to_l2()
    scaled = KernelSpec(name="scaled", tile_m=64, epilogue_alpha=2.0).to_l2()
    wide = KernelSpec(name="wide", tile_m=64, types_c="f32").to_l2()
    bias = KernelSpec(name="bias", tile_m=64, epilogue_bias="col").to_l2()
    rows = [row("fused", 128, 1.6, spec=fused), row("scaled", 256, 1.6, spec=scaled), row("wide", 512, 1.6, spec=wide),
            row("bias", 1024, 1.6, spec=bias)]
    assert [e["m"] for e in _table_run(tmp_path, rows)["entries"]] == [1024]


def test_neighbourhood_cells_hold_no_source_shape_where_their_kernel_lost(tmp_path):
    """--near: a box whose kernel lost at a shape among the table's sources (slower than torch in any protocol)
    is not served, though its neighbourhood won; the other boxes still are."""
    from l2c.commands.table import near_rows, source_losses
    spec = KernelSpec(name="g", tile_m=16, tile_n=16).to_l2()
    points = [_at("g", m, n, k, 1.2, spec) for m in (4, 8, 16) for n in (128, 256, 512) for k in (128, 256, 512)]
    boxes = near_rows(points, ["kernel"], 1.05)
    assert boxes
    r, ms, ns, ks = boxes[0]
    inside = (ms[0], ns[0], ks[0])
    lost = [_at("g", *inside, 0.98, spec)]
    kept = near_rows(points, ["kernel"], 1.05, losses=source_losses(lost, "kernel", {}))
    assert kept and not any(all(lo <= x <= hi for x, (lo, hi) in zip(inside, sides)) for _, *sides in kept)


def test_a_merge_drops_an_entry_the_new_results_measured_losing(tmp_path):
    """--into: an entry of the base table whose kernel the new results measured slower than torch at a shape it
    serves leaves the merged table (an entry counts at its worst row, whichever run measured it)."""
    g = KernelSpec(name="g", tile_m=16, problem_m="any").to_l2()
    base_rows = [{"type": "env", "gpu": "NVIDIA H200"}, row("a", 128, 1.20), row("b", 256, 1.30)]
    base_rows += [row("g", m, 1.2, spec=g) for m in (1024, 2048, 4096)]
    new_rows = [{"type": "env", "gpu": "NVIDIA H200"}, row("b", 256, 0.98), row("g", 3000, 0.9, spec=g),
                row("d", 512, 1.10)]
    base = tmp_path / "base.json"
    for name, rows in (("base", base_rows), ("new", new_rows)):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert _table(tmp_path / "base.jsonl", "-o", base, "--ranges").returncode == 0
    assert any("m_range" in e for e in json.loads(base.read_text())["entries"])
    out = tmp_path / "merged.json"
    done = _table(tmp_path / "new.jsonl", "-o", out, "--into", base)
    assert done.returncode == 0, done.stderr
    got = sorted((e["m"], e["spec"].split()[1]) for e in json.loads(out.read_text())["entries"] if "m_range" not in e)
    assert got == [(128, "a"), (512, "d"), (1024, "g"), (2048, "g"), (4096, "g")]   # b lost at its own shape
    assert not any("m_range" in e for e in json.loads(out.read_text())["entries"])   # g lost inside its range


def test_withdraw_takes_out_every_entry_serving_a_shape_and_records_it(tmp_path):
    """--into TABLE --withdraw SHAPE: the exact entry and the token-count range that serve the shape leave the
    table, other entries stay, the table lists the shape under `withdrawn`; with new results the withdrawal applies
    to the merged table. Refused (exit 2, no traceback): without --into, a shape no entry serves, malformed text."""
    g = KernelSpec(name="g", tile_m=16, problem_m="any").to_l2()
    base_rows = [{"type": "env", "gpu": "NVIDIA H200"}, row("a", 128, 1.20), row("b", 4096, 1.30)]
    base_rows += [row("g", m, 1.2, spec=g) for m in (256, 512, 1024)]
    base = tmp_path / "base.json"
    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in base_rows) + "\n")
    assert _table(tmp_path / "base.jsonl", "-o", base, "--ranges").returncode == 0
    out = tmp_path / "out.json"
    done = _table("--into", base, "--withdraw", "f16:row,row,row:none:384x64x64", "-o", out)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert sorted((e["m"], e["spec"].split()[1]) for e in data["entries"]) == [(128, "a"), (256, "g"), (512, "g"),
                                                                                 (1024, "g"), (4096, "b")]
    assert data["withdrawn"] == ["f16:row,row,row:none:384x64x64"]
    assert data["min_speedup"] == json.loads(base.read_text())["min_speedup"]
    table = TunedTable.load(out)
    assert [m for m in (128, 256, 384, 512, 700, 1024) if table.lookup("f16", "row,row,row", m, 64, 64)] == \
        [128, 256, 512, 1024]
    (tmp_path / "new.jsonl").write_text(json.dumps(row("c", 2048, 1.4)) + "\n")
    both = _table(tmp_path / "new.jsonl", "--into", out, "--withdraw", "f16:row,row,row:none:4096x64x64", "-o", out)
    assert both.returncode == 0, both.stderr
    data = json.loads(out.read_text())
    assert sorted(e["m"] for e in data["entries"]) == [128, 256, 512, 1024, 2048]
    assert data["withdrawn"] == ["f16:row,row,row:none:384x64x64", "f16:row,row,row:none:4096x64x64"]
    for args, said in ((("--withdraw", "f16:row,row,row:none:384x64x64"), "--into"),
                       (("--into", base, "--withdraw", "f16:row,row,row:silu:384x64x64"), "no entry"),
                       (("--into", base, "--withdraw", "f16:row,row:none:384x64x64"), "layout"),
                       (("--into", base, "--withdraw", "f16:row,row,row:none:384x64"), "MxNxK"),
                       (("--into", base), "results")):
        refused = _table(*args, "-o", tmp_path / "refused.json")
        assert refused.returncode == 2 and said in refused.stderr and "Traceback" not in refused.stderr, args


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.integers(0, 64)), min_size=1, max_size=8),
       st.lists(st.integers(1, 128), min_size=1, max_size=4))
def test_withdrawn_shapes_are_served_by_no_entry_and_every_other_entry_stays(spans, shapes):
    """merged(..., withdrawn): of random exact entries and ranges, exactly those serving a withdrawn M leave."""
    from l2c.commands.table import _serves_at, merged, parse_withdrawn
    entries = [dict(row(f"k{i}", lo, 1.2), m_range=[lo, lo + width]) if width else row(f"k{i}", lo, 1.2)
               for i, (lo, width) in enumerate(spans)]
    base = {"gpu": "NVIDIA H200", "protocol": "kernel", "min_speedup": 1.05, "entries": entries}
    new = {"gpu": None, "protocol": "kernel", "min_speedup": None, "sources": [], "confirmed_by": [], "entries": []}
    withdrawn = {f"f16:row,row,row:none:{m}x64x64": parse_withdrawn(f"f16:row,row,row:none:{m}x64x64")
                 for m in shapes}
    served = [w for w in withdrawn if any(_serves_at(e, withdrawn[w]) for e in entries)]
    if len(served) < len(withdrawn):
        with pytest.raises(ValueError, match="no entry"):
            merged(base, new, ValueError, withdrawn=withdrawn)
        return
    kept = merged(base, new, ValueError, withdrawn=withdrawn)["entries"]
    assert not any(_serves_at(e, shape) for e in kept for shape in withdrawn.values())
    assert [e for e in entries if e not in kept] == [e for e in entries
                                                     if any(_serves_at(e, s) for s in withdrawn.values())]


_ODD_VALUES = [None, 0, -1, 1, 7, 2**31, True, 1.5, float("nan"), float("inf"), "x", "", [1, 2], [4, 6], [0, 9],
               [9, 4], [5, 9], [1, 3], [200, 300], "row,col,row", "f16", "cutlass", "silu", 1.1, 1.0, 0.9, -0.5]
_ROW_FIELDS = ("m", "n", "k", "batch", "dtype", "layout", "target", "spec", "tflops", "baseline_tflops", "speedup",
               "gate", "near", "m_range", "n_range", "k_range", "range_min_speedup")


def _table_row(kind: str) -> dict:
    """A well-formed table row of each kind: an exact entry, a token-count range, a corner cell, a near cell."""
    row = {"m": 4, "n": 128, "k": 128, "batch": 1, "dtype": "bf16", "layout": "row,col,row", "target": "cutlass",
           "spec": KernelSpec(name="g", tile_m=16, tile_n=16).to_l2(), "tflops": 1.2, "baseline_tflops": 1.0,
           "speedup": 1.2, "speedups": {"kernel": 1.2}}
    if kind != "exact":
        row.update(m_range=[2, 6], range_min_speedup=1.1)
    if kind in ("cell", "near"):
        row.update(n_range=[128, 184], k_range=[96, 184], near=kind == "near")
    return row


def _read_both_ways(row):
    """entry_from_row's result (or error) with the quick path and with the full checks alone."""
    from l2c import tuned_table as T

    def read(quick: bool):
        saved = T._quick_entry
        if not quick:
            T._quick_entry = lambda r: None
        try:
            return T.entry_from_row(row)
        except (ValueError, TypeError) as err:
            return type(err), str(err)
        finally:
            T._quick_entry = saved
    return read(True), read(False)


def test_the_quick_row_reader_agrees_with_the_full_checks_on_every_one_field_change():
    """A table row read by the quick path (one test per field, for the well-formed rows that make a table) gives the
    entry the full checks give, and a row it does not take falls to those checks: the same entry or the same error
    for every row of each kind with one field changed to an odd value or left out."""
    from l2c import tuned_table as T
    for kind in ("exact", "range", "cell", "near"):
        assert T._quick_entry(_table_row(kind)) is not None   # a well-formed row of each kind takes the quick path
        for field in _ROW_FIELDS:
            for value in _ODD_VALUES + ["drop"]:
                row = _table_row(kind)
                row.pop(field) if value == "drop" and field in row else row.update({field: value})
                quick, full = _read_both_ways(row)
                assert quick == full, (kind, field, value)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["exact", "range", "cell", "near"]),
       st.dictionaries(st.sampled_from(_ROW_FIELDS), st.sampled_from(_ODD_VALUES), min_size=2, max_size=4))
def test_the_quick_row_reader_agrees_with_the_full_checks_on_several_changes(kind, changed):
    """The same with several fields changed at once."""
    row = _table_row(kind)
    row.update(changed)
    quick, full = _read_both_ways(row)
    assert quick == full
