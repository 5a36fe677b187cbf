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
