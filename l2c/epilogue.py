"""The epilogues as torch computes them: the activations, the gated product act(gate) * up, and the whole call
torch runs where no tuned kernel serves (`torch_matmul`, `torch_gated`, `torch_residual`). The dispatcher's
fallback, the measurement's baseline and verification's reference all use these, so the three agree on what each
epilogue means.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.nn.functional as F

ACTIVATIONS = ("none", "relu", "gelu", "silu")
GATES = ("silu", "gelu_tanh")   # the gated epilogues (epilogue gate): SwiGLU and GeGLU


def check_gate(gate: str) -> str:
    """`gate` if it names a gated epilogue; ValueError otherwise."""
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    return gate


def check_activation(activation: Optional[str]) -> str:
    """`activation` as the dispatcher names it ("none" for None); ValueError for one it does not know."""
    if activation is None:
        return "none"
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return activation


def activate(y, activation: str):
    """The activation as torch applies it after a GEMM (GELU in its exact erf form)."""
    if activation == "relu":
        return F.relu(y)
    if activation == "gelu":
        return F.gelu(y)
    if activation == "silu":
        return F.silu(y)
    return y


def gate_activation(g, gate: str):
    """The gated epilogue's activation of the gate half: SiLU (SwiGLU) or GELU-tanh (GeGLU)."""
    return F.silu(g) if gate == "silu" else F.gelu(g, approximate="tanh")


def gate_product(y, gate: str):
    """act(gate half) * up half of a product over the concatenated weights (..., 2N) -> (..., N)."""
    g, u = y.chunk(2, dim=-1)
    return gate_activation(g, gate) * u


def torch_gated(a, b, bias, gate):
    """What torch runs for a gated call: the gate's and the up projection's GEMMs apart (b's column halves, views),
    then act(g) * u, as the MLP modules l2c replaces do. One GEMM over both halves was measured slower on the H200
    (cuBLAS's pick for 2N columns: 0.91-0.99x at 512-8192 tokens of Llama-8B's MLP), and a fallback slower than
    the module it replaces would make a model slower."""
    if b.shape[-1] % 2:
        raise ValueError(f"a gated call's b holds the gate's columns then the up projection's: an even width, got "
                         f"{b.shape[-1]}")
    n = b.shape[-1] // 2
    g, u = (torch_matmul(a, b[..., cols], None if bias is None else bias[cols], "none", None)
            for cols in (slice(0, n), slice(n, 2 * n)))
    return gate_activation(g, gate) * u


def torch_gated_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], gate: str) -> torch.Tensor:
    """`torch_gated` for nn.Linear's layout: weight (2N, K), the gate's rows then the up projection's, two F.linear
    calls on the halves (views) as the replaced MLP module runs them (and a scripted GatedMLP: typed for
    TorchScript)."""
    if weight.shape[0] % 2:
        raise ValueError(f"a gated weight holds the gate's rows then the up projection's: an even count, got "
                         f"{weight.shape[0]}")
    n = weight.shape[0] // 2
    g = F.linear(x, weight[:n], None if bias is None else bias[:n])
    u = F.linear(x, weight[n:], None if bias is None else bias[n:])
    return gate_activation(g, gate) * u


def torch_residual(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor],
                   residual: torch.Tensor) -> torch.Tensor:
    """residual + a @ b (+ bias) as torch runs it: cuBLAS adds the residual in the GEMM (addmm, beta=1). Typed for
    TorchScript (a scripted l2c.nn.Linear)."""
    y = torch.addmm(residual, a, b) if a.dim() == 2 and b.dim() == 2 else residual + torch.matmul(a, b)
    return y if bias is None else y + bias


def torch_matmul(a, b, bias, activation, out):
    """What torch runs for the call: one cuBLAS call (bias fused by addmm for 2-D inputs, which casts under autocast
    and refuses a bias of another dtype, as F.linear does), then the activation."""
    fused = bias is not None and a.dim() == 2 and b.dim() == 2
    if activation == "none":
        if bias is None:
            return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)
        if fused:
            return torch.addmm(bias, a, b) if out is None else torch.addmm(bias, a, b, out=out)
    if fused:
        y = activate(torch.addmm(bias, a, b), activation)
    else:
        y = torch.matmul(a, b)
        y = activate(y if bias is None else y + bias, activation)
    return y if out is None else _write_out(out, y)


def _write_out(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`y` written into `out` as torch.matmul(out=) writes its result: refused where autograd would record it
    (out= ops have no derivative) and for another dtype (never a silent cast); an out of another shape is resized,
    with torch's deprecation warning unless it is empty."""
    if y.requires_grad or (out.requires_grad and torch.is_grad_enabled()):
        raise RuntimeError("matmul(): functions with out=... arguments don't support automatic differentiation, but "
                           "one of the arguments requires grad.")
    if out.dtype != y.dtype:
        raise RuntimeError(f"out= must be a {y.dtype} tensor, got {out.dtype}")
    if out.shape != y.shape:
        if out.numel():
            warnings.warn(f"An output with one or more elements was resized since it had shape {list(out.shape)}, "
                          f"which does not match the required output shape {list(y.shape)}. This behavior is "
                          "deprecated, and in a future PyTorch release outputs will not be resized unless they have "
                          "zero elements. You can explicitly reuse an out tensor t by resizing it, inplace, to zero "
                          "elements with t.resize_(0).", UserWarning, stacklevel=2)
        out.resize_(y.shape)
    return out.copy_(y)
