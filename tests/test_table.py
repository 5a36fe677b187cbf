"""`l2c table`: a tuned table from recorded bench rows — the per-shape best verified candidate above a margin."""
import json
import subprocess
import sys

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
