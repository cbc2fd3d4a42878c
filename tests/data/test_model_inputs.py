"""Training inputs: the padding mask is dropped only where it changes no trained token."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from lora_gui.data.batching import MicroBatch
from lora_gui.data.model_inputs import (
    attention_implementation,
    drop_redundant_padding_mask,
    training_batch,
)
from lora_gui.data.text import TokenizedSample
from lora_gui.memory.runtime.tracker import StorageTracker

CFG = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def _lora_model(attn: str = "sdpa"):
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**CFG, attn_implementation=attn, pad_token_id=0))
    return get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))


def _samples(lengths):
    gen = torch.Generator().manual_seed(1)
    out = []
    for n in lengths:
        ids = torch.randint(1, 97, (n,), generator=gen).tolist()
        out.append(TokenizedSample(input_ids=ids, labels=list(ids)))
    return out


def _padded(lengths, width):
    samples = _samples(lengths)
    return samples, MicroBatch(indices=tuple(range(len(samples))), seq_len=width)


def test_mask_dropped_only_for_right_padding_under_sdpa():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    batch = {"input_ids": torch.ones(2, 4, dtype=torch.long), "attention_mask": mask}
    assert "attention_mask" not in drop_redundant_padding_mask(batch, "sdpa")
    assert drop_redundant_padding_mask(batch, "eager") is batch  # the traditional baseline keeps it
    assert drop_redundant_padding_mask(batch, "windowed") is batch
    left = {**batch, "attention_mask": torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])}
    assert drop_redundant_padding_mask(left, "sdpa") is left
    holes = {**batch, "attention_mask": torch.tensor([[1, 0, 1, 0], [1, 1, 1, 1]])}
    assert drop_redundant_padding_mask(holes, "sdpa") is holes
    packed = {**batch, "position_ids": torch.tensor([[0, 1, 0, 1], [0, 1, 2, 3]])}
    assert drop_redundant_padding_mask(packed, "sdpa") is packed


def test_attention_implementation_seen_through_peft():
    assert attention_implementation(_lora_model("sdpa")) == "sdpa"
    assert attention_implementation(_lora_model("eager")) == "eager"
    assert attention_implementation(torch.nn.Linear(2, 2)) is None


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_same_loss_and_lora_gradients_without_the_mask():
    model = _lora_model()
    for p in model.parameters():  # LoRA B starts at zero: give it values so every grad is live
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    samples, mb = _padded([40, 23, 7], 48)
    lean = training_batch(model, samples, mb, pad_id=0, device=torch.device("cpu"))
    assert "attention_mask" not in lean
    masked = {**lean, "attention_mask": (lean["labels"] != -100).long()}
    assert masked["attention_mask"].sum() == 70
    loss_a, grads_a = _loss_and_grads(model, masked)
    loss_b, grads_b = _loss_and_grads(model, lean)
    assert torch.allclose(loss_a, loss_b, rtol=1e-5, atol=1e-6)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 0
    for name, grad in grads_a.items():
        assert torch.allclose(grad, grads_b[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("attn,expect_saving", [("sdpa", True), ("eager", False)])
def test_dropping_the_mask_lowers_the_tracked_peak_under_sdpa(attn, expect_saving):
    model = _lora_model(attn)
    samples, mb = _padded([256, 180, 100, 60], 256)
    lean = training_batch(model, samples, mb, pad_id=0, device=torch.device("cpu"))
    masked = {**lean, "attention_mask": (lean["labels"] != -100).long()}
    peaks = []
    for batch in (masked, lean):
        model.zero_grad(set_to_none=True)
        with StorageTracker() as tracker:
            model(**batch).loss.backward()
        peaks.append(tracker.peak_bytes)
    if expect_saving:  # the math kernel's 4 x 4 heads x 256^2 fp32 scores per layer are gone
        assert peaks[1] < 0.8 * peaks[0], peaks
    else:
        assert peaks[1] == peaks[0], peaks
