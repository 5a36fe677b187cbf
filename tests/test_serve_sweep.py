"""The unswapped stage of scripts/serve_sweep.py: wave-sized CUTLASS tiles for 48-512 tokens (CPU only)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import serve_sweep as sweep  # noqa: E402

from l2c.parser import parse_one  # noqa: E402
from l2c.validate import validate  # noqa: E402
from tests.toolchain import run_without_cutlass_wheel  # noqa: E402

TOKENS = st.integers(48, 512)
ROWS = st.integers(64, 20000).map(lambda n: 8 * n)          # weight rows N (multiples of 8, 512-160000)


def test_wave_fill_counts_the_idle_slots_of_every_wave():
    # cuBLAS's pick for 128 tokens on Llama-8B's gate/up (nvjet 112 x 128): 128 tiles on 132 SMs
    assert math.isclose(sweep.wave_fill(128, 14336, 128, 112), 128 / 132)
    # two 64-row tiles over 96 tokens, 67 tile columns: 134 tiles, so two waves (the second nearly idle) of padded tiles
    assert math.isclose(sweep.wave_fill(96, 67 * 128, 64, 128), 96 * 67 * 128 / (2 * 132 * 64 * 128))


@settings(max_examples=60, deadline=None)
@given(TOKENS, ROWS)
def test_unswapped_configs_are_valid_and_fill_the_waves_best_per_tile_m(m, n):
    configs = sweep.unswapped_configs(m, n)
    texts = sweep.unswapped_specs(m, n, "f16")
    assert len(texts) == len(configs) == len(set(texts)), "the generator proposed a spec twice or one CUTLASS refuses"
    for text in texts:
        spec = parse_one(text)
        validate(spec, "cutlass", "sm_90")
        assert spec.launch_swap == "no" and spec.layout_b == "col" and spec.launch_schedule == "basic"
    plain = [c for c in configs if c[3:] == (1, 1)]
    for schedule, tile_m, tile_n, _, _ in plain:
        assert not (tile_m > 64 and tile_m >= 2 * m), "a tile M at least twice the tokens"
        widest = {t[1]: t[2] for t in sweep.UNSWAPPED}[tile_m]
        others = sorted((round(sweep.wave_fill(m, n, tile_m, t), 2) for t in sweep.UNSWAPPED_TILE_N if t <= widest),
                        reverse=True)
        assert round(sweep.wave_fill(m, n, tile_m, tile_n), 2) >= others[sweep.UNSWAPPED_PER_TILE_M - 1]
    best = plain[0]
    assert all(round(sweep.wave_fill(m, n, *c[1:3]), 2) <= round(sweep.wave_fill(m, n, *best[1:3]), 2) for c in plain)
    clustered = [c for c in configs if c[3:] != (1, 1)]
    expected = ([best[:3] + (1, 2)] if math.ceil(n / best[2]) >= 2 else []) + \
        ([best[:3] + (2, 1)] if math.ceil(m / best[1]) % 2 == 0 else [])
    assert clustered == expected


@settings(max_examples=30, deadline=None)
@given(st.integers(64, 1024), ROWS)
def test_unswapped_specs_take_the_layout_asked_for(m, n):
    """`--layout row,row,row` (the grid's `a @ b`): the same configurations, each a valid spec with B row-major."""
    linear = sweep.unswapped_specs(m, n, "f16")
    rows = sweep.unswapped_specs(m, n, "f16", "row,row,row")
    assert len(rows) == len(linear) == len(sweep.unswapped_configs(m, n))
    for text in rows:
        spec = parse_one(text)
        validate(spec, "cutlass", "sm_90")
        assert (spec.layout_a, spec.layout_b, spec.layout_c) == ("row", "row", "row")


def _entry(m, n, k, spec, dtype="f16", layout="row,col,row", **extra):
    return dict(m=m, n=n, k=k, batch=1, dtype=dtype, layout=layout, target=parse_one(spec).target, spec=spec,
                tflops=1.0, baseline_tflops=0.9, speedup=1.1, **extra)


def _triton_gemv(name, tile_n, dtype="f16", problem="m=any n=any k=any"):
    return (f"kernel {name} {{\n  target   triton\n  problem  {problem} batch=1\n  types    a={dtype} b={dtype} "
            f"c={dtype} acc=f32\n  layout   a=row b=col c=row\n  tile     m=4 n={tile_n} k=32\n  launch   "
            f"family=gemv warps=2\n}}\n")


def test_the_entries_stage_times_each_generic_kernel_of_a_weight_at_every_token_count_of_it(tmp_path):
    """`entries` pools: at each shape of a weight, every shape-generic kernel of the table's plain exact entries for
    that weight in this dtype and nn.Linear's layout, whatever M they were measured at; a fixed-shape kernel, another
    dtype, `a @ b`'s layout, a token range or a gated entry adds nothing. Then the stage itself (CPU, interpreter)
    verifies and times them in both protocols, each served through the dispatcher."""
    import json
    import os
    import subprocess
    from l2c.results_file import read_rows
    from l2c.shapes import Shape
    a, b = _triton_gemv("a", 16), _triton_gemv("b", 32)
    fixed = _triton_gemv("c", 16, problem="m=2 n=64 k=96")
    entries = [_entry(1, 64, 96, a), _entry(3, 64, 96, b), _entry(2, 64, 96, fixed),
               _entry(1, 64, 96, _triton_gemv("d", 16, dtype="bf16"), dtype="bf16"),
               _entry(1, 64, 96, _triton_gemv("e", 64), layout="row,row,row"),
               _entry(2, 64, 96, _triton_gemv("f", 64), m_range=[1, 3], range_min_speedup=1.1),
               _entry(1, 64, 96, _triton_gemv("g", 64), gate="silu")]
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"format": 1, "arch": "sm_90", "gpu": "cpu", "protocol": "kernel,call",
                                 "entries": entries}))
    shapes = [Shape(m, 64, 96) for m in (1, 2, 3)] + [Shape(1, 80, 96)]
    pools = sweep.entry_pools(str(table), shapes, "f16")
    assert pools == {**{(m, 64, 96, 1): sorted([a, b]) for m in (1, 2, 3)}, (1, 80, 96, 1): []}
    shape_file = tmp_path / "shapes.txt"
    shape_file.write_text("1 64 96\n3 64 96\n1 80 96\n")
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TRITON_INTERPRET="1", L2C_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(repo / "scripts" / "serve_sweep.py"), "--out", str(tmp_path),
                           "--stages", "entries", "--table", str(table), "--shapes", str(shape_file), "--workers",
                           "1"], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in read_rows(tmp_path / "serve_entries_f16.jsonl") if r.get("type") == "result"]
    assert all(r["status"] == "ok" and r["verified"] is True for r in rows)
    # each kernel measured through l2c.nn.Linear with a table serving it, as a table entry of it would serve users
    assert all(r["target"] == "dispatch" and r["served_by"] != "torch" for r in rows)
    assert sorted((r["m"], r["n"], parse_one(r["served_spec"]).name, r["protocol"]) for r in rows) == sorted(
        (m, 64, name, protocol) for m in (1, 3) for name in "ab" for protocol in ("kernel", "call"))


def test_a_sweep_of_cutlass_kernels_stops_before_timing_where_their_headers_are_missing(tmp_path):
    """Without the `nvidia-cutlass` wheel no CUTLASS-target kernel outside the prebuilt pack builds: the entries
    stage stops at once, naming the wheel, instead of recording every candidate as not served."""
    import json
    gv = parse_one("kernel gv {\n  target cutlass\n  problem m=any n=any k=any\n  layout a=row b=col c=row\n"
                   "  launch family=gemv cores=cuda warps=4 evict=first\n  tile m=1 n=8 k=256\n}\n").to_l2()
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"format": 1, "arch": "sm_90", "gpu": "cpu", "protocol": "kernel,call",
                                 "entries": [_entry(1, 64, 256, gv)]}))
    shape_file = tmp_path / "shapes.txt"
    shape_file.write_text("1 64 256\n2 64 256\n")
    script = Path(__file__).resolve().parent.parent / "scripts" / "serve_sweep.py"
    argv = [str(script), "--out", str(tmp_path), "--stages", "entries", "--table", str(table), "--shapes",
            str(shape_file), "--workers", "1"]
    done = run_without_cutlass_wheel(argv, timeout=600)
    assert done.returncode != 0 and "pip install nvidia-cutlass" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    rows = tmp_path / "serve_entries_f16.jsonl"
    assert not rows.exists() or all(json.loads(r).get("type") != "result" for r in rows.read_text().splitlines())
