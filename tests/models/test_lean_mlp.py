"""The gated MLP keeps gate and up only: act(gate) and the product down_proj's LoRA reads are
recomputed in the backward. The same loss and gradients, bit for bit, in every dtype path the
engine runs, and exactly two intermediate-width tensors a token fewer kept per layer."""

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.models.lean_backward import _lean_rms_norms, lean_frozen_layers
from lora_gui.models.lean_lora import lean_lora_layers
from lora_gui.models.lean_mlp import lean_gated_mlps
from lora_gui.models.lora_fused import fuse_lora

HIDDEN, INTERMEDIATE, LAYERS, TOKENS = 64, 160, 2, 2 * 64


def _model(dtype: torch.dtype, fused: bool, act: str = "silu", targets: str | list[str] = "all-linear"):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=500, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                      num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                      hidden_act=act)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    model = get_peft_model(model, LoraConfig(r=4, target_modules=targets, init_lora_weights="gaussian"))
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()  # peft keeps adapters in float32
    if fused:
        fuse_lora(model)
    return model


def _step(model: nn.Module, autocast: bool) -> tuple[int, float, dict[str, torch.Tensor]]:
    """Bytes alive between the forward and the backward, the loss, and the adapter's gradients."""
    ids = torch.randint(0, 500, (2, 64), generator=torch.Generator().manual_seed(3))
    tracker = StorageTracker()
    with tracker:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(input_ids=ids, labels=ids)
        kept = tracker.live_bytes
        out.loss.backward()
    return kept, out.loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def _without_mlps(model: nn.Module) -> nn.Module:
    """Every other lean layer, the MLPs as transformers runs them."""
    other = copy.deepcopy(model)
    lean_lora_layers(other)
    _lean_rms_norms(other)
    return other


@pytest.mark.parametrize(("dtype", "autocast"), [(torch.float32, False), (torch.bfloat16, False),
                                                 (torch.bfloat16, True)])
@pytest.mark.parametrize("fused", [False, True])
def test_same_gradients_and_two_intermediate_tensors_fewer(dtype, autocast, fused):
    """float32; bf16 frozen weights under float32 adapters (the input cast recomputed from the
    recomputed product); the same under autocast (a GPU run's mixed precision)."""
    model = _model(dtype, fused)
    plain, lean = _without_mlps(model), copy.deepcopy(model)
    assert lean_frozen_layers(lean) == 14 + 5 + 2 and lean_gated_mlps(lean) == 0  # once
    plain_kept, plain_loss, plain_grads = _step(plain, autocast)
    lean_kept, lean_loss, lean_grads = _step(lean, autocast)
    assert lean_loss == plain_loss and plain_grads.keys() == lean_grads.keys()
    for name, grad in plain_grads.items():
        assert torch.equal(grad, lean_grads[name]), name
    width = 2 if dtype == torch.bfloat16 else 4  # bytes a value of the MLP's intermediate tensors
    assert plain_kept - lean_kept == LAYERS * 2 * TOKENS * INTERMEDIATE * width, (plain_kept, lean_kept)


def test_without_an_adapter_on_down_proj_only_the_activation_goes():
    """Nothing keeps the product then; act(gate) is still recomputed (one tensor a layer)."""
    model = _model(torch.float32, True, targets=["q_proj", "v_proj", "gate_proj", "up_proj"])
    plain, lean = _without_mlps(model), copy.deepcopy(model)
    lean_frozen_layers(lean)
    (plain_kept, loss, grads), (lean_kept, lean_loss, lean_grads) = _step(plain, False), _step(lean, False)
    assert loss == lean_loss and all(torch.equal(g, lean_grads[n]) for n, g in grads.items())
    assert plain_kept - lean_kept == LAYERS * TOKENS * INTERMEDIATE * 4


def test_gelu_gated_mlp_and_checkpointed_layers():
    """Gemma's tanh GELU is one op too: the same gradients, less kept. Inside a checkpointed
    layer the MLP steps aside (the checkpoint's own hook decides): nothing changes there."""
    model = _model(torch.float32, True, act="gelu_pytorch_tanh")
    plain, lean = _without_mlps(model), copy.deepcopy(model)
    assert lean_gated_mlps(lean) == LAYERS
    (plain_kept, loss, grads), (lean_kept, lean_loss, lean_grads) = _step(plain, False), _step(lean, False)
    assert loss == lean_loss and all(torch.equal(g, lean_grads[n]) for n, g in grads.items())
    assert lean_kept < plain_kept
    for m in (plain, lean):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.enable_input_require_grads()
    (plain_kept, loss, grads), (lean_kept, lean_loss, lean_grads) = _step(plain, False), _step(lean, False)
    assert loss == lean_loss and all(torch.equal(g, lean_grads[n]) for n, g in grads.items())
    assert lean_kept == plain_kept


def test_other_mlps_and_activations_keep_their_forward():
    """A Python-formula activation (kept intermediates of its own) or a forward that is not
    transformers' gated form is left as it is."""
    from transformers.activations import FastGELUActivation

    model = _model(torch.float32, False)
    for layer in model.base_model.model.model.layers:
        layer.mlp.act_fn = FastGELUActivation()
    assert lean_gated_mlps(model) == 0

    class Other(nn.Module):  # the same attributes, another forward
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = nn.Linear(4, 8), nn.Linear(4, 8), nn.Linear(8, 4)
            self.act_fn = nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) + self.up_proj(x))

    assert lean_gated_mlps(Other()) == 0


def test_the_backward_runs_the_activation_once_a_layer(monkeypatch):
    """The product's recompute (read first, by down_proj's adapter) hands its act(gate) to the
    product's own backward: one activation a layer in the backward, not two."""
    model = _model(torch.float32, True)
    lean_frozen_layers(model)
    ids = torch.randint(0, 500, (2, 64), generator=torch.Generator().manual_seed(3))
    loss = model(input_ids=ids, labels=ids).loss
    calls = []
    silu = torch.nn.functional.silu
    monkeypatch.setattr(torch.nn.functional, "silu", lambda *a, **k: calls.append(1) or silu(*a, **k))
    loss.backward()
    assert len(calls) == LAYERS


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_qlora_layers_get_the_same_lean_path(tmp_path, quantization):
    """bitsandbytes-quantized projections (QLoRA): the same loss and gradients; nf4's down_proj
    adapter keeps no product either (two intermediate-width float32 tensors a token fewer a
    layer); int8's base layer keeps its input itself (bitsandbytes holds it), so only act(gate) goes."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from lora_gui.models.quant import load_quantized, prepare_for_training
    from lora_gui.presets import load_config

    cfg = LlamaConfig(vocab_size=500, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                      num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    run = load_config("text-demo", {"quantization": quantization})
    base = load_quantized(str(tmp_path), run, "sdpa", torch.float32, torch.device("cpu"))
    model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights="gaussian"))
    prepare_for_training(model)
    plain, lean = _without_mlps(model), copy.deepcopy(model)
    lean_frozen_layers(lean)
    (plain_kept, loss, grads), (lean_kept, lean_loss, lean_grads) = _step(plain, False), _step(lean, False)
    assert loss == lean_loss and grads.keys() == lean_grads.keys()
    assert all(torch.equal(g, lean_grads[n]) for n, g in grads.items())
    fewer = 2 if quantization == "nf4" else 1
    assert plain_kept - lean_kept == LAYERS * fewer * TOKENS * INTERMEDIATE * 4, (plain_kept, lean_kept)
