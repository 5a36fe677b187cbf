"""Per-architecture facts that validation, the cost model, online choice and the LLM prompt read: shared memory per
block, SMs, cluster size, L2, and the nominal rates (the measured ones come from l2c.roofline in each run)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict


@dataclass(frozen=True)
class Arch:
    name: str
    smem_per_block: int     # bytes of shared memory one block may use (opt-in maximum)
    sm_count: int
    max_cluster: int        # portable thread-block cluster size
    l2_bytes: int
    hbm_bytes_per_s: float  # nominal
    peak_flops: Dict[str, float] = field(default_factory=dict)   # dense tensor-core peak per input type (tf32 for f32)
    # cluster size -> how many such clusters run at once with one block per SM (cudaOccupancyMaxActiveClusters):
    # a clustered kernel's launch waves are counted in these, not in SMs / size
    max_active_clusters: Dict[int, int] = field(default_factory=dict)


ARCHS = {
    # H100/H200: 227 KB of shared memory per block, 132 SMs (H200 SXM), clusters of up to 8 portable, 60 MB of L2,
    # 4.8 TB/s of HBM3e (H200), 989 dense fp16/bf16 TFLOP/s.
    "sm_90": Arch("sm_90", smem_per_block=227 * 1024, sm_count=132, max_cluster=8, l2_bytes=60 * 2**20,
                  hbm_bytes_per_s=4.8e12, peak_flops={"f16": 989e12, "bf16": 989e12, "f32": 494e12},
                  # measured on the H200 (scripts/cluster_occupancy.py, benchmarks/results/s30/): clusters of 4 or 8
                  # fill 120 of the 132 SMs, as the GPCs' SM counts are not multiples of them
                  max_active_clusters={1: 132, 2: 66, 4: 30, 8: 15, 16: 7}),
}
