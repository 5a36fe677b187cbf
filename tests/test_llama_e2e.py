"""examples/llama_e2e.py in its tiny CPU mode: the whole script runs, writes the results schema, compares outputs, and
serves the fused gated kernel (Triton interpreter) wherever its table entry holds the MLP's shape."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from l2c.ir import KernelSpec
from l2c.knobs import ANY
from l2c.tuned_table import TunedEntry

pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parent.parent


def test_tiny_llama_end_to_end_on_the_cpu(tmp_path):
    spec = KernelSpec(name="swiglu", target="triton", problem_m=ANY, problem_n=160, problem_k=64, tile_m=16, tile_n=32,
                      tile_k=32, layout_b="col", swizzle_group=1, launch_warps=4, epilogue_gate="silu")
    entry = TunedEntry(m=24, n=160, k=64, batch=1, dtype="f16", layout="row,col,row", target="triton",
                       spec_text=spec.to_l2(), tflops=2.0, baseline_tflops=1.0, m_lo=16, m_hi=32, gate="silu")
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"format": 1, "arch": "sm_90", "entries": [entry.to_row()]}))
    out = tmp_path / "model.json"
    env = dict(os.environ, TRITON_INTERPRET="1", L2C_PREPARE="inline", L2C_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(REPO / "examples" / "llama_e2e.py"), "--tiny", "--device", "cpu",
                           "--out", str(out), "--table", str(table), "--dtypes", "fp16", "--mlp-tokens", "1,24",
                           "--prefill", "16", "--decode-batch", "2", "--decode-context", "8", "--reps", "2"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["outputs_match"] is True and "say nothing about GPU performance" in result["note"]
    assert result["config"]["intermediate_size"] == 160 and result["config"]["num_hidden_layers"] == 2
    by_tokens = {row["tokens"]: row for row in result["mlp"]}
    assert sorted(by_tokens) == [1, 24]
    for row in result["mlp"]:
        assert row["dtype"] == "fp16" and row["roofline_fraction"] is None      # no rates measured on a CPU
        assert row["speedup_vs_eager"] > 0 and row["speedup_vs_max_autotune"] > 0
        assert set(row["rel_error"]) == {"torch_max_autotune", "l2c", "l2c_compiled"}
        assert all(err < 1e-2 for err in row["rel_error"].values())
    assert by_tokens[24]["served_by"]["tuned"] == 1          # the gated kernel inside the M range (16-32)
    assert by_tokens[1]["served_by"] == {"tuned": 0, "fallback": 2}
    (prefill,) = result["prefill"]                            # 16 tokens: both layers' gate_up served
    assert prefill["served_by"]["tuned"] == 2 and prefill["l2c_tokens_per_s"] > 0
    (decode,) = result["decode"]
    assert decode["batch"] == 2 and decode["served_by"]["tuned"] == 0 and decode["torch_eager_tokens_per_s"] > 0
