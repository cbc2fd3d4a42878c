"""Each long-context switch gives the plain run's loss and gradients (fp32 tolerance)."""

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.models.errors import ModelError
from lora_gui.models.long_context import apply_long_context

SHAPES = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              tie_word_embeddings=False)
CONFIGS = {"llama": LlamaConfig(**SHAPES), "qwen2": Qwen2Config(**SHAPES), "mistral": MistralConfig(**SHAPES)}
SWITCHES = {"offload": {"offload_checkpoints": True}, "mlp_chunk": {"mlp_chunk": 7},
            "host_embeddings": {"embeddings_on_host": True},
            "all": {"offload_checkpoints": True, "mlp_chunk": 16, "embeddings_on_host": True}}


def _model(kind: str, dropout: float = 0.0):
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(CONFIGS[kind], attn_implementation="sdpa")
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                           lora_dropout=dropout))


def _loss_and_grads(model, checkpointing: bool):
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    torch.manual_seed(1)
    ids = torch.randint(0, 97, (2, 37))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("kind", "switch"), [("llama", s) for s in sorted(SWITCHES)]
                         + [("qwen2", "all"), ("mistral", "all")])
def test_switch_keeps_loss_and_gradients(kind, switch):
    plain = _model(kind)
    changed = copy.deepcopy(plain)
    loss0, grads0 = _loss_and_grads(plain, checkpointing=True)
    changed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    apply_long_context(changed, **SWITCHES[switch])
    loss1, grads1 = _loss_and_grads(changed, checkpointing=False)
    assert torch.allclose(loss0, loss1, rtol=1e-5, atol=1e-6)
    assert grads0.keys() == grads1.keys() and len(grads0) == 2 * 7 * 2
    for name, g in grads0.items():
        assert torch.allclose(g, grads1[name], rtol=1e-4, atol=1e-6), name


def test_tiled_mlp_without_checkpointing_and_in_eval():
    plain = _model("llama")
    tiled = copy.deepcopy(plain)
    apply_long_context(tiled, mlp_chunk=5)
    loss0, grads0 = _loss_and_grads(plain, checkpointing=False)
    loss1, grads1 = _loss_and_grads(tiled, checkpointing=False)
    assert torch.allclose(loss0, loss1, rtol=1e-5)
    assert all(torch.allclose(g, grads1[n], rtol=1e-4, atol=1e-6) for n, g in grads0.items())
    ids = torch.randint(0, 97, (1, 20))
    plain.eval(), tiled.eval()
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, tiled(input_ids=ids).logits, atol=1e-5)


def test_offload_moves_the_layer_inputs_to_host_memory():
    model = _model("llama")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    apply_long_context(model, offload_checkpoints=True)
    ids = torch.randint(0, 97, (2, 37))
    with StorageTracker() as t:
        loss = model(input_ids=ids, labels=ids).loss
        # one float32 hidden-state copy per layer lives on the host until backward
        assert t.host_live_bytes == 2 * (2 * 37 * 32 * 4)
        loss.backward()
    assert t.host_live_bytes == 0 and t.host_peak_bytes == 2 * 2 * 37 * 32 * 4


def test_host_embeddings_stay_on_host_and_count_as_host():
    model = _model("llama")
    table = apply_long_context(model, embeddings_on_host=True)[0]
    model.to(torch.float64).to(torch.float32)  # casts apply (moves would be ignored)
    assert model.get_input_embeddings().weight.dtype == torch.float32
    with StorageTracker() as t:
        t.track(model.parameters())
        assert t.host_live_bytes == table.numel() * 4 == 97 * 32 * 4


def test_refusals_name_the_setting(monkeypatch):
    with pytest.raises(ModelError, match="offload_checkpoints: needs gradient_checkpointing"):
        apply_long_context(_model("llama"), offload_checkpoints=True)
    tied_base = AutoModelForCausalLM.from_config(LlamaConfig(**{**SHAPES, "tie_word_embeddings": True}))
    tied = get_peft_model(tied_base, LoraConfig(r=2, target_modules="all-linear"))
    with pytest.raises(ModelError, match="embeddings_on_host: this model ties"):
        apply_long_context(tied, embeddings_on_host=True)
    with monkeypatch.context() as m:
        m.setenv("ACCELERATE_USE_FSDP", "true")
        with pytest.raises(ModelError, match="embeddings_on_host: not supported with FSDP"):
            apply_long_context(_model("llama"), embeddings_on_host=True)
    with pytest.raises(ModelError, match="mlp_chunk: must be >= 1"):
        apply_long_context(_model("llama"), mlp_chunk=-1)


def test_config_refuses_offload_without_checkpointing():
    from lora_gui.config import ConfigError, RunConfig

    with pytest.raises(ConfigError, match="offload_checkpoints: needs gradient_checkpointing"):
        RunConfig(offload_checkpoints=True).validate()
    RunConfig(offload_checkpoints=True, gradient_checkpointing=True, mlp_chunk=512,
              embeddings_on_host=True).validate()


def test_switches_on_an_nf4_base_keep_loss_and_gradients(tmp_path):
    from lora_gui.config import RunConfig
    from lora_gui.models.quant import check_bitsandbytes, load_quantized
    from lora_gui.models.text import attach_lora

    try:
        check_bitsandbytes("nf4", torch.device("cpu"))
    except ModelError as err:
        pytest.skip(str(err))
    AutoModelForCausalLM.from_config(LlamaConfig(**SHAPES)).save_pretrained(tmp_path)
    cfg = RunConfig(quantization="nf4", lora_rank=4, gradient_checkpointing=True)

    def run(switches: dict):
        torch.manual_seed(0)
        base = load_quantized(str(tmp_path), cfg, "sdpa", torch.float32, torch.device("cpu"))
        model = attach_lora(base, cfg)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        apply_long_context(model, **switches)
        return _loss_and_grads(model, checkpointing=False)

    loss0, grads0 = run({})
    loss1, grads1 = run(SWITCHES["all"])
    assert torch.allclose(loss0, loss1, rtol=1e-5) and grads0.keys() == grads1.keys() and grads0
    assert all(torch.allclose(g, grads1[n], rtol=1e-4, atol=1e-6) for n, g in grads0.items())


def test_checkpointing_keeps_no_embedding_output_on_the_device():
    """transformers' switch makes the embedding output require grad (needed by reentrant
    checkpointing only); autograd then holds it on the device to the end of the backward.
    enable_checkpointing removes that hook: with offloaded checkpoints the device peak drops by
    that one hidden state, and loss and gradients do not change."""
    from lora_gui.models.checkpointing import enable_checkpointing

    def run(ours: bool):
        model = _model("llama")
        model.train()
        if ours:
            enable_checkpointing(model)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        apply_long_context(model, offload_checkpoints=True)
        ids = torch.randint(0, 97, (2, 37), generator=torch.Generator().manual_seed(1))
        with StorageTracker() as t:
            loss = model(input_ids=ids, labels=ids).loss
            embedded_requires_grad = model.get_input_embeddings()(ids).requires_grad
            loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        return loss.detach(), grads, t.peak_bytes, embedded_requires_grad

    loss0, grads0, peak0, hooked = run(ours=False)
    loss1, grads1, peak1, ours_hooked = run(ours=True)
    assert hooked and not ours_hooked
    assert torch.equal(loss0, loss1) and grads0.keys() == grads1.keys() and len(grads1) == 2 * 7 * 2
    assert all(torch.equal(g, grads1[n]) for n, g in grads0.items())
    assert peak0 - peak1 >= 2 * 37 * 32 * 4  # at least the float32 embedding output (batch x seq x hidden)
