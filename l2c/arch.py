"""Per-architecture facts that validation and the search read: shared memory per block, SMs, cluster size."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str
    smem_per_block: int     # bytes of shared memory one block may use (opt-in maximum)
    sm_count: int
    max_cluster: int        # portable thread-block cluster size


ARCHS = {
    # H100/H200: 227 KB of shared memory per block, 132 SMs (H200 SXM), clusters of up to 8 portable.
    "sm_90": Arch("sm_90", smem_per_block=227 * 1024, sm_count=132, max_cluster=8),
}
