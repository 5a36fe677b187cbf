"""scripts/serve_summary.py: #20's summary counts each shape once (its later row), never torch's A/A rows, and the
shapes whose row failed apart."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _row(m, speedup, kernel="linear:t", status="ok", fraction=0.9, dtype="f16"):
    row = {"type": "result", "kernel": kernel, "m": m, "n": 4096, "k": 4096, "batch": 1, "protocol": "kernel",
           "dtype": dtype, "layout": "row,col,row", "status": status, "served_by": "tuned"}
    if status == "ok":
        row.update(speedup=speedup, roofline_fraction=fraction,
                   baseline_roofline_fraction=None if fraction is None else fraction / speedup)
    return row


def test_each_shape_counts_once_torch_rows_never_and_failures_apart(tmp_path):
    first, later = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in [
        {"type": "env", "gpu": "NVIDIA H200"}, _row(1, 0.5), _row(2, 1.2), _row(1, 9.0, kernel="torch"),
        _row(4, None, status="error")]))
    later.write_text(json.dumps(_row(1, 1.1)) + "\n" + json.dumps(_row(8, 1.3, fraction=None)) + "\n")
    out = tmp_path / "s.json"
    done = subprocess.run([sys.executable, "scripts/serve_summary.py", first, later, "-o", out], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    fp16 = json.loads(out.read_text())["fp16"]
    assert fp16["shapes"] == 2 and fp16["failed"] == 2 and fp16["min_speedup"] == 1.1
