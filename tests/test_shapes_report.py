"""Shape sets, FLOP buckets and the report's statistics, on hand-computable inputs."""
import json
import math
import sys

import pytest

from l2c import shapes
from l2c.report import Point, best_of, load_results, print_summary, stats, summarize, write_plots
from l2c.shapes import Shape, bucket, load_shapes, read_shape_file


def test_grid_is_the_thousand_shape_cube():
    grid = load_shapes("grid")
    assert len(grid) == 1000 and len({s.key for s in grid}) == 1000
    assert {s.m for s in grid} == {s.n for s in grid} == {s.k for s in grid} == set(shapes.GRID_DIMS)


def test_llm_set_has_the_documented_layers():
    llm = load_shapes("llm")
    keys = {(s.m, s.n, s.k) for s in llm}
    assert len(keys) == len(llm)
    assert {s.m for s in llm} == set(shapes.LLM_TOKENS)
    assert (1, 6144, 4096) in keys            # Llama-3.1-8B fused QKV at one token
    assert (8192, 4096, 14336) in keys        # Llama-3.1-8B down projection
    assert (512, 2 * 28672, 8192) in keys     # Llama-3.1-70B fused gate+up
    assert (16, 4608, 3584) in keys           # Qwen2.5-7B fused QKV
    for hidden, *_ in shapes.LLM_MODELS.values():
        assert 2048 <= hidden <= 8192
    s = next(s for s in llm if (s.m, s.n, s.k) == (1, 6144, 4096))
    assert "Llama-3.1-8B qkv T=1" in s.label


def test_square_set():
    sq = load_shapes("square")
    assert all(s.m == s.n == s.k for s in sq)
    assert {1000, 4096, 16384} <= {s.m for s in sq}


@pytest.mark.parametrize("flops, label", [
    (0, "<1 GFLOP"), (2 * 512 ** 3, "<1 GFLOP"), (1e9 - 1, "<1 GFLOP"), (1e9, "1-64 GFLOP"),
    (2 * 1024 ** 3, "1-64 GFLOP"), (64e9 - 1, "1-64 GFLOP"), (64e9, "64 GFLOP-1 TFLOP"),
    (2 * 4096 ** 3, "64 GFLOP-1 TFLOP"), (1e12, ">=1 TFLOP"), (2 * 8192 ** 3, ">=1 TFLOP"),
])
def test_buckets(flops, label):
    assert bucket(flops) == label


def test_flops_counts_batch():
    assert Shape(2, 3, 5, batch=7).flops == 2 * 2 * 3 * 5 * 7


def test_shape_file(tmp_path):
    f = tmp_path / "s.txt"
    f.write_text("# my shapes\n\n64 128 256\n  1,4096,4096   # decode\n8 16 32 4\n64 128 256\n")
    got = load_shapes(str(f))
    assert [s.key for s in got] == [(64, 128, 256, 1), (1, 4096, 4096, 1), (8, 16, 32, 4)]
    assert got[1].label == f"{f}:4"


@pytest.mark.parametrize("text, lineno, fragment", [
    ("64 64 64\n64 64\n", 2, "expected 'M N K'"),
    ("# c\n64 x 64\n", 2, "whole numbers"),
    ("1 2 3\n\n1 0 3\n", 3, "positive"),
    ("1 2 3 4 5\n", 1, "expected 'M N K'"),
    ("1 1 3000000000\n", 1, "at most 2147483647"),   # every reader of results takes 32-bit dimensions
])
def test_shape_file_errors_name_file_and_line(tmp_path, text, lineno, fragment):
    f = tmp_path / "bad.txt"
    f.write_text(text)
    with pytest.raises(shapes.ShapeFileError) as err:
        read_shape_file(f)
    assert str(err.value).startswith(f"{f}:{lineno}: ") and fragment in str(err.value)


# ------------------------------------------------------------------------------------------- statistics

def test_stats_hand_computed():
    s = stats([2.0, 0.5, 1.0, 4.0])
    assert s.n == 4
    assert s.geomean == pytest.approx(math.sqrt(2))      # (2 * 0.5 * 1 * 4) ** (1/4) = 4 ** (1/4)
    assert s.mean == pytest.approx(7.5 / 4)
    assert s.won == 2                                     # exactly 1.0 is not a win
    with pytest.raises(ValueError):
        stats([1.0, 0.0])


def test_summarize_worst_and_buckets():
    pts = [
        Point(64, 64, 64, 1, 2 * 64 ** 3, 0.8),             # <1 GFLOP
        Point(128, 128, 128, 1, 2 * 128 ** 3, 1.25),        # <1 GFLOP
        Point(2048, 2048, 2048, 1, 2 * 2048 ** 3, 1.1),     # 1-64 GFLOP (17.2 GFLOP)
        Point(8192, 8192, 8192, 1, 2 * 8192 ** 3, 0.5),     # >=1 TFLOP
    ]
    s = summarize(pts)
    assert s.worst.shape == "8192x8192x8192" and s.worst.speedup == 0.5
    assert s.best.shape == "128x128x128"
    assert list(s.buckets) == ["<1 GFLOP", "1-64 GFLOP", ">=1 TFLOP"]     # empty bucket left out
    small = s.buckets["<1 GFLOP"]
    assert small.n == 2 and small.won == 1 and small.geomean == pytest.approx(1.0)
    assert small.mean == pytest.approx(1.025)
    assert s.overall.won_share == pytest.approx(0.5)


def _row(kernel, m, n, k, speedup, protocol="kernel", status="ok", base_s=1e-3):
    row = {"type": "result", "kernel": kernel, "m": m, "n": n, "k": k, "batch": 1, "flops": 2 * m * n * k,
           "protocol": protocol, "status": status}
    if status == "ok":
        row.update(candidate_s=base_s / speedup, baseline_s=base_s, speedup=speedup)
    return row


def _write(path, rows):
    env = {"type": "env", "device": "cuda", "gpu": "NVIDIA H200", "command": "l2c bench ...", "date": "d"}
    path.write_text("".join(json.dumps(r) + "\n" for r in [env] + rows))


def test_summary_and_best_of_from_a_results_file(tmp_path, capsys):
    rows = [_row("a", 64, 64, 64, 2.0), _row("a", 128, 128, 128, 0.5), _row("a", 256, 256, 256, 1.0),
            _row("b", 64, 64, 64, 1.0), _row("b", 128, 128, 128, 0.8),
            _row("b", 256, 256, 256, 0.0, status="verify_failed"),
            _row("torch", 64, 64, 64, 9.0)]      # the A/A check never enters best-of
    f = tmp_path / "r.jsonl"
    _write(f, rows)
    res = load_results(f)
    best = best_of(res)
    assert {p.shape: (p.kernel, p.speedup) for p in best["kernel"]} == {
        "64x64x64": ("a", 2.0), "128x128x128": ("b", 0.8), "256x256x256": ("a", 1.0)}
    print_summary(res, sys.stdout)
    out = capsys.readouterr().out
    assert "b [kernel]: 2 shape(s) measured; 1 verify_failed" in out
    assert f"geomean speedup {math.sqrt(0.8):.3f}x (headline)" in out       # b: sqrt(1.0 * 0.8)
    assert "worst 0.500x at 128x128x128" in out
    assert "best-of [kernel] — best of all candidates per shape (as a tuned dispatcher" in out
    assert f"geomean speedup {(2.0 * 0.8) ** (1 / 3):.3f}x" in out


def test_plots_are_valid_pngs_with_grid_heatmaps(tmp_path):
    import matplotlib.image

    dims = shapes.GRID_DIMS[:4]
    rows = [_row("k", m, n, k, 0.5 + (m * 7 + n * 3 + k) % 13 / 8) for m in dims for n in dims for k in dims[:2]]
    rows += [_row("k2", m, n, k, 1.1) for m in dims for n in dims for k in dims[:2]]
    f = tmp_path / "r.jsonl"
    _write(f, rows)
    written = write_plots(load_results(f), tmp_path / "plots")
    names = sorted(p.name for p in written)
    assert "k_kernel_grid_heatmap.png" in names and "k_kernel_speedup_vs_flops.png" in names
    assert "best-of_kernel_grid_heatmap.png" in names
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = matplotlib.image.imread(p)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_several_results_files_read_as_one_with_later_rows_replacing_earlier(tmp_path, capsys):
    """Pools screened over several runs: best-of spans every file, and a kernel re-measured on a shape in a
    later file replaces its earlier row instead of counting twice."""
    first, second = tmp_path / "pool1.jsonl", tmp_path / "pool2.jsonl"
    _write(first, [_row("a", 64, 64, 64, 0.5), _row("a", 128, 128, 128, 1.2), _row("b", 64, 64, 64, 0.9)])
    _write(second, [_row("a", 64, 64, 64, 0.7), _row("c", 128, 128, 128, 1.5)])   # `a` re-measured on 64^3
    res = load_results(first, second)
    assert len(res.envs) == 2
    a_rows = res.groups()[("a", "kernel")]
    assert sorted((r["m"], r["speedup"]) for r in a_rows) == [(64, 0.7), (128, 1.2)]
    assert {p.shape: (p.kernel, p.speedup) for p in best_of(res)["kernel"]} == {
        "64x64x64": ("b", 0.9), "128x128x128": ("c", 1.5)}

    from l2c.cli import main
    assert main(["report", str(first), str(second), "--only-best-of", "-o", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert "best-of [kernel]" in out and "a [kernel]" not in out
    assert f"geomean speedup {math.sqrt(0.9 * 1.5):.3f}x" in out
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert pngs == ["best-of_kernel_speedup_vs_flops.png"]
    assert main(["report", str(first), str(tmp_path / "missing.jsonl")]) == 2


def test_offgrid_and_serve_sets_are_fixed_and_hold_what_they_promise():
    off = load_shapes("offgrid")
    assert len(off) == len({s.key for s in off}) and len(off) >= 290
    assert off == load_shapes("offgrid")                         # a fixed seed: the same shapes every time
    random_part = [s for s in off if s.label == "offgrid"]
    assert len(random_part) == 240
    assert all(1 <= s.m <= 16384 and 64 <= s.n <= 16384 and 64 <= s.k <= 16384 and s.n % 8 == s.k % 8 == 0
               for s in random_part)
    taken = set(shapes.LLM_TOKENS) | set(shapes.SERVE_TOKENS)
    assert all(s.m not in taken for s in off if s.label != "offgrid")
    serve = load_shapes("serve")
    assert {s.m for s in serve} == set(shapes.SERVE_TOKENS)
    weights = {(s.n, s.k) for s in serve}
    assert (4096, 4096) in weights and (28672, 8192) in weights and (14336, 4096) in weights
    assert (128256, 4096) in weights and (2 * 27648, 5120) in weights      # lm_head; Qwen2.5-32B gate_up


def test_points_are_offgrids_distribution_under_2_gflop_and_never_an_offgrid_shape():
    """`points` (what neighbourhood cells are made from) is drawn like `offgrid` from another fixed seed, under
    2 GFLOP, and holds no `offgrid` shape, so that `offgrid` stays a held-out check of the cells."""
    points = load_shapes("points")
    assert points == load_shapes("points") and len(points) >= 1100
    assert not {s.key for s in points} & {s.key for s in load_shapes("offgrid")}
    assert all(2 * s.m * s.n * s.k < 2e9 and s.n % 8 == s.k % 8 == 0 and 1 <= s.m <= 16384 for s in points)
    drawn = [s for s in points if 64 <= s.n <= 16384 and 64 <= s.k <= 16384]
    assert len(drawn) >= 0.75 * len(points) and min(s.m for s in points) == 1


def test_roofline_rows_are_summarized_and_plotted_against_m(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rows = [{"type": "env", "gpu": "NVIDIA H200"}]
    for m in (1, 2, 4, 8):
        for n in (4096, 14336):
            rows.append({"type": "result", "kernel": "linear:t.json", "target": "dispatch", "source": "t.json",
                         "m": m, "n": n, "k": 4096, "batch": 1, "flops": 2 * m * n * 4096, "protocol": "kernel",
                         "status": "ok", "speedup": 1.1, "roofline_fraction": 0.9, "baseline_roofline_fraction": 0.8,
                         "served_by": "torch" if m == 8 else "k1"})
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    results = load_results(path)
    print_summary(results, sys.stdout)
    text = capsys.readouterr().out
    assert "fraction of roofline (median): 0.900, torch 0.800" in text
    assert "served by a tuned kernel on 6 of 8 shapes" in text
    written = write_plots(results, tmp_path / "plots")
    roof = [p for p in written if p.name.endswith("_roofline_vs_m.png")]
    assert len(roof) == 1 and roof[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_points2_is_a_second_draw_under_1_gflop_sharing_no_shape_with_offgrid_or_points():
    """`points2` (denser neighbourhood points where small calls are decided) is drawn like `points` from a fifth
    seed, under 1 GFLOP, and holds no `offgrid` shape (the held-out check) nor a `points` one (measured already)."""
    points2 = load_shapes("points2")
    assert points2 == load_shapes("points2") and len(points2) >= 500
    taken = {s.key for s in load_shapes("offgrid")} | {s.key for s in load_shapes("points")}
    assert not {s.key for s in points2} & taken
    assert all(2 * s.m * s.n * s.k < 1e9 and s.n % 8 == s.k % 8 == 0 and 1 <= s.m <= 16384 for s in points2)


def test_decode_is_the_serve_weights_up_to_64_tokens_and_decode_between_holds_none_of_their_token_counts():
    """`decode` is `serve` cut at 64 tokens; `decode_between` has every one of those weights at token counts between
    them and none that `serve` measures, so the entries made from `decode` meet it only through token ranges."""
    serve, decode, between = (load_shapes(name) for name in ("serve", "decode", "decode_between"))
    weights = {(s.n, s.k) for s in serve}
    assert [s.key for s in decode] == [s.key for s in serve if s.m <= shapes.DECODE_MAX_TOKENS]
    assert {(s.n, s.k) for s in decode} == {(s.n, s.k) for s in between} == weights
    assert len(between) == len(weights) * len(shapes.DECODE_BETWEEN_TOKENS)
    assert all(1 < s.m < shapes.DECODE_MAX_TOKENS and s.m not in shapes.SERVE_TOKENS for s in between)
    assert not {s.key for s in between} & {s.key for s in serve}


def test_decode_batched_is_the_rest_of_serve():
    """`decode` and `decode_batched` split `serve` at 64 tokens: together every shape of it, in its order."""
    serve, decode, batched = (load_shapes(name) for name in ("serve", "decode", "decode_batched"))
    assert all(s.m > shapes.DECODE_MAX_TOKENS for s in batched) and batched
    assert sorted(s.key for s in decode + batched) == sorted(s.key for s in serve)
    assert [s.key for s in batched] == [s.key for s in serve if s.m > shapes.DECODE_MAX_TOKENS]


def test_rows_of_one_kernel_in_two_dtypes_or_layouts_are_two_points(tmp_path):
    """One candidate id (`dispatch:TABLE`) is measured in several dtypes and layouts: a bf16 row never replaces the
    f16 row of the same shape, in one file or across files, nor does another layout's."""
    from l2c.results_file import row_key
    kind = {"dtype": "f16", "layout": "row,row,row"}
    f16, bf16 = {**_row("dispatch:t", 64, 64, 64, 1.2), **kind}, {**_row("dispatch:t", 64, 64, 64, 0.9), **kind,
                                                                   "dtype": "bf16"}
    nn = {**_row("dispatch:t", 64, 64, 64, 1.1), **kind, "layout": "row,col,row"}
    assert len({row_key(r) for r in (f16, bf16, nn)}) == 3
    one, other = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(one, [f16, nn])
    _write(other, [bf16])
    assert sorted(r["speedup"] for r in load_results(one, other).rows) == [0.9, 1.1, 1.2]
    groups = load_results(one, other).groups()   # one summary per problem kind, its title saying which
    assert sorted(groups) == [("dispatch:t (bf16 row,row,row)", "kernel"), ("dispatch:t (f16 row,col,row)", "kernel"),
                              ("dispatch:t (f16 row,row,row)", "kernel")]


def test_a_tables_summary_holds_the_entry_the_dispatcher_serves_at_each_shape(tmp_path, capsys):
    """`l2c bench TABLE.json` measures every entry at its own shape; where two entries share a shape, the table's
    summary is what a user gets there: the served entry's row, the shadowed one left out and counted."""
    table = {"type": "result", "source": "t.json", "target": "triton", "dtype": "f16", "layout": "row,row,row"}
    served = {**_row("t.json#0:exact@triton", 16, 32, 32, 0.5), **table, "table_served": True}
    shadowed = {**_row("t.json#1:wide@triton", 16, 32, 32, 3.0), **table, "table_served": False}
    _write(tmp_path / "r.jsonl", [served, shadowed])
    results = load_results(tmp_path / "r.jsonl")
    assert [[r["kernel"] for r in rows] for rows in results.groups().values()] == [["t.json#0:exact@triton"]]
    print_summary(results, sys.stdout, with_best_of=False)
    out = capsys.readouterr().out
    assert "tuned table t.json [kernel]: 1 shape(s)" in out and "geomean speedup 0.500x" in out
    assert "1 row(s) of table entries that another entry shadows" in out


def test_results_of_two_gpus_are_not_one_summary(tmp_path):
    from l2c.errors import BenchError
    _write(tmp_path / "a.jsonl", [_row("a", 64, 64, 64, 2.0)])
    (tmp_path / "b.jsonl").write_text(json.dumps({"type": "env", "device": "cuda", "gpu": "NVIDIA H100"}) + "\n"
                                      + json.dumps(_row("a", 64, 64, 64, 1.0)) + "\n")
    with pytest.raises(BenchError, match="different machines.*H100.*H200"):
        load_results(tmp_path / "a.jsonl", tmp_path / "b.jsonl")


def test_only_best_of_without_two_candidates_says_so(tmp_path, capsys):
    _write(tmp_path / "r.jsonl", [_row("a", 64, 64, 64, 2.0)])
    print_summary(load_results(tmp_path / "r.jsonl"), sys.stdout, only_best_of=True)
    assert "no best-of: no shape was measured with two or more candidates" in capsys.readouterr().out


def test_long_kernel_names_give_distinct_plot_files(tmp_path):
    long = "/very/long/folder/" * 8
    rows = [_row(f"{long}pool.l2:{name}@cutlass", 64, 64, 64, 1.5) for name in ("aaaa", "bbbb")]
    _write(tmp_path / "r.jsonl", rows)
    written = write_plots(load_results(tmp_path / "r.jsonl"), tmp_path / "plots", with_best_of=False)
    assert len(written) == 2 and len({p.name for p in written}) == 2
    assert all(len(p.stem) < 160 and "cutlass_kernel" in p.stem for p in written)
