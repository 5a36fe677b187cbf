"""`l2c.nn.Linear`: a drop-in `torch.nn.Linear` whose forward runs through `l2c.matmul`; `l2c.nn.GatedMLP`: a gated
MLP block (Llama, Mistral, Qwen2) as one GEMM with a fused act(gate) * up epilogue plus the down projection."""
from __future__ import annotations

import copy
import logging
import weakref
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from . import dispatch
from .dispatch import default_dispatcher
from .epilogue import activate, check_activation, check_gate, torch_gated_linear, torch_residual
from .native_call import activation_code
from .ops import gated_matmul, matmul
from .tuned_table import NO_SHAPES

log = logging.getLogger("l2c.nn")
_is_compiling = torch.compiler.is_compiling


class Linear(torch.nn.Linear):
    """`y = activation(x @ W^T + b)`; same parameters and state dict as `torch.nn.Linear`.

    `activation` fuses relu/gelu/silu into the GEMM epilogue when a tuned kernel serves the shape.
    The weight is (out, in) row-major, so `W^T` is a column-major (in, out) operand: no copy is made.
    Under `torch.jit.script` the layer runs torch's ops (`_scripted`): a scripted model runs without Python.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 activation: Optional[str] = None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        check_activation(activation)
        self.activation = activation
        default_dispatcher()   # made here, not where torch.compile traces the first call (its lock breaks the graph)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, activation: Optional[str] = None) -> "Linear":
        """An l2c Linear holding `linear`'s own Parameter objects (tied weights stay tied, frozen ones frozen);
        ValueError for a Linear with parametrizations (weight_norm, spectral_norm: its weight is computed)."""
        if torch.nn.utils.parametrize.is_parametrized(linear):
            raise ValueError("from_linear takes a Linear without parametrizations (its weight is computed from "
                             "them); remove them first (torch.nn.utils.parametrize.remove_parametrizations)")
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta",
                  dtype=linear.weight.dtype, activation=activation)
        new.weight, new.bias = linear.weight, linear.bias
        return new

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`activation(x @ W^T + b)`, or `residual + x @ W^T + b` (the residual added in the GEMM's epilogue; any
        shape that broadcasts against the output, or (tokens, N): `residual_rows`)."""
        if torch.jit.is_scripting():   # TorchScript runs no Python: torch's ops, as nn.Linear then the activation
            return self._scripted(x, residual)   # (TorchScript compiles nothing below this return)
        dispatcher = dispatch._default or default_dispatcher()
        if residual is not None:
            residual = residual_rows(residual, list(x.shape[:-1]), self.out_features)
        if not _is_compiling():   # eager: the dispatcher's path, its C++ call table first
            return dispatcher.linear(x, self.weight, self.bias, self.activation, residual=residual)
        if dispatcher.serves_nothing:   # no table for this GPU, no online choice: torch's ops in the traced graph
            return self._scripted(x, residual)
        served = dispatcher.served_nk.get(self.weight.dtype, NO_SHAPES)
        if self.activation is None and residual is None and not served[self.out_features, self.in_features]:
            return F.linear(x, self.weight, self.bias)   # no entry for this (N, K): F.linear in the traced graph
        lead = x.shape[:-1]
        y = matmul(x.reshape(-1, self.in_features), self.weight.t(), bias=self.bias, activation=self.activation,
                   residual=residual)
        return y.reshape(*lead, self.out_features)

    def _scripted(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """What the layer computes in torch's ops alone (under `torch.jit.script`)."""
        activation = self.activation
        if residual is not None:   # as the dispatcher's fallback runs it: addmm adds the residual
            if activation is not None:
                raise ValueError("residual= adds the residual to the product: it takes no activation")
            y = torch_residual(x.reshape(-1, self.in_features), self.weight.t(), self.bias,
                               residual_rows(residual, list(x.shape[:-1]), self.out_features))
            return y.reshape(list(x.shape[:-1]) + [self.out_features])
        y = F.linear(x, self.weight, self.bias)
        return y if activation is None else activate(y, activation)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation}" if self.activation else "")


def residual_rows(residual: torch.Tensor, lead: List[int], n: int) -> torch.Tensor:
    """`residual` as the GEMM's epilogue adds it to the (tokens, n) product of an input of leading shape `lead`:
    a (tokens, n) matrix as it is; one that broadcasts against the output (*lead, n) as `residual + y` would, as a
    (1, n) row or expanded; ValueError for any other shape (reshaped, its rows would meet other tokens')."""
    tokens = 1
    for size in lead:
        tokens *= size
    shape = list(residual.shape)
    if len(shape) == 2 and shape[0] == tokens and shape[1] == n:
        return residual
    out = lead + [n]
    fits = len(shape) <= len(out)
    for i in range(1, min(len(shape), len(out)) + 1):
        fits = fits and shape[-i] in (1, out[-i])
    if not fits:
        raise ValueError(f"residual of shape {shape} does not broadcast to the output's shape {out}")
    if len(shape) > 0 and shape[-1] == n and residual.numel() == n:
        return residual.reshape(1, n)
    return residual.expand(out).reshape(tokens, n)


# the attribute's type for TorchScript, as an object: this module's annotations are strings it cannot resolve
Linear.__annotations__ = {**getattr(Linear, "__annotations__", {}), "activation": Optional[str]}


def replace_linears(module: torch.nn.Module) -> torch.nn.Module:
    """Make every `torch.nn.Linear` inside `module` an `l2c.nn.Linear`, in place: the same module object of the
    subclass, so its Parameters (tied, frozen or not), hooks and training mode are what they were. Makes the default
    dispatcher, as `Linear()` does."""
    default_dispatcher()
    for child in module.modules():
        if type(child) is torch.nn.Linear:
            child.__class__ = Linear
            child.activation = None
    return module


GATED_MLP_PARTS = ("gate_proj", "up_proj", "down_proj")


class GatedMLP(torch.nn.Module):
    """`down(act(gate(x)) * up(x))`, the MLP of Llama, Mistral and Qwen2, as two GEMMs: one over the concatenated
    gate and up weights whose epilogue writes only act(gate) * up (`l2c.gated_matmul`), then the down projection.

    `gate_up_proj.weight` is (2I, H): rows [0, I) are gate_proj's weight, rows [I, 2I) up_proj's (its transpose is
    the K x 2N operand of the gated kernel, read column-major without a copy); `down_proj` is an `l2c.nn.Linear`.
    Where no table entry measured on this gated problem serves a call, torch runs it as the replaced module does:
    F.linear over each half (views of the one weight), then act(g) * u.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, gate: str = "silu", bias: bool = False,
                 down_bias: Optional[bool] = None, device=None, dtype=None):
        super().__init__()
        self.gate = check_gate(gate)
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=bias, device=device, dtype=dtype)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias if down_bias is None else down_bias,
                                device=device, dtype=dtype)
        self.register_state_dict_post_hook(GatedMLP._split_state)
        self.register_load_state_dict_pre_hook(GatedMLP._join_state)

    @classmethod
    def from_hf(cls, mlp: torch.nn.Module) -> "GatedMLP":
        """The same block with `mlp`'s weights (a Hugging Face LlamaMLP, MistralMLP, Qwen2MLP or any module with
        Linear gate_proj, up_proj and down_proj and an act_fn); ValueError for an activation other than SiLU or GELU's
        tanh form, projections whose shapes do not make such a block, or a forward that computes anything else
        (`_check_plain_forward`)."""
        gate_proj, up_proj, down_proj = (getattr(mlp, name) for name in GATED_MLP_PARTS)
        _check_swappable(mlp)
        gate = gate_of(mlp.act_fn)
        inter, hidden = gate_proj.weight.shape
        if tuple(up_proj.weight.shape) != (inter, hidden) or tuple(down_proj.weight.shape) != (hidden, inter):
            raise ValueError(f"{type(mlp).__name__}: gate_proj {tuple(gate_proj.weight.shape)}, up_proj "
                             f"{tuple(up_proj.weight.shape)} and down_proj {tuple(down_proj.weight.shape)} are not "
                             "the (I, H), (I, H) and (H, I) weights of a gated MLP")
        _check_fusable(mlp, gate_proj, up_proj)
        _check_plain_forward(mlp)
        weight = gate_proj.weight
        has_bias = gate_proj.bias is not None
        # built on the meta device and then given storage: no initialisation of weights about to be overwritten
        new = cls(hidden, inter, gate, bias=has_bias, down_bias=down_proj.bias is not None, device="meta",
                  dtype=weight.dtype).to_empty(device=weight.device)
        with torch.no_grad():
            new.gate_up_proj.weight.copy_(torch.cat([gate_proj.weight, up_proj.weight]))
            if has_bias:
                new.gate_up_proj.bias.copy_(torch.cat([gate_proj.bias, up_proj.bias]))
        new.gate_up_proj.weight.requires_grad_(gate_proj.weight.requires_grad)   # frozen stays frozen
        if has_bias:
            new.gate_up_proj.bias.requires_grad_(gate_proj.bias.requires_grad)
        new.down_proj = Linear.from_linear(down_proj)   # its own Parameters: ties, optimizer and frozen state stay
        new.train(mlp.training)
        return new

    @staticmethod
    def _split_state(module, state_dict, prefix, local_metadata) -> None:
        """state_dict() under the replaced module's keys (gate_proj.*, up_proj.*, down_proj.*): a checkpoint saved
        after the swap loads into the original model class (`save_pretrained` / `from_pretrained`)."""
        for kind in ("weight", "bias"):
            fused = state_dict.pop(f"{prefix}gate_up_proj.{kind}", None)
            if fused is not None:
                gate, up = fused.chunk(2)
                state_dict[f"{prefix}gate_proj.{kind}"] = gate
                state_dict[f"{prefix}up_proj.{kind}"] = up

    @staticmethod
    def _join_state(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                    error_msgs) -> None:
        """load_state_dict() of the replaced module's keys (or of this module's own). A dict holding one half only
        (a shard of a checkpoint, a partial load) loads that half and keeps the other as it is, reported missing as
        the replaced module would report it."""
        fused = {"weight": module.gate_up_proj.weight, "bias": module.gate_up_proj.bias}
        for kind, current in fused.items():
            names = (f"{prefix}gate_proj.{kind}", f"{prefix}up_proj.{kind}")
            if current is None or not any(name in state_dict for name in names):
                continue   # a bias this module lacks stays in the dict: an unexpected key, as for the replaced module
            halves = [state_dict.get(name) for name in names]
            if None in halves:
                present = next(half for half in halves if half is not None)
                if current.is_meta:   # nothing to keep: the half stays an unexpected key, the weight missing
                    continue
                kept = current.detach().to(present.device).chunk(2)
                missing_keys.extend(name for name, half in zip(names, halves) if half is None)
                halves = [kept[i] if half is None else half for i, half in enumerate(halves)]
            for name in names:
                state_dict.pop(name, None)
            state_dict[f"{prefix}gate_up_proj.{kind}"] = torch.cat(halves)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The block's output; with `residual`, residual + the block's output, added in the down projection's GEMM."""
        weight, bias = self.gate_up_proj.weight, self.gate_up_proj.bias
        if torch.jit.is_scripting():   # torch's ops, as the replaced module runs them (see Linear.forward)
            return self.down_proj(torch_gated_linear(x, weight, bias, self.gate), residual=residual)
        if not torch.compiler.is_compiling():
            h = (dispatch._default or default_dispatcher()).gated_linear(x, weight, self.gate, bias)
        else:
            lead = x.shape[:-1]
            h = gated_matmul(x.reshape(-1, self.hidden_size), weight.t(), self.gate, bias)
            h = h.reshape(*lead, self.intermediate_size)
        return self.down_proj(h, residual=residual)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, gate={self.gate}"


def gate_of(act_fn) -> str:
    """The gated epilogue that computes `act_fn`: "silu" or "gelu_tanh", told by what it computes (Hugging Face's
    activation classes differ between versions), on float64 values from -20 to 20; ValueError for anything else
    (GELU's exact erf form, QuickGELU, ReLU, ...)."""
    x = torch.linspace(-20, 20, 4001, dtype=torch.float64)
    try:
        y = act_fn(x)
    except Exception as err:  # noqa: BLE001 - whatever it is, it is not an activation l2c knows
        raise ValueError(f"act_fn {act_fn!r} cannot be evaluated on a float64 tensor: {err}") from None
    for gate, ref in (("silu", F.silu(x)), ("gelu_tanh", F.gelu(x, approximate="tanh"))):
        if isinstance(y, torch.Tensor) and y.shape == x.shape and torch.allclose(y, ref, rtol=1e-6, atol=1e-9):
            return gate
    raise ValueError(f"act_fn {act_fn!r} is neither SiLU nor GELU's tanh form: l2c has no gated epilogue for it")


def _check_swappable(mlp: torch.nn.Module) -> None:
    """ValueError unless the swap keeps everything `mlp` does: its projections are plain `torch.nn.Linear` (or
    l2c's, without an activation; another subclass, a quantized linear among them, computes something else from its
    weight) in a float type holding a weight and a bias only, the MLP holds no state besides them, and neither it,
    they nor its activation module carry hooks, parametrizations or a forward set on the instance (an adapter patched
    in, accelerate's hooks): the swap would drop them."""
    parts = [getattr(mlp, name) for name in GATED_MLP_PARTS]
    if any(type(part) is not torch.nn.Linear and not (type(part) is Linear and part.activation is None)
           for part in parts):
        raise ValueError(f"{type(mlp).__name__}: its projections are not plain torch.nn.Linear "
                         f"({', '.join(sorted({type(part).__name__ for part in parts}))})")
    if any(not part.weight.is_floating_point() or part.weight.dtype not in (torch.float16, torch.bfloat16,
                                                                             torch.float32) for part in parts):
        raise ValueError(f"{type(mlp).__name__}: its weights are not f16, bf16 or f32")
    act = mlp.act_fn if isinstance(mlp.act_fn, torch.nn.Module) else None
    for module in [mlp, *parts] + ([act] if act is not None else []):
        hooks = (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks,
                 getattr(module, "_backward_pre_hooks", {}), getattr(module, "parametrizations", {}))
        if any(hooks) or "forward" in vars(module) or hasattr(module, "_hf_hook"):
            raise ValueError(f"{type(mlp).__name__}: it, a projection or its activation carries hooks, "
                             "parametrizations or a patched forward, which a GatedMLP would drop")
    if any(set(part._parameters) - {"weight", "bias"} or part._buffers or part._modules for part in parts):
        raise ValueError(f"{type(mlp).__name__}: a projection holds more than a weight and a bias")
    own = {id(p) for part in parts for p in part.parameters()}
    if any(id(p) not in own for p in mlp.parameters()) or next(mlp.buffers(), None) is not None:
        raise ValueError(f"{type(mlp).__name__}: it holds parameters or buffers besides its projections'")


def _check_fusable(mlp: torch.nn.Module, gate_proj: torch.nn.Linear, up_proj: torch.nn.Linear) -> None:
    """ValueError unless gate_proj and up_proj can become one Parameter (and one bias) without changing anything:
    the same dtype and device, both with a bias or neither, both frozen or both trainable."""
    kinds = [("weight", gate_proj.weight, up_proj.weight)]
    if (gate_proj.bias is None) != (up_proj.bias is None):
        raise ValueError(f"{type(mlp).__name__}: a bias on one of gate_proj and up_proj only")
    if gate_proj.bias is not None:
        kinds.append(("bias", gate_proj.bias, up_proj.bias))
    for kind, gate, up in kinds:
        if gate.dtype != up.dtype or gate.device != up.device:
            raise ValueError(f"{type(mlp).__name__}: gate_proj's and up_proj's {kind} differ in dtype or device")
        if gate.requires_grad != up.requires_grad:
            raise ValueError(f"{type(mlp).__name__}: one of gate_proj's and up_proj's {kind} is frozen and the "
                             "other is not; one fused Parameter cannot keep both")


# Standard deviation of the gate's pre-activation in the second probe: past the clamps some MLPs put on it (7-10)
PROBE_LARGE_GATE = 32.0


def _check_plain_forward(mlp: torch.nn.Module) -> None:
    """ValueError unless `mlp(x)` is `down_proj(act_fn(gate_proj(x)) * up_proj(x))` on probe inputs, in training
    mode as in eval mode and at pre-activations far past unit scale: modules with the same parts may add a step
    (Gemma 3n's activation sparsity, Falcon-H1's multipliers, BitNet's norm before down_proj, clamps of the gate,
    dropout while training) that a GatedMLP would silently drop. Runs under the module's own RNG state restored."""
    weight = mlp.gate_proj.weight
    if weight.device.type == "meta":
        raise ValueError(f"{type(mlp).__name__} has its weights on the meta device: its forward cannot be checked")
    generator = torch.Generator(device=weight.device).manual_seed(0)
    x = torch.randn(4, weight.shape[1], generator=generator, device=weight.device, dtype=weight.dtype)
    training = mlp.training
    devices = [weight.device] if weight.device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            spread = float(mlp.gate_proj(x).float().std()) or 1.0
            for scale in (1.0, PROBE_LARGE_GATE / spread):
                for mode in (False, True):
                    mlp.train(mode)
                    if not _same_as_plain(mlp, x * scale):
                        raise ValueError(f"{type(mlp).__name__}'s forward is not down_proj(act_fn(gate_proj(x)) * "
                                         f"up_proj(x)){' while training' if mode else ''}: a GatedMLP would change "
                                         "its output")
    except ValueError:
        raise
    except Exception as err:  # noqa: BLE001 - a forward that takes more than x is not the plain block
        raise ValueError(f"{type(mlp).__name__}'s forward cannot be checked on one input: {err}") from None
    finally:
        mlp.train(training)


def _same_as_plain(mlp: torch.nn.Module, probe: torch.Tensor, widened: bool = False) -> bool:
    """Whether `mlp(probe)` is the plain gated block's output. Where either overflows the weights' type (large
    pre-activations in f16), a float32 copy of the MLP answers instead; ValueError where that overflows too."""
    got = mlp(probe)
    plain = mlp.down_proj(mlp.act_fn(mlp.gate_proj(probe)) * mlp.up_proj(probe))
    if not isinstance(got, torch.Tensor) or got.shape != plain.shape:
        return False
    if not (torch.isfinite(plain).all() and torch.isfinite(got).all()):
        if widened or probe.dtype == torch.float32:
            raise ValueError(f"{type(mlp).__name__}'s output on the probe input is not finite: its forward cannot "
                             "be checked")
        wide = copy.deepcopy(mlp).float()
        wide.train(mlp.training)
        return _same_as_plain(wide, probe.float(), widened=True)
    return torch.allclose(got.float(), plain.float(), rtol=1e-3, atol=1e-3 * float(plain.abs().max()) + 1e-6)


def is_gated_mlp(module: torch.nn.Module) -> bool:
    """Whether `module` has the parts of a gated MLP: Linear gate_proj, up_proj and down_proj, and an act_fn."""
    return all(isinstance(getattr(module, name, None), torch.nn.Linear) for name in GATED_MLP_PARTS) \
        and callable(getattr(module, "act_fn", None))


def replace_mlps(module: torch.nn.Module, linears: bool = True) -> torch.nn.Module:
    """Swap every gated MLP inside `module` (Hugging Face LlamaMLP, MistralMLP, Qwen2MLP: `is_gated_mlp`) for a
    `GatedMLP` with the same weights, in place; then, with `linears`, every remaining `torch.nn.Linear` for an
    `l2c.nn.Linear` (`replace_linears`). An MLP whose activation has no gated epilogue is left as it is (logged)."""
    _swap_mlps(module)
    return replace_linears(module) if linears else module


def _swap_mlps(module: torch.nn.Module, swapped: Optional[dict] = None) -> None:
    """The swap, depth first; `swapped` maps each MLP already met (by identity) to its GatedMLP (None: left as it
    is), so an MLP reachable from two places stays one module. An MLP whose gate or up projection's Parameters
    something else holds too (another MLP, a tie) is left as it is: the fused weight is a new Parameter, which would
    untie them. Each MLP is held by a weak reference only (a live one tells its id from a later object's): a swapped
    MLP is freed at once, so the model's gate and up weights are never held twice over."""
    if swapped is None:
        swapped = {}
        for mlp in _sharing_gate_or_up(module):
            swapped[id(mlp)] = (weakref.ref(mlp), None)
            log.warning("l2c.nn.replace_mlps: a %s left as it is: its gate or up projection's Parameters are shared "
                        "with another module", type(mlp).__name__)
    for name in list(module._modules):   # by name: named_children() would hold every child till the loop's end
        child = module._modules[name]
        if child is None:
            continue
        met, gated = swapped.get(id(child), (None, None))
        if met is not None and met() is child:
            if gated is not None:
                setattr(module, name, gated)
        elif is_gated_mlp(child):
            try:
                gated = GatedMLP.from_hf(child)
                setattr(module, name, gated)
            except ValueError as err:
                gated = None
                log.warning("l2c.nn.replace_mlps: %s left as it is: %s", name, err)
            swapped[id(child)] = (weakref.ref(child), gated)
        else:
            _swap_mlps(child, swapped)


def _sharing_gate_or_up(root: torch.nn.Module) -> List[torch.nn.Module]:
    """The gated MLPs under `root` whose gate_proj or up_proj Parameters are held by another module too (counting
    each module once, however many places reach it)."""
    holders: Dict[int, set] = {}
    for owner in root.modules():   # each module once
        for child in owner._modules.values():
            if child is not None:
                holders.setdefault(id(child), set()).add(id(owner))
        for parameter in owner._parameters.values():
            if parameter is not None:
                holders.setdefault(id(parameter), set()).add(id(owner))
    shared = []
    for mlp in root.modules():
        if is_gated_mlp(mlp):
            parts = (mlp.gate_proj, mlp.up_proj)
            if any(len(holders.get(id(part), ())) > 1 for part in parts) or \
                    any(len(holders.get(id(p), ())) > 1 for part in parts for p in part.parameters()):
                shared.append(mlp)
    return shared
