"""Packed rows attended one document at a time: the same result as transformers' block mask and
as each document run on its own (forward and gradients, fp32, CPU), only where a model opts in."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from lora_gui.attention import documents
from lora_gui.attention.documents import DOCUMENTS_ATTR, document_bounds, enable_document_attention
from lora_gui.attention.head_groups import enable_attention_head_groups

LENGTHS = [30, 1, 17, 40]  # a one-token document too
IDS = torch.randint(0, 97, (1, sum(LENGTHS)), generator=torch.Generator().manual_seed(0))
POSITIONS = torch.cat([torch.arange(n) for n in LENGTHS])[None]


def _config(kv_heads: int) -> LlamaConfig:
    return LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                       num_key_value_heads=kv_heads, vocab_size=97, max_position_embeddings=256,
                       use_cache=False)


def _pair(kv_heads: int):
    """A model on transformers' own SDPA path and a copy with the same weights that opted in."""
    torch.manual_seed(0)
    config = _config(kv_heads)
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa")
    by_doc = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa")
    by_doc.load_state_dict(ref.state_dict())
    assert enable_document_attention(by_doc) == config.num_hidden_layers
    return ref, by_doc


def test_bounds_from_restarting_positions() -> None:
    assert document_bounds(POSITIONS, POSITIONS.shape[1]) == [(0, 30), (30, 31), (31, 48), (48, 88)]
    assert document_bounds(torch.arange(10)[None], 10) is None  # one document: nothing to split
    assert document_bounds(None, 10) is None
    assert document_bounds(POSITIONS.expand(2, -1), POSITIONS.shape[1]) is None  # several rows


@pytest.mark.parametrize("kv_heads", [8, 2])  # multi-head and grouped-query attention
def test_same_as_block_mask_and_as_each_document_alone(kv_heads: int) -> None:
    ref, by_doc = _pair(kv_heads)
    calls = []
    original = documents.attention_by_document
    documents.attention_by_document = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        got = by_doc(input_ids=IDS, position_ids=POSITIONS, labels=IDS)
    finally:
        documents.attention_by_document = original
    assert len(calls) == 2  # the opted-in path ran in both layers
    want = ref(input_ids=IDS, position_ids=POSITIONS, labels=IDS)
    assert torch.allclose(got.logits, want.logits, atol=1e-5, rtol=1e-5)
    got.loss.backward()
    want.loss.backward()
    for (name, a), b in zip(ref.named_parameters(), by_doc.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-4), name
    with torch.no_grad():  # and no document sees another: each run on its own gives the same logits
        starts = [0, *torch.tensor(LENGTHS).cumsum(0).tolist()]
        alone = torch.cat([ref(input_ids=IDS[:, s:e]).logits for s, e in zip(starts, starts[1:])], dim=1)
    assert torch.allclose(got.logits, alone, atol=1e-5, rtol=1e-5)


def test_models_that_did_not_opt_in_are_unchanged() -> None:
    ref, by_doc = _pair(8)
    calls = []
    original = documents.attention_by_document
    documents.attention_by_document = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        ref(input_ids=IDS, position_ids=POSITIONS)  # registered globally, but this model is not marked
        by_doc(input_ids=IDS)  # marked, but one document a row
    finally:
        documents.attention_by_document = original
    assert not calls
    assert not any(getattr(m, DOCUMENTS_ATTR, False) for m in ref.modules())


def test_head_groups_keep_their_own_calls() -> None:
    ref, by_doc = _pair(8)
    enable_attention_head_groups(by_doc, 2)
    calls = []
    original = documents.attention_by_document
    documents.attention_by_document = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        got = by_doc(input_ids=IDS, position_ids=POSITIONS).logits
    finally:
        documents.attention_by_document = original
    assert not calls  # the grouped calls with transformers' block mask, still correct
    assert torch.allclose(got, ref(input_ids=IDS, position_ids=POSITIONS).logits, atol=1e-5, rtol=1e-5)


def test_eager_models_are_not_marked() -> None:
    model = AutoModelForCausalLM.from_config(_config(8), attn_implementation="eager")
    assert enable_document_attention(model) == 0


def test_wrappers_compose_once_in_either_order() -> None:
    """Head groups and per-document attention both wrap transformers' sdpa function: registering
    either again, in any order, keeps one layer of each (two head-group layers would split the
    heads twice)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from lora_gui.attention.head_groups import _WRAPPED as GROUPS_MARK
    from lora_gui.attention.head_groups import register_head_groups

    plain = ALL_ATTENTION_FUNCTIONS["sdpa"]
    while getattr(plain, "__wrapped__", None) is not None:  # transformers' own function, unwrapped
        plain = plain.__wrapped__
    AttentionInterface.register("sdpa", plain)
    for register in (register_head_groups, lambda _: documents.register_document_attention()) * 2:
        register("sdpa")
    chain, fn = [], ALL_ATTENTION_FUNCTIONS["sdpa"]
    while fn is not None:
        chain.append(fn)
        fn = getattr(fn, "__wrapped__", None)
    assert sum(bool(getattr(f, GROUPS_MARK, False)) for f in chain) == 1
    assert sum(bool(getattr(f, documents._WRAPPED, False)) for f in chain) == 1
    test_head_groups_keep_their_own_calls()
    test_same_as_block_mask_and_as_each_document_alone(8)


def test_no_dense_mask_is_built_for_a_packed_row_of_a_model_that_attends_by_document() -> None:
    from transformers.models.llama import modeling_llama

    ref, by_doc = _pair(2)
    emb = torch.zeros(1, POSITIONS.shape[1], 64)

    def mask(model, positions=POSITIONS):
        return modeling_llama.create_causal_mask(config=model.config, inputs_embeds=emb, attention_mask=None,
                                                 past_key_values=None, position_ids=positions)

    assert mask(by_doc) is None  # the S x S mask is not built: each document is its own call
    assert mask(ref) is not None and mask(ref).shape[-1] == POSITIONS.shape[1]  # did not opt in
    one = torch.arange(POSITIONS.shape[1])[None]
    assert mask(by_doc, one) is None and mask(ref, one) is None  # one document: causal, no mask
    for module in by_doc.modules():  # a module switched off reads the mask again
        if hasattr(module, DOCUMENTS_ATTR):
            setattr(module, DOCUMENTS_ATTR, False)
            break
    assert mask(by_doc) is not None
    _, grouped = _pair(2)
    enable_attention_head_groups(grouped, 2)  # head groups keep their own masked calls
    assert mask(grouped) is not None
    got = grouped(input_ids=IDS, position_ids=POSITIONS).logits
    assert torch.allclose(got, ref(input_ids=IDS, position_ids=POSITIONS).logits, atol=1e-5, rtol=1e-5)


def test_a_model_that_goes_away_leaves_nothing_registered() -> None:
    import gc

    _, by_doc = _pair(8)
    key = id(by_doc.config)
    assert key in documents._OPTED
    del by_doc
    gc.collect()
    assert key not in documents._OPTED  # a planner traces many models in one dashboard process
