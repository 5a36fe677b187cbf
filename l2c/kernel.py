"""The Kernel every target's builder returns, and what a call's checks and plans key by.

The call convention and attributes are the contract in docs/CONTRACTS.md; each target subclasses `Kernel`
(`l2c/targets/<target>/`).
"""
from __future__ import annotations

from .rules import ValidSpec


def call_signature(a, b, bias=None):
    """What a call's checks depend on apart from its pointers: shapes, strides, dtypes and devices of `a`, `b`
    and `bias` (None when an argument is not a tensor). CUTLASS kernels key their call plans by it and the
    dispatcher its resolutions, so one steady-state call reads these attributes the same way in both."""
    try:
        return (a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), b.dtype, b.get_device(),
                None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device()))
    except (AttributeError, TypeError):
        return None


def output_template(shape, dtype, device):
    """A one-element tensor expanded to `shape`: `torch.empty_like(template)` allocates a contiguous tensor of that
    shape, dtype and device from torch's caching allocator with one argument to parse, the cheapest allocation
    Python can ask for (on the H200 host `a.new_empty(shape, dtype=)` costs 4.4 us of a planned call's 19)."""
    import torch
    return torch.empty((1,) * len(shape), dtype=dtype, device=device).expand(*shape)


def cuda_accessors():
    """(current device index, raw cudaStream_t of a device's current stream) for the planned call paths: torch's
    private accessors, which Triton's launcher also uses (no Stream object built per call), else the public API."""
    import torch
    get_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
    get_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get_stream is None:
        def get_stream(device_index: int) -> int:
            return torch.cuda.current_stream(device_index).cuda_stream
    return get_device, get_stream


class Kernel:
    """A built GEMM kernel: `kernel(a, b, c=None, bias=None, out=None) -> out` (see docs/CONTRACTS.md)."""

    target: str = ""

    def __init__(self, valid: ValidSpec, source: str):
        self.valid = valid
        self.source = source

    @property
    def spec(self):
        return self.valid.spec

    def flops(self, m: int, n: int, k: int, batch: int = 1) -> int:
        """Floating-point operations of one call: 2*M*N*K multiply-adds per batch, twice that for a gated spec (its B
        has 2N columns; N is the output's); the epilogue is not counted."""
        return 2 * m * n * k * batch * (2 if self.spec.epilogue_gate != "none" else 1)

    def call_planned(self, key, a, b, bias=None):
        """`self(a, b, bias=bias)` (a call that allocates its output) with `key = call_signature(a, b, bias)`
        already computed: the dispatcher has it from its own lookup, and the planned fast paths key by it too."""
        return self(a, b, bias=bias)

    def launcher(self, key):
        """A function `(a, b, bias) -> out` that replays the plan an earlier allocating call of signature `key` made,
        returning None where it declines a call (a misaligned pointer, another current device), or None when there
        is no such plan. The dispatcher binds it once per signature, so that a served call is the signature, one
        lookup and this. The base has no plans."""
        return None

    def __call__(self, a, b, c=None, bias=None, out=None):
        """Launch the kernel (docs/CONTRACTS.md). Each target's subclass implements it; the base never runs."""
        raise NotImplementedError(f"{type(self).__name__} does not implement the launch")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.valid.name} ({self.target})>"
