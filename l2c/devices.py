"""Where a measurement runs: the clock, synchronization, sleep and CUDA-graph replay of one device.

`CudaDevice` times with CUDA events and replays captured graphs; `CpuDevice` (no-op synchronize,
`time.perf_counter`) runs the same scheduling and statistics on CPU with interpreter-run Triton kernels, whose
figures say nothing about performance. The protocols in `l2c.measure` take either.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Tuple

import torch


class CpuDevice:
    """Host-only device: the interpreter runs kernels synchronously, so synchronize is a no-op.

    `l2_bytes` sizes buffer rotation in the `kernel` protocol (0: no rotation); tests set it to
    exercise rotation.
    """
    kind = "cpu"

    def __init__(self, l2_bytes: int = 0):
        self.torch_device = torch.device("cpu")
        self.l2_bytes = l2_bytes
        self.name = "CPU (Triton interpreter)"

    def synchronize(self) -> None:
        pass

    def clock(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def prepare(self, runners: Dict[str, Callable[[], None]], graphs: bool = True):
        return dict(runners), "eager"

    def time_runner(self, runner: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        runner()
        return time.perf_counter() - t0

    def warm_up(self, seconds: float) -> None:
        pass


class CudaDevice:
    """One CUDA GPU: CUDA events for device time, torch.cuda.synchronize, CUDA-graph replay."""
    kind = "cuda"

    def __init__(self, index: int = 0):
        self.torch_device = torch.device("cuda", index)
        props = torch.cuda.get_device_properties(self.torch_device)
        self.name = props.name
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.torch_device)

    def clock(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def prepare(self, runners: Dict[str, Callable[[], None]], graphs: bool = True):
        """Capture each runner in a CUDA graph; if any capture fails, every side runs eagerly (same method)."""
        if not graphs:
            return dict(runners), "eager"
        replays = {}
        try:
            for name, run in runners.items():
                side = torch.cuda.Stream(self.torch_device)
                side.wait_stream(torch.cuda.current_stream(self.torch_device))
                with torch.cuda.stream(side):
                    run()  # settle lazily created state (cuBLAS workspace, Triton compile) outside capture
                torch.cuda.current_stream(self.torch_device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    run()
                replays[name] = graph.replay
        except Exception:  # noqa: BLE001 - a kernel that cannot be captured is timed eagerly, both sides alike
            self.synchronize()
            return dict(runners), "eager"
        return replays, "graph"

    def time_runner(self, runner: Callable[[], None]) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        runner()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def warm_up(self, seconds: float) -> None:
        """Run large fp16 matmuls for `seconds` so clocks settle before the first figure."""
        if seconds <= 0:
            return
        a = torch.randn(4096, 4096, device=self.torch_device, dtype=torch.float16)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(10):
                torch.matmul(a, a)
            self.synchronize()


def get_device(kind: str):
    return CudaDevice() if kind == "cuda" else CpuDevice()


def gpu_identity() -> Tuple[str, str]:
    """(GPU name, driver version) that per-GPU records persisted in the cache belong to (online decisions,
    verified kernels); ("cpu", "none") without a GPU."""
    if not torch.cuda.is_available():
        return "cpu", "none"
    from .results_file import driver_version
    return torch.cuda.get_device_name(), driver_version() or "unknown"
