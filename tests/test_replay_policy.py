"""scripts/replay_policy.py on bench-format rows with a planted structure: trained on the other folds, the policy
puts the planted best kernel first on held-out shapes, and the random-order baseline is the exact expectation."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from itertools import combinations
from pathlib import Path

from hypothesis import given, strategies as st

from l2c.ir import KernelSpec

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from replay_policy import expected_best_of_random  # noqa: E402


@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=8), st.integers(1, 9))
def test_expected_best_of_random_is_the_mean_over_all_subsets(values, k):
    subsets = list(combinations(values, min(k, len(values))))
    assert abs(expected_best_of_random(values, k) - sum(map(max, subsets)) / len(subsets)) < 1e-9


def test_the_policy_learns_a_planted_best_and_ranks_it_first_on_held_out_shapes(tmp_path):
    tiles = (16, 32, 64, 128)
    specs = {t: KernelSpec(name=f"t{t}", target="triton", tile_m=t, tile_n=64, tile_k=32).to_l2() for t in tiles}
    rng = random.Random(0)
    rows = [{"type": "env", "gpu": "NVIDIA H200", "date": "2026-11-30T00:00:00+00:00"}]
    for i in range(60):
        m, n, k = (rng.choice((64, 256, 1024, 4096)) for _ in range(3))
        for t in tiles:   # tile_m=64 is the best everywhere, by a margin
            speedup = (1.2 if t == 64 else 0.6 + 0.1 * rng.random())
            rows.append({"type": "result", "kernel": f"t{t}", "name": f"t{t}", "target": "triton", "m": m + i,
                         "n": n, "k": k, "batch": 1, "dtype": "f16", "layout": "row,row,row", "protocol": "kernel",
                         "status": "ok", "speedup": speedup, "candidate_tflops": speedup, "baseline_tflops": 1.0,
                         "spec": specs[t], "verified": True})
    screen = tmp_path / "screen.jsonl"
    screen.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "replay.json"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "replay_policy.py"), "--screens", str(screen),
                           "--folds", "3", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(out.read_text())["summary"]
    assert summary["problems"] == 60
    assert summary["policy_share_of_oracle_1"] >= 0.9
    assert summary["policy_best_of_1"] > summary["random_best_of_1"]
