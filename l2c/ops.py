"""The public entry points `l2c.matmul` and `l2c.gated_matmul`, and the torch custom ops through which
torch.compile and CUDA graphs see each call as one opaque op (its backward recomputed through torch, so compiled
graphs train). Eager calls go straight to the dispatcher: the custom-op layer costs microseconds and only tracing
needs it.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import dispatch
from .dispatch import b_map_index, default_dispatcher
from .epilogue import check_activation, check_gate, torch_gated, torch_matmul, torch_residual
from .native_call import activation_code
from .tuned_table import NO_LAYOUTS

_is_compiling = torch.compiler.is_compiling
# whether Dynamo is tracing this Python: about 50 ns cheaper than `_is_compiling`, which also asks TorchScript and
# torch.export; enough in front of the C++ call table, which leaves the calls of any tracing mode to the Python path
_is_dynamo_compiling = torch.compiler.is_dynamo_compiling


@torch.library.custom_op("l2c::matmul", mutates_args=())
def _matmul_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], activation: str) -> torch.Tensor:
    dispatcher = default_dispatcher()
    if dispatcher.native is not None:   # a compiled graph runs this eagerly: the same C++ call as eager calls
        y = dispatcher.native.call(a, b, bias, activation_code(activation))
        if y is not None:
            return y
    return dispatcher.matmul(a, b, bias=bias, activation=activation)


@_matmul_op.register_fake
def _(a, b, bias, activation):
    return a.new_empty((a.shape[0], b.shape[1]))


@torch.library.custom_op("l2c::addmm", mutates_args=())
def _addmm_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor) -> torch.Tensor:
    return default_dispatcher().matmul(a, b, bias=bias, residual=residual)


@_addmm_op.register_fake
def _(a, b, bias, residual):
    return a.new_empty((a.shape[0], b.shape[1]))


@torch.library.custom_op("l2c::gated_matmul", mutates_args=())
def _gated_matmul_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], gate: str) -> torch.Tensor:
    return default_dispatcher().gated_matmul(a, b, gate, bias)


@_gated_matmul_op.register_fake
def _(a, b, bias, gate):
    return a.new_empty((a.shape[0], b.shape[1] // 2))


def _recomputed_grads(fn, ctx, grad_out):
    """The gradients of `fn(*ctx.inputs)` (torch ops) at the saved inputs: what the custom ops' backward runs, so that
    a compiled graph trains through them (forward served by the dispatcher, backward by torch)."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(need) if isinstance(t, torch.Tensor) else t
                  for t, need in zip(_saved_inputs(ctx), ctx.needs_input_grad)]
        wanted = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        grads = iter(torch.autograd.grad(fn(*leaves), wanted, grad_out)) if wanted else iter(())
    return tuple(next(grads) if isinstance(t, torch.Tensor) and t.requires_grad else None for t in leaves)


def _save_inputs(ctx, inputs, output):
    """The op's inputs for its backward: the tensors through `save_for_backward`, so that one modified in place
    before the backward is an error (autograd's version check), as for torch's own ops."""
    ctx.tensor_at = [isinstance(t, torch.Tensor) for t in inputs]
    ctx.others = [None if tensor else t for t, tensor in zip(inputs, ctx.tensor_at)]
    ctx.save_for_backward(*(t for t in inputs if isinstance(t, torch.Tensor)))


def _saved_inputs(ctx) -> list:
    tensors = iter(ctx.saved_tensors)
    return [next(tensors) if tensor else other for tensor, other in zip(ctx.tensor_at, ctx.others)]


_matmul_op.register_autograd(
    lambda ctx, grad: _recomputed_grads(lambda a, b, bias, act: torch_matmul(a, b, bias, act, None), ctx, grad),
    setup_context=_save_inputs)
_addmm_op.register_autograd(lambda ctx, grad: _recomputed_grads(torch_residual, ctx, grad),
                            setup_context=_save_inputs)
_gated_matmul_op.register_autograd(lambda ctx, grad: _recomputed_grads(torch_gated, ctx, grad),
                                   setup_context=_save_inputs)


def matmul(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: Optional[str] = None, out: Optional[torch.Tensor] = None,
           residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`activation(a @ b + bias)`, or `residual + a @ b + bias`, through the tuned kernel for this shape, or torch
    when none serves it.

    a: (M, K), b: (K, N), bias: (N,) or None; activation: None | "relu" | "gelu" | "silu"; residual: (M, N) or None
    (added in the kernel's epilogue as its C input; no activation with it).
    Other ranks are handled by torch (3-D inputs are flattened by `l2c.nn.Linear` before they get here).
    """
    return matmul_with(dispatch._default or default_dispatcher(), a, b, bias, activation, out, residual)


def matmul_with(dispatcher, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
                activation: Optional[str] = None, out: Optional[torch.Tensor] = None,
                residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`matmul` through `dispatcher` (what `l2c bench dispatch:TABLE` times: a user's call with another table)."""
    if dispatcher.serves_nothing and bias is None and activation is None and residual is None:
        if not _is_compiling():   # (a count in a traced graph would make it guard on the count's value)
            dispatcher.counts["fallback"] += 1
        return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)
    # the C++ call table: the first test, then torch or a served plan, in one call (tested for tracing first, so that
    # a compiled graph does not guard on whether the table is attached yet)
    if out is None and residual is None and not _is_dynamo_compiling():
        native = dispatcher.native
        if native is not None:
            y = native.call(a, b, bias, 0 if activation is None else activation_code(activation))
            if y is not None:
                return y
    try:
        return _python_path(dispatcher, a, b, bias, activation, out, residual)
    except AttributeError:
        _refuse_non_tensors(a=a, b=b, bias=bias, out=out, residual=residual)
        raise


def _refuse_non_tensors(**arguments) -> None:
    """TypeError naming the first argument that is neither a tensor nor None, as torch.matmul's argument check
    names it: the dispatcher reads its operands' attributes without asking (an isinstance test per call would cost
    every call), so a list or an array met there raises AttributeError, which the entry points turn into this."""
    for name, value in arguments.items():
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"argument '{name}' must be Tensor, not {type(value).__name__}")


def _holds(ms, m) -> bool:
    """`m in ms` for a holder of `tuned_table.served_shapes`, in comparisons that torch.compile traces with a
    symbolic M (guarding on their outcome) where `range.__contains__` would make it fail."""
    return ms.start <= m < ms.stop if type(ms) is range else m in ms


def _python_path(dispatcher, a, b, bias, activation, out, residual):
    """A call the C++ call table did not take (not loaded, `out=`, a residual, tracing, or a call it leaves to
    Python: see l2c.native_call): the first test in Python, then the traced custom op or the dispatcher."""
    if residual is None and bias is None and activation is None:
        # the Ms an entry of a's dtype and b's layout serves at b's (K, N): empty where none (a b that is neither
        # row- nor column-major is the column-major map's to let through, and the signature's to refuse)
        ms = dispatcher.served_kn.get(a.dtype, NO_LAYOUTS)[b_map_index(b)][b.shape]
        m = a.shape[0] if a.ndim == 2 else None
        if not ms or (m is not None and not _holds(ms, m)):   # no entry for this (N, K) and M: torch, eager and traced
            if not _is_compiling():   # a count in a traced graph would make it guard on the count's value
                dispatcher.counts["fallback"] += 1
            return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)
    if _is_compiling():
        # traced as torch's ops where autocast would cast (the custom op would not), or where no kernel can serve
        # (no table for this GPU, no online choice: the compiler may then fuse the epilogue itself)
        if dispatch.autocast_recasts(a, b, bias, residual) or dispatcher.serves_nothing:
            if residual is not None:
                return torch_residual(a, b, bias, residual)
            return torch_matmul(a, b, bias, check_activation(activation), out)
        if out is None and a.dim() == 2 and b.dim() == 2:
            if residual is not None:
                if check_activation(activation) != "none":
                    raise ValueError("residual= adds the residual to the product: it takes no activation and no out=")
                return _addmm_op(a, b, bias, residual)
            return _matmul_op(a, b, bias, check_activation(activation))   # one opaque op in the traced graph
    # eager calls skip the custom-op dispatch layer: it costs microseconds and only tracing needs it
    return dispatcher.matmul(a, b, bias=bias, activation=activation, out=out, residual=residual)


def gated_matmul(a: torch.Tensor, b: torch.Tensor, gate: str, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The gated MLP projection `act(a @ b[:, :N] + bias[:N]) * (a @ b[:, N:] + bias[N:])` in one GEMM.

    a: (M, K); b: (K, 2N), the gate projection's N columns then the up projection's (the transpose of
    torch.cat([gate_proj.weight, up_proj.weight])); gate: "silu" (SwiGLU) or "gelu_tanh" (GeGLU); bias: (2N,) or
    None. A tuned kernel with the fused gated epilogue serves it only where the table holds an entry measured on this
    gated problem; otherwise torch runs the two halves' GEMMs apart (views, no copy), then act(g) * u.
    """
    dispatcher = dispatch._default or default_dispatcher()
    if torch.compiler.is_compiling():
        if dispatch.autocast_recasts(a, b, bias) or dispatcher.serves_nothing:   # torch's ops, as in `matmul_with`
            return torch_gated(a, b, bias, check_gate(gate))
        if a.dim() == 2 and b.dim() == 2:
            return _gated_matmul_op(a, b, bias, check_gate(gate))
    try:
        return dispatcher.gated_matmul(a, b, gate, bias)
    except AttributeError:
        _refuse_non_tensors(a=a, b=b, bias=bias)
        raise
