"""The roofline of a GEMM on this GPU: both rates measured in the run that uses them, and the fraction of the
floor each side of a measurement reached (memory-bound shapes are judged by it, ../shared/BENCHMARKING.md)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from .measure import TORCH_DTYPES, Problem, Timing


@dataclass(frozen=True)
class Ceilings:
    """The GPU's two rates, measured in the run that uses them: HBM read bandwidth (bytes/s, the better of a large
    GEMV through cuBLAS and a sum over 1 GiB) and the dense matrix rate per input dtype (FLOP/s, an 8192^3 product
    through cuBLAS)."""
    read_bytes_per_s: float
    dense_flops_per_s: Dict[str, float]

    def roofline_s(self, problem: Problem) -> float:
        """The floor on one call: max(bytes it must move / bandwidth, FLOPs / dense rate)."""
        return max(problem.footprint_bytes() / self.read_bytes_per_s,
                   problem.flops / self.dense_flops_per_s[problem.dtype])

    def as_row(self) -> Dict[str, object]:
        return {"read_bytes_per_s": self.read_bytes_per_s, "dense_flops_per_s": dict(self.dense_flops_per_s)}


def measure_ceilings(device, dtypes=("f16", "bf16"), reps: int = 10) -> Optional[Ceilings]:
    """Both ceilings on a CUDA device (None elsewhere): medians of `reps` timed batches after a warm-up."""
    if device.kind != "cuda":
        return None
    dev = device.torch_device
    weight = torch.randn(16384, 16384, device=dev, dtype=torch.float16)   # 512 MiB: far beyond the L2
    x = torch.randn(1, 16384, device=dev, dtype=torch.float16)

    def median_time(fn, per_batch: int) -> float:
        for _ in range(3):
            fn()
        device.synchronize()
        times = []
        for _ in range(reps):
            def batch():
                for _ in range(per_batch):
                    fn()
            times.append(device.time_runner(batch) / per_batch)
        return statistics.median(times)

    # The read rate is the best of two pure streams: cuBLAS's GEMV and a sum over 1 GiB (either alone can sit a
    # few percent under what a good kernel reaches, and a fraction of roofline above 1 says the ceiling was low).
    gemv = weight.numel() * weight.element_size() / median_time(lambda: torch.nn.functional.linear(x, weight), 5)
    del weight, x
    flat = torch.randn(2**29, device=dev, dtype=torch.float16)
    summed = flat.numel() * flat.element_size() / median_time(lambda: flat.sum(), 5)
    del flat
    bandwidth = max(gemv, summed)
    rates = {}
    for dtype in dtypes:
        a = torch.randn(8192, 8192, device=dev, dtype=TORCH_DTYPES[dtype])
        rates[dtype] = 2 * 8192 ** 3 / median_time(lambda: torch.matmul(a, a), 3)
        del a
    return Ceilings(bandwidth, rates)


def roofline_fields(problem: Problem, timing: Timing, ceilings: Ceilings) -> Dict[str, object]:
    """Fraction of the roofline each side reached in a `kernel` measurement (1.0: at the floor); none for a dtype
    whose dense rate the run did not measure (f32)."""
    if problem.dtype not in ceilings.dense_flops_per_s:
        return {}
    floor = ceilings.roofline_s(problem)
    return {"roofline_s": floor, "bytes": problem.footprint_bytes(),
            "roofline_fraction": floor / timing.candidate_s if timing.candidate_s > 0 else None,
            "baseline_roofline_fraction": floor / timing.baseline_s if timing.baseline_s > 0 else None}
