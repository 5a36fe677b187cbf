"""`l2c.nn.Linear`: a drop-in `torch.nn.Linear` whose forward runs through `l2c.matmul`."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from . import dispatch
from .dispatch import check_activation, default_dispatcher, matmul


class Linear(torch.nn.Linear):
    """`y = activation(x @ W^T + b)`; same parameters and state dict as `torch.nn.Linear`.

    `activation` fuses relu/gelu/silu into the GEMM epilogue when a tuned kernel serves the shape.
    The weight is (out, in) row-major, so `W^T` is a column-major (in, out) operand: no copy is made.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 activation: Optional[str] = None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        check_activation(activation)
        self.activation = activation

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, activation: Optional[str] = None) -> "Linear":
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                  device=linear.weight.device, dtype=linear.weight.dtype, activation=activation)
        new.load_state_dict(linear.state_dict())
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():   # eager: straight to the dispatcher (F.linear when unserved)
            dispatcher = dispatch._default or default_dispatcher()
            if self.activation is None and self.in_features \
                    and not dispatcher.may_serve(x.numel() // self.in_features, self.out_features, self.in_features):
                dispatcher.stats["fallback"] += 1   # dispatcher.linear's first test, without its call: the hot path
                return F.linear(x, self.weight, self.bias)
            return dispatcher.linear(x, self.weight, self.bias, self.activation)
        lead = x.shape[:-1]
        y = matmul(x.reshape(-1, self.in_features), self.weight.t(), bias=self.bias, activation=self.activation)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation}" if self.activation else "")


def replace_linears(module: torch.nn.Module) -> torch.nn.Module:
    """Swap every `torch.nn.Linear` inside `module` for an `l2c.nn.Linear` with the same weights, in place."""
    for name, child in module.named_children():
        if type(child) is torch.nn.Linear:
            setattr(module, name, Linear.from_linear(child))
        else:
            replace_linears(child)
    return module
