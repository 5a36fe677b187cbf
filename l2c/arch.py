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


ARCHS = {
    # H100/H200: 227 KB of shared memory per block, 132 SMs (H200 SXM), clusters of up to 8 portable, 60 MB of L2,
    # 4.8 TB/s of HBM3e (H200), 989 dense fp16/bf16 TFLOP/s.
    "sm_90": Arch("sm_90", smem_per_block=227 * 1024, sm_count=132, max_cluster=8, l2_bytes=60 * 2**20,
                  hbm_bytes_per_s=4.8e12, peak_flops={"f16": 989e12, "bf16": 989e12, "f32": 494e12}),
}
