"""scripts/widegemv_sweep.py on the CPU: its kernels validate, each shape meets the configurations of its tile m class,
the --fit phase's every ring depth adds only shallower twins of the same tiles, and the points phase takes the
configurations that qualified at most sample shapes by the table's own test."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import widegemv_sweep as sweep  # noqa: E402

from l2c.parser import parse_one  # noqa: E402
from l2c.validate import validate  # noqa: E402
from tests.toolchain import run_without_cutlass_wheel  # noqa: E402


def test_every_configuration_is_a_wide_row_major_gemv_of_its_class():
    for dtype in ("f16", "bf16"):
        for tile_m, specs in sweep.configurations(dtype).items():
            assert specs
            for name, text in specs.items():
                spec = parse_one(text)
                assert validate(spec, "cutlass").schedule == "gemv" and spec.name == name
                assert spec.tile_m == tile_m and spec.tile_n >= 64 and spec.layout_b == "row"
                assert spec.types_a == dtype
                # CUDA cores only through the shared-memory ring (loaded straight into registers they lost)
                assert (spec.pipeline_stages != "auto") == (spec.launch_cores == "cuda")
    assert [sweep.tile_m_class(m) for m in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]


def test_every_depth_adds_the_shallower_rings_of_the_same_tiles_and_slices():
    from l2c.shapes import read_shape_file
    for dtype in ("f16", "bf16"):
        deepest, every = sweep.configurations(dtype), sweep.configurations(dtype, every_depth=True)
        for tile_m in deepest:
            assert set(deepest[tile_m]) <= set(every[tile_m])
            stages = {}
            for text in every[tile_m].values():
                spec = parse_one(text)
                if spec.launch_cores == "cuda":
                    key = (spec.tile_n, spec.tile_k, spec.split_k_slices)
                    stages.setdefault(key, []).append(int(spec.pipeline_stages))
            for key, depths in stages.items():
                assert depths == sorted(depths, reverse=True) and set(depths) <= set(sweep.RING_STAGES)
                assert len(depths) > 1 or depths[0] == min(sweep.RING_STAGES)   # 2 stages fit wherever 3 do
    fit = read_shape_file(sweep.ROOT / "benchmarks" / "widegemv_fit.txt")
    assert fit and all(s.m <= 2 and s.n >= 4096 for s in fit)


def test_a_kernel_qualifies_where_it_is_slower_in_neither_protocol_and_ahead_by_3_percent_in_one(tmp_path):
    def row(name, m, protocol, speedup):
        return {"type": "result", "served_by": name, "m": m, "n": 64, "k": 64, "protocol": protocol,
                "status": "ok", "speedup": speedup}
    rows = [row("a", 1, "kernel", 1.0), row("a", 1, "call", 1.2),        # qualifies
            row("a", 2, "kernel", 0.99), row("a", 2, "call", 1.3),       # slower in device time
            row("a", 3, "kernel", 1.02), row("a", 3, "call", 1.02),      # ahead by less than 3% in both
            row("b", 1, "kernel", 1.1),                                   # one protocol only
            row("b", 2, "kernel", 1.1), row("b", 2, "call", 1.1), row("b", 2, "call", 0.9),   # its worst row lost
            row("torch", 4, "kernel", 1.0), row("torch", 4, "call", 1.0)]
    path = tmp_path / "sample.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"type": "env"}, *rows]) + "\n")
    assert sweep.qualified(path) == {"a": 1, "b": 0, "torch": 0}
    assert sweep.qualified(tmp_path / "missing.jsonl") == {}


def test_the_fit_ranks_configurations_per_class_by_geomean_over_every_shape_of_the_class(tmp_path):
    def row(name, m, n, speedup):
        return {"type": "result", "served_by": name, "m": m, "n": n, "k": 4096, "protocol": "kernel",
                "status": "ok", "speedup": speedup}
    rows = [row("a", 1, 4096, 1.2), row("a", 1, 8192, 0.9),      # geomean 1.039
            row("b", 1, 4096, 1.05), row("b", 1, 8192, 1.05),    # 1.05: first
            row("c", 1, 4096, 1.5),                              # missing one shape of its class: left out
            row("d", 2, 4096, 0.8), row("e", 2, 4096, 0.9)]
    path = tmp_path / "fit.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"type": "env"}, *rows]) + "\n")
    assert sweep.ranked_by_fit(path, keep=2) == {1: ["b", "a"], 2: ["e", "d"]}
    assert sweep.ranked_by_fit(path, keep=1) == {1: ["b"], 2: ["e"]}


def test_the_sweep_stops_before_building_where_the_cutlass_headers_are_missing(tmp_path):
    """Every configuration is a CUTLASS-target kernel built here: without the `nvidia-cutlass` wheel the sweep stops
    at once, naming it, and writes no results."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "widegemv_sweep.py"
    argv = [str(script), "--out", str(tmp_path), "--dtypes", "f16", "--budget-s", "5"]
    done = run_without_cutlass_wheel(argv, timeout=300)
    assert done.returncode != 0 and "pip install nvidia-cutlass" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not list(tmp_path.glob("*.jsonl"))
