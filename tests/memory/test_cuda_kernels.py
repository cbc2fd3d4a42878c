"""CUDA-only memory: the kernel rule, each kernel's backward workspace from its source, and the
trace / closed form adding it at the moment it is alive."""

import pytest
from transformers import LlamaConfig

from lora_gui.memory.predict import cuda_kernels as ck
from lora_gui.memory.predict.estimate import estimate_text_step
from lora_gui.memory.predict.model_configs import load_model_config
from lora_gui.memory.predict.trace import trace_text_step

LLAMA_8B = {"heads": 32, "kv_heads": 8, "head_dim": 128}  # presets/models/llama-3.1-8b.json
LENGTHS = (1024, 4096, 11_584, 65_536, 131_072)


def test_sdpa_kernel_rule_follows_pytorchs_checks():
    assert ck.sdpa_kernel(mask=False, dtype="bfloat16", head_dim=128) == "sdpa_flash"
    assert ck.sdpa_kernel(mask=True, dtype="bfloat16", head_dim=128) == "sdpa_memory_efficient"
    assert ck.sdpa_kernel(mask=False, dtype="float32", head_dim=128) == "sdpa_memory_efficient"
    assert ck.sdpa_kernel(mask=False, dtype="bfloat16", head_dim=512) == "sdpa_memory_efficient"
    assert ck.sdpa_kernel(mask=False, dtype="float16", head_dim=128, compute_capability=(7, 5)) \
        == "sdpa_memory_efficient"  # a T4 has no flash kernel
    assert ck.sdpa_kernel(mask=True, dtype="bfloat16", head_dim=36) == "sdpa_math"


@pytest.mark.parametrize("seq", LENGTHS)
def test_flash_backward_workspace_is_dq_accum_plus_expanded_dk_dv(seq):
    gqa = ck.attention_backward_bytes("sdpa_flash", batch=1, seq=seq, dtype="bfloat16", **LLAMA_8B)
    assert gqa == pytest.approx(ck.gqa_expected_bytes(1, seq, 32, 128, gqa=True), rel=0.01)
    no_gqa = ck.attention_backward_bytes("sdpa_flash", batch=1, seq=seq, dtype="bfloat16",
                                         **{**LLAMA_8B, "kv_heads": 32})
    rounded = -(-seq // 128) * 128  # seqlen_q_rounded: dq_accum and softmax_d cover whole 128-row blocks
    assert no_gqa == rounded * 32 * (128 + 1) * 4  # float32 dq_accum + softmax_d, exactly
    if seq % 128 == 0:  # no GQA: B x S x H x D x 4 within 1% (softmax_d is 1/D of it)
        assert no_gqa == pytest.approx(ck.gqa_expected_bytes(1, seq, 32, 128, gqa=False), rel=0.01)
    names = {r.name for r in ck.attention_backward_rows("sdpa_flash", batch=1, seq=seq, dtype="bfloat16",
                                                        **LLAMA_8B)}
    assert {"dq_accum (float32)", "dk_expanded (GQA)", "dv_expanded (GQA)"} <= names


def test_memory_efficient_workspace_holds_a_float32_dq():
    ws = ck.attention_backward_bytes("sdpa_memory_efficient", batch=2, seq=4096, heads=32, kv_heads=32,
                                     head_dim=128, dtype="bfloat16")
    assert ws >= 2 * 4096 * 32 * 128 * 4
    assert ck.attention_backward_bytes("eager", batch=2, seq=4096, heads=32, kv_heads=32, head_dim=128,
                                       dtype="bfloat16") == 0


@pytest.mark.parametrize("seq", LENGTHS)
def test_llama_8b_nf4_plan_names_flash_and_lists_its_workspace(seq):
    step = estimate_text_step("llama-3.1-8b", batch_size=1, seq_len=seq, lora_rank=32, quantization="nf4",
                              gradient_checkpointing=True)
    assert step.info["kernel"] == "sdpa_flash"
    rng = 32 * ck.FLASH_FWD_SAVED_PER_LAYER  # rng state saved per layer, listed with it
    workspace = step.info["attention_workspace_bytes"] - rng
    assert workspace == pytest.approx(ck.gqa_expected_bytes(1, seq, 32, 128, gqa=True), rel=0.01)
    cpu = estimate_text_step("llama-3.1-8b", batch_size=1, seq_len=seq, lora_rank=32, quantization="nf4",
                             gradient_checkpointing=True, device="cpu")
    assert cpu.info["attention_workspace_bytes"] == 0  # a CPU plan is unchanged


def test_llama_8b_nf4_trace_allocates_the_workspace_in_each_backward():
    step = trace_text_step("llama-3.1-8b", batch_size=1, seq_len=1024, lora_rank=32, quantization="nf4",
                           gradient_checkpointing=True)
    assert step.info["kernel"] == "sdpa_flash"
    assert step.info["attention_workspace_bytes"] == pytest.approx(
        ck.gqa_expected_bytes(1, 1024, 32, 128, gqa=True), rel=0.01)
    rows = ck.step_rows(load_model_config("llama-3.1-8b"), step.info, dtype="bfloat16",
                        lora_param_bytes=step.breakdown["lora_params"])
    listed = sum(r.nbytes for r in rows if r.kernel == "sdpa_flash" and r.phase == "backward")
    assert listed == step.info["attention_workspace_bytes"]


def _peak_without_workspace(monkeypatch, **kw):
    monkeypatch.setattr(ck, "attention_backward_bytes", lambda *a, **k: 0)
    return trace_text_step(**kw).traced_peak_bytes


def _gqa_llama(vocab: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)


def test_workspace_adds_to_the_peak_only_where_it_is_alive(monkeypatch):
    kw = dict(config=_gqa_llama(64), batch_size=1, seq_len=512, dtype="bfloat16", gradient_checkpointing=True)
    with_ws = trace_text_step(**kw)
    ws = with_ws.info["attention_workspace_bytes"]
    assert ws > 0 and with_ws.info["kernel"] == "sdpa_flash"
    without = _peak_without_workspace(monkeypatch, **kw)
    assert 0 < with_ws.traced_peak_bytes - without <= ws  # the peak is in a layer's backward
    monkeypatch.undo()
    kw["config"] = _gqa_llama(200_000)  # the logits' gradient is the peak, before any layer
    with_ws = trace_text_step(**kw)
    assert with_ws.info["peak_phase"] == "backward" and with_ws.breakdown["temporaries"] > 0
    # only the flash forward's saved rng state (16 + 8 bytes a layer) is alive at the logits
    assert with_ws.traced_peak_bytes - _peak_without_workspace(monkeypatch, **kw) == 2 * 24


def test_a_budget_below_context_and_weights_says_which_and_by_how_much():
    assert ck.fixed_shortfall(8 * 10**9, 500 * 2**20, 5 * 10**9) is None
    msg = ck.fixed_shortfall(400 * 2**20, 500 * 2**20, 10**9)
    assert "CUDA context alone" in msg and "0.105 GB short" in msg
    msg = ck.fixed_shortfall(2 * 10**9, 500 * 2**20, 16 * 10**9)
    assert "frozen weights" in msg and "14.52 GB" in msg


@pytest.mark.parametrize("seq", LENGTHS)
def test_head_groups_shrink_the_planned_workspace_to_one_groups(seq):
    kw = dict(batch_size=1, seq_len=seq, lora_rank=32, quantization="nf4", gradient_checkpointing=True,
              loss_chunk=1024)
    one = estimate_text_step("llama-3.1-8b", **kw)
    grouped = estimate_text_step("llama-3.1-8b", attention_head_groups=8, **kw)
    rng = 32 * ck.FLASH_FWD_SAVED_PER_LAYER
    # 8 groups of 4 query heads against one key/value head: dq_accum and dK / dV expanded to 4 heads
    assert grouped.info["attention_workspace_bytes"] - rng == pytest.approx(
        ck.gqa_expected_bytes(1, seq, 32 // 8, 128, gqa=True), rel=0.01)
    saved = one.info["attention_workspace_bytes"] - grouped.info["attention_workspace_bytes"]
    drop = one.traced_peak_bytes - grouped.traced_peak_bytes
    assert 0 <= drop <= saved  # less only where the peak is elsewhere (the logits, short lengths)
    if seq >= 65_536:
        assert drop == saved  # the peak is in a layer's attention backward


def test_trace_allocates_one_groups_workspace_per_call_and_the_estimate_agrees():
    kw = dict(config=_gqa_llama(64), batch_size=1, seq_len=256, dtype="bfloat16", gradient_checkpointing=True)
    one, grouped = trace_text_step(**kw), trace_text_step(attention_head_groups=2, **kw)
    per_group = ck.attention_backward_bytes("sdpa_flash", batch=1, seq=256, heads=2, kv_heads=1,
                                            head_dim=32, dtype="bfloat16")
    assert grouped.info["kernel"] == "sdpa_flash" and grouped.info["attention_workspace_bytes"] == per_group
    assert one.info["attention_workspace_bytes"] == ck.attention_backward_bytes(
        "sdpa_flash", batch=1, seq=256, heads=4, kv_heads=2, head_dim=32, dtype="bfloat16")
    est = estimate_text_step(kw["config"], batch_size=1, seq_len=256, dtype="bfloat16",
                             gradient_checkpointing=True, attention_head_groups=2)
    rng = 2 * ck.FLASH_FWD_SAVED_PER_LAYER
    assert est.info["attention_workspace_bytes"] - rng == per_group
    cpu = trace_text_step(**{**kw, "device": "cpu"}, attention_head_groups=2)
    assert cpu.info["attention_workspace_bytes"] == 0  # a CPU kernel has no such scratch
