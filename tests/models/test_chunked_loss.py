"""The chunked loss equals transformers' full-logits loss, in value and in gradients."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lora_gui.memory.predict.trace import trace_text_step
from lora_gui.models.chunked_loss import chunked_cross_entropy, enable_chunked_loss

CFG = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _batch():
    torch.manual_seed(0)
    ids = torch.randint(0, 97, (3, 21))
    labels = ids.clone()
    labels[0, 15:] = -100  # padding
    labels[1, :4] = -100  # a prompt without loss
    mask = (labels != -100).long()
    mask[1] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def _loss_and_grads(model, batch, **kw):
    model.zero_grad(set_to_none=True)
    loss = model(**batch, **kw).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("trainable_head", [False, True], ids=["fused-frozen-head", "checkpointed-head"])
@pytest.mark.parametrize("num_items", [None, 40])
def test_chunked_loss_and_gradients_equal_the_full_loss(trainable_head, num_items):
    torch.manual_seed(1)
    full = LlamaForCausalLM(LlamaConfig(**CFG, tie_word_embeddings=False)).float()
    for name, p in full.named_parameters():  # LoRA-like: a frozen base, a few trainable tensors
        p.requires_grad = "q_proj" in name or "down_proj" in name or (trainable_head and "lm_head" in name)
    chunked = enable_chunked_loss(copy.deepcopy(full), chunk=7)  # 63 positions: uneven chunks
    batch = _batch()
    kw = {"num_items_in_batch": num_items} if num_items else {}
    want, want_grads = _loss_and_grads(full, batch, **kw)
    got, got_grads = _loss_and_grads(chunked, batch, **kw)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-7), (got, want)
    assert want_grads.keys() == got_grads.keys() and len(got_grads) >= 4
    for name, grad in want_grads.items():
        assert torch.allclose(got_grads[name], grad, rtol=1e-5, atol=1e-7), name
    with torch.no_grad():  # eval path: no gradient kept, same value
        assert torch.allclose(chunked(**batch).loss, full(**batch).loss, rtol=1e-6)
    assert chunked(input_ids=batch["input_ids"]).logits.shape == (3, 21, 97)  # no labels: untouched


def test_soft_capped_logits_match():
    torch.manual_seed(2)
    hidden = torch.randn(2, 9, 16, requires_grad=True)
    head = torch.nn.Linear(16, 50, bias=False).requires_grad_(False)
    labels = torch.randint(0, 50, (2, 9))
    logits = torch.tanh(head(hidden).float() / 3.0) * 3.0
    want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50), labels[:, 1:].reshape(-1))
    (g_want,) = torch.autograd.grad(want, hidden)
    got = chunked_cross_entropy(hidden, labels, head, chunk=4, softcap=3.0)
    (g_got,) = torch.autograd.grad(got, hidden)
    assert torch.allclose(got, want, rtol=1e-6) and torch.allclose(g_got, g_want, rtol=1e-5, atol=1e-8)


def test_bad_chunk_is_refused():
    with pytest.raises(ValueError, match="loss_chunk"):
        enable_chunked_loss(LlamaForCausalLM(LlamaConfig(**CFG)), 0)


def test_a_deep_copy_runs_its_own_weights():
    """copy.deepcopy of a model with the chunked loss (a bench's two arms, say) trains the copy:
    its loss and its logits come from its own weights, not the original's."""
    torch.manual_seed(0)
    model = enable_chunked_loss(LlamaForCausalLM(LlamaConfig(**CFG)), 8)
    twin = copy.deepcopy(model)
    batch = _batch()
    assert torch.equal(model(**batch).loss, twin(**batch).loss)
    with torch.no_grad():
        twin.model.norm.weight.mul_(2.0)
    assert not torch.equal(model(**batch).loss, twin(**batch).loss)
    ids = batch["input_ids"]
    assert not torch.equal(model(input_ids=ids).logits, twin(input_ids=ids).logits)  # no labels


def test_enabled_twice_keeps_the_models_own_forward():
    """Enabling it again (another chunk) keeps the forward from before the first time for calls
    without labels, and the loss is the same value."""
    torch.manual_seed(0)
    model = enable_chunked_loss(LlamaForCausalLM(LlamaConfig(**CFG)), 8)
    batch = _batch()
    loss8, logits = model(**batch).loss, model(input_ids=batch["input_ids"]).logits
    enable_chunked_loss(model, 5)
    assert torch.allclose(model(**batch).loss, loss8)
    assert torch.equal(model(input_ids=batch["input_ids"]).logits, logits)


def test_trace_sees_the_chunked_loss_saving():
    cfg = LlamaConfig(**{**CFG, "vocab_size": 4096})
    kw = dict(batch_size=2, seq_len=64, lora_rank=4, dtype=torch.float32, device="cpu")
    full = trace_text_step(cfg, **kw)
    chunked = trace_text_step(cfg, loss_chunk=32, **kw)
    logits = 2 * 64 * 4096 * 4  # bytes of the batch's float32 logits
    assert full.peak_bytes - chunked.peak_bytes > 2 * logits
    real = trace_text_step(cfg, loss_chunk=32, fake=False, **kw)  # the trace matches a real step
    assert real.traced_peak_bytes == chunked.traced_peak_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_loss_holds_one_float32_chunk_of_logits(dtype):
    """The frozen head's fused loss turns a chunk's float32 logits into their own gradient: at
    most one (chunk, vocab) float32 buffer (plus the 16-bit logits it came from), where a
    log-softmax beside the logits held two; the value and gradient equal the full loss."""
    from lora_gui.memory.runtime.tracker import StorageTracker

    torch.manual_seed(3)
    vocab, chunk, hidden_size = 2048, 16, 32
    head = torch.nn.Linear(hidden_size, vocab, bias=False).to(dtype).requires_grad_(False)
    hidden = torch.randn(2, 33, hidden_size, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (2, 33))
    labels[0, :5] = -100  # rows without a target: no loss, no gradient
    logits = head(hidden).float()
    want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1))
    (g_want,) = torch.autograd.grad(want, hidden)
    with StorageTracker() as t:
        t.track([hidden, labels, head.weight])
        start = t.live_bytes
        got = chunked_cross_entropy(hidden, labels, head, chunk=chunk)
        rise = t.peak_bytes - start
    (g_got,) = torch.autograd.grad(got, hidden)
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-3)
    assert torch.allclose(got.float(), want, **tol)
    assert torch.allclose(g_got.float(), g_want.float(), **tol)
    one_chunk = chunk * vocab * (4 if dtype == torch.float32 else 4 + 2)  # bytes
    small = 2 * hidden.numel() * hidden.element_size() + 64 * chunk * 8  # gradients, per-row terms
    assert one_chunk <= rise <= one_chunk + small, (rise, one_chunk)


def test_a_head_under_fsdp_keeps_the_fused_loss():
    """FSDP2's fully_shard turns the head's class into a subclass of it: still a plain Linear."""
    from torch.distributed.fsdp import FSDPModule

    from lora_gui.models.chunked_loss import _fusable

    head = torch.nn.Linear(4, 8, bias=False).requires_grad_(False)
    head.__class__ = type("FSDPLinear", (FSDPModule, torch.nn.Linear), {})
    assert _fusable(head)
    assert not _fusable(torch.nn.Linear(4, 8))  # trainable: the checkpointed chunks
