"""`l2c.nn.GatedMLP` and `l2c.nn.replace_mlps` on real Hugging Face model classes with tiny random configs: the swap
keeps the logits, recognises the activation, and serves the fused gated kernel inside the model (interpreter)."""
import logging

import pytest
import torch

import l2c
from l2c.dispatch import set_tuned_table
from l2c.ir import KernelSpec
from l2c.knobs import ANY
from l2c.tuned_table import TunedEntry, TunedTable

transformers = pytest.importorskip("transformers")
from transformers.activations import ACT2FN  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=64)


@pytest.fixture(scope="module", autouse=True)
def _cache_in_tmp(cache_in_tmp):
    """Every kernel of this module is built into a cache of its own."""


def tiny_model(kind="llama", dtype=torch.float32, **overrides):
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[kind]
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**TINY, **overrides})).eval()
    return model.to(dtype)


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def mlps(model):
    return [layer.mlp for layer in model.model.layers]


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_replace_mlps_keeps_the_logits(kind):
    set_tuned_table(None)
    model = tiny_model(kind)
    ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    want = logits(model, ids)
    assert l2c.nn.replace_mlps(model) is model
    assert all(type(m) is l2c.nn.GatedMLP and m.gate == "silu" for m in mlps(model))
    assert not [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]   # replace_linears did the rest
    torch.testing.assert_close(logits(model, ids), want, rtol=1e-5, atol=1e-5)


def test_gelu_tanh_is_recognised_and_other_activations_are_left_alone(caplog):
    set_tuned_table(None)
    model = tiny_model(hidden_act="gelu_pytorch_tanh")
    ids = torch.randint(0, TINY["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(2))
    want = logits(model, ids)
    l2c.nn.replace_mlps(model)
    assert all(m.gate == "gelu_tanh" for m in mlps(model))
    torch.testing.assert_close(logits(model, ids), want, rtol=1e-5, atol=1e-5)
    erf = tiny_model(hidden_act="gelu")   # exact GELU: no gated epilogue computes it
    want = logits(erf, ids)
    with caplog.at_level(logging.WARNING, logger="l2c.nn"):
        l2c.nn.replace_mlps(erf)
    assert all(type(m).__name__ == "LlamaMLP" for m in mlps(erf)) and "neither SiLU nor GELU's tanh" in caplog.text
    assert all(type(m.gate_proj) is l2c.nn.Linear for m in mlps(erf))   # its projections are still swapped
    torch.testing.assert_close(logits(erf, ids), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, gate", [("silu", "silu"), ("swish", "silu"), ("gelu_pytorch_tanh", "gelu_tanh"),
                                        ("gelu_new", "gelu_tanh"), ("gelu", None), ("quick_gelu", None),
                                        ("relu", None)])
def test_gate_of_tells_activations_by_what_they_compute(name, gate):
    if gate is None:
        with pytest.raises(ValueError, match="no gated epilogue"):
            l2c.nn.gate_of(ACT2FN[name])
    else:
        assert l2c.nn.gate_of(ACT2FN[name]) == gate


def test_from_hf_copies_biases_and_keeps_the_output():
    set_tuned_table(None)
    model = tiny_model(mlp_bias=True)
    mlp = mlps(model)[0]
    new = l2c.nn.GatedMLP.from_hf(mlp)
    torch.testing.assert_close(new.gate_up_proj.bias, torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias]))
    x = torch.randn(3, 5, TINY["hidden_size"])
    with torch.no_grad():
        torch.testing.assert_close(new(x), mlp(x), rtol=1e-5, atol=1e-5)
        r = torch.randn(3, 5, TINY["hidden_size"])
        torch.testing.assert_close(new(x, residual=r), r + mlp(x), rtol=1e-5, atol=1e-5)


def test_the_fused_gated_kernel_runs_inside_the_model():
    """A fp16 Llama whose gate_up shape (M = 2 x 12 tokens, N = 160, K = 64) a gated table entry serves: every MLP's
    first GEMM is the Triton kernel (interpreter), the logits match the unswapped model."""
    model = tiny_model(dtype=torch.float16)
    ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(3))
    want = logits(model, ids).double()
    spec = KernelSpec(name="swiglu", target="triton", problem_n=160, problem_k=64, problem_m=ANY, tile_m=16,
                      tile_n=32, tile_k=32, layout_b="col", swizzle_group=1, launch_warps=4, epilogue_gate="silu")
    entry = TunedEntry(m=24, n=160, k=64, batch=1, dtype="f16", layout="row,col,row", target="triton",
                       spec_text=spec.to_l2(), tflops=2.0, baseline_tflops=1.0, m_lo=16, m_hi=32, gate="silu")
    dispatcher = set_tuned_table(TunedTable([entry]), allow_cpu=True, prepare="inline")
    l2c.nn.replace_mlps(model)
    got = logits(model, ids).double()
    assert dispatcher.stats["tuned"] == TINY["num_hidden_layers"]
    assert ((got - want).norm() / want.norm()).item() < 1e-2
    compiled = torch.compile(mlps(model)[0])   # the swapped block under torch.compile: one custom op for the gate_up
    x = torch.randn(2, 12, TINY["hidden_size"], dtype=torch.float16)
    with torch.no_grad():
        y = compiled(x)
    assert dispatcher.stats["tuned"] == TINY["num_hidden_layers"] + 1
    set_tuned_table(None)
    with torch.no_grad():
        ref = mlps(model)[0](x).double()
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_gated_mlp_under_torch_compile_matches_the_hf_block_forward_and_backward():
    """Compiled, the block is l2c's custom ops (l2c::gated_matmul, then l2c::addmm for the residual); their backward
    recomputes through torch, so a compiled graph trains: gradients equal the Hugging Face block's."""
    set_tuned_table(None)
    mlp = mlps(tiny_model())[0]
    new = l2c.nn.GatedMLP.from_hf(mlp)
    x = torch.randn(4, 7, TINY["hidden_size"])
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(new)(x), mlp(x), rtol=1e-5, atol=1e-5)
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    r = torch.randn(4, 7, TINY["hidden_size"], requires_grad=True)
    weights = torch.randn(TINY["hidden_size"])
    (torch.compile(new)(x_ours, residual=r) * weights).sum().backward()
    ((mlp(x_ref) + r.detach()) * weights).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(r.grad, weights.expand(4, 7, -1))
    torch.testing.assert_close(new.gate_up_proj.weight.grad,
                               torch.cat([mlp.gate_proj.weight.grad, mlp.up_proj.weight.grad]), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(new.down_proj.weight.grad, mlp.down_proj.weight.grad, rtol=1e-4, atol=1e-5)


class _ScaledMLP(torch.nn.Module):
    """A gated MLP with Llama's parts whose forward adds a step (Falcon-H1's multipliers): not a GatedMLP."""

    def __init__(self, hidden=64, inter=160):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.down_proj = torch.nn.Linear(inter, hidden, bias=False)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(0.5 * self.gate_proj(x)) * self.up_proj(x)) * 2.0


def test_an_mlp_whose_forward_adds_a_step_is_left_as_it_is(caplog):
    """Modules with the gated MLP's parts but another forward (Gemma 3n's activation sparsity, multipliers, norms)
    keep their own forward: replace_mlps checks the plain form on a probe input before it swaps."""
    blocks = [_ScaledMLP()]
    try:
        from transformers.models.gemma3n.configuration_gemma3n import Gemma3nTextConfig
        from transformers.models.gemma3n.modeling_gemma3n import Gemma3nTextMLP
        config = Gemma3nTextConfig(hidden_size=64, intermediate_size=[128], num_hidden_layers=1,
                                   activation_sparsity_pattern=[0.95], hidden_activation="gelu_pytorch_tanh")
        blocks.append(Gemma3nTextMLP(config, 0))
    except ImportError:   # a transformers without Gemma 3n: the local module alone
        pass
    for block in blocks:
        torch.manual_seed(0)
        holder = torch.nn.Module()
        holder.mlp = block.eval()
        x = torch.randn(4, 64)
        with torch.no_grad():
            want = holder.mlp(x)
        with caplog.at_level(logging.WARNING, logger="l2c.nn"):
            l2c.nn.replace_mlps(holder)
        assert type(holder.mlp) is type(block) and "a GatedMLP would change its output" in caplog.text
        with torch.no_grad():
            torch.testing.assert_close(holder.mlp(x), want)
        with pytest.raises(ValueError, match="is not down_proj"):
            l2c.nn.GatedMLP.from_hf(block)


class _PlainMLP(torch.nn.Module):
    """The gated block with optional extras: dropout on the product, a clamp of the gate, projection classes."""

    def __init__(self, linear=torch.nn.Linear, dropout=0.0, clamp=None):
        super().__init__()
        self.gate_proj, self.up_proj = linear(64, 96, bias=False), linear(64, 96, bias=False)
        self.down_proj = linear(96, 64, bias=False)
        self.act_fn, self.dropout, self.clamp = torch.nn.SiLU(), torch.nn.Dropout(dropout), clamp

    def forward(self, x):
        gate = self.gate_proj(x)
        if self.clamp is not None:
            gate = gate.clamp(max=self.clamp)
        return self.down_proj(self.dropout(self.act_fn(gate) * self.up_proj(x)))


class _OwnForwardLinear(torch.nn.Linear):
    """A Linear subclass computing something else from its weight (as a quantized linear does)."""

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight.sign() * self.weight.abs().mean())


def _adapted(mlp):
    """An adapter patched onto gate_proj's instance (LoRA by monkeypatching; accelerate sets `forward` likewise)."""
    plain, delta = mlp.gate_proj.forward, torch.nn.Linear(64, 96, bias=False)
    mlp.gate_proj.forward = lambda x: plain(x) + delta(x)


BLOCK_EXTRAS = {
    "hooked": lambda mlp: mlp.register_forward_hook(lambda module, args, out: out * 2),
    "act_hooked": lambda mlp: mlp.act_fn.register_forward_hook(lambda module, args, out: None),   # a capture
    "patched_forward": _adapted,
    "one_sided_bias": lambda mlp: setattr(mlp.gate_proj, "bias", torch.nn.Parameter(torch.randn(96))),
    "half_frozen": lambda mlp: mlp.gate_proj.weight.requires_grad_(False),
    "own_parameter": lambda mlp: setattr(mlp, "scale", torch.nn.Parameter(torch.ones(()))),
}


@pytest.mark.parametrize("block", ["subclass", "dropout", "clamp", *BLOCK_EXTRAS])
def test_what_a_gated_mlp_would_drop_keeps_the_mlp_as_it_is(block, caplog):
    """An MLP is left as it is where the swap would drop or change what it does: projections of a Linear subclass
    (their own forward), dropout (seen in training mode, though the model is in eval mode), a clamp of the gate (seen
    at pre-activations past unit scale), hooks on the MLP or its activation, a forward patched onto a projection, a
    bias on one of gate and up only (its checkpoint would gain the other's key), gate frozen and up not (one fused
    Parameter cannot be both), a Parameter of the MLP's own (its checkpoint key would be lost)."""
    set_tuned_table(None)
    torch.manual_seed(0)
    mlp = {"subclass": lambda: _PlainMLP(linear=_OwnForwardLinear), "dropout": lambda: _PlainMLP(dropout=0.3),
           "clamp": lambda: _PlainMLP(clamp=7.0)}.get(block, _PlainMLP)().eval()
    BLOCK_EXTRAS.get(block, lambda mlp: None)(mlp)
    holder = torch.nn.Module()
    holder.mlp = mlp
    with caplog.at_level(logging.WARNING, logger="l2c.nn"):
        l2c.nn.replace_mlps(holder, linears=False)
    assert holder.mlp is mlp and "left as it is" in caplog.text
    assert not mlp.training   # the probe's training mode is undone


def test_replace_mlps_keeps_frozen_state_checkpoint_keys_sharing_and_mode():
    """After replace_mlps: frozen weights stay frozen, state_dict has the original keys (a checkpoint saved after the
    swap loads into the original model class, and the original's into the swapped model), an MLP reachable from
    two places stays one module, and the training mode is the model's."""
    set_tuned_table(None)
    model = tiny_model()
    original = tiny_model()
    for p in model.parameters():
        p.requires_grad_(False)
    shared = model.model.layers[0].mlp
    model.model.layers[1].mlp = shared
    keys = set(model.state_dict())
    l2c.nn.replace_mlps(model)
    assert not any(p.requires_grad for p in model.parameters())
    assert set(model.state_dict()) == keys
    assert model.model.layers[0].mlp is model.model.layers[1].mlp and not model.model.layers[0].mlp.training
    ids = torch.randint(0, TINY["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(2))
    swapped_logits = logits(model, ids)
    fresh = tiny_model()
    fresh.model.layers[1].mlp = fresh.model.layers[0].mlp
    fresh.load_state_dict(model.state_dict())          # the swapped model's checkpoint, into the original class
    torch.testing.assert_close(logits(fresh, ids), swapped_logits, rtol=1e-5, atol=1e-5)
    l2c.nn.replace_mlps(original)
    original.load_state_dict(tiny_model().state_dict())   # the original class's checkpoint, into a swapped model
    torch.testing.assert_close(logits(original, ids), logits(tiny_model(), ids), rtol=1e-5, atol=1e-5)


def test_a_partial_state_dict_loads_its_half_and_reports_the_other_missing():
    """A dict holding gate_proj's weight but not up_proj's (a shard of a checkpoint, a partial load) loads the gate
    half into the fused weight and keeps the up half, which is reported missing as the original class reports it:
    strict loading raises, and loading the shards one by one rebuilds the model."""
    set_tuned_table(None)
    source, target = tiny_model(), tiny_model()
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)
    l2c.nn.replace_mlps(target)
    state = source.state_dict()
    up_keys = [k for k in state if "up_proj" in k]
    without_up = {k: v for k, v in state.items() if k not in up_keys}
    before = mlps(target)[0].gate_up_proj.weight.detach().clone()
    with pytest.raises(RuntimeError, match="Missing key.*up_proj.weight"):
        target.load_state_dict(without_up)
    result = target.load_state_dict(without_up, strict=False)
    assert sorted(result.missing_keys) == sorted(up_keys)
    gate, up = mlps(target)[0].gate_up_proj.weight.detach().chunk(2)
    torch.testing.assert_close(gate, mlps(source)[0].gate_proj.weight, rtol=0, atol=0)
    torch.testing.assert_close(up, before.chunk(2)[1], rtol=0, atol=0)
    assert not target.load_state_dict({k: state[k] for k in up_keys}, strict=False).unexpected_keys
    ids = torch.randint(0, TINY["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(logits(target, ids), logits(source, ids), rtol=1e-5, atol=1e-5)


def test_projections_shared_between_mlps_stay_shared():
    """Two MLPs holding one gate_proj are left as they are (a fused weight of each would untie them); a swapped
    MLP's down_proj keeps its own Parameters (ties and an optimizer built before the swap still reach them)."""
    set_tuned_table(None)
    model = tiny_model()
    first, second = mlps(model)
    second.gate_proj = first.gate_proj
    down = mlps(model)[0].down_proj.weight
    l2c.nn.replace_mlps(model, linears=False)
    assert mlps(model) == [first, second]
    other = tiny_model()
    down = mlps(other)[1].down_proj.weight
    l2c.nn.replace_mlps(other, linears=False)
    assert isinstance(mlps(other)[1], l2c.nn.GatedMLP) and mlps(other)[1].down_proj.weight is down


def test_a_probe_that_overflows_f16_is_checked_in_float32():
    """An f16 MLP whose output at the large-gate probe overflows f16 (an 8B-sized block with up and down weights of
    standard deviation 0.2) is still recognised as the plain block (the probe runs again on a float32 copy), and
    swapped."""
    set_tuned_table(None)
    from transformers.models.llama.modeling_llama import LlamaMLP
    torch.manual_seed(0)
    mlp = LlamaMLP(transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192)).half().eval()
    with torch.no_grad():
        for part, std in ((mlp.gate_proj, 0.02), (mlp.up_proj, 0.2), (mlp.down_proj, 0.2)):
            part.weight.normal_(0, std)
    l2c.nn.GatedMLP.from_hf(mlp)


class _WatchingSiLU(torch.nn.SiLU):
    """SiLU that records, each time it runs, how many of `watched`'s tensors are still alive."""

    def __init__(self, watched, seen):
        super().__init__()
        self.watched, self.seen = watched, seen

    def forward(self, x):
        self.seen.append(sum(ref() is not None for ref in self.watched))
        return super().forward(x)


def test_a_swapped_mlp_is_freed_before_the_next_one_is_swapped():
    """replace_mlps holds no replaced MLP past its own swap: the model's gate and up weights are never all held twice
    (the originals and the fused copies), which on a GPU would need their memory twice at the swap's peak."""
    import weakref
    set_tuned_table(None)
    torch.manual_seed(0)
    holder, watched, seen = torch.nn.Module(), [], []
    holder.first, holder.second = _PlainMLP().eval(), _PlainMLP().eval()
    watched.append(weakref.ref(holder.first.gate_proj.weight))
    holder.second.act_fn = _WatchingSiLU(watched, seen)
    l2c.nn.replace_mlps(holder, linears=False)
    assert type(holder.first) is type(holder.second) is l2c.nn.GatedMLP
    assert seen and max(seen) == 0   # while the second MLP was checked, the first one's weight was gone
