"""Windowed attention: blocked == dense, flex mask == dense mask, transformers backend, bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lora_gui.attention.windowed import (
    WindowSpec,
    _blocked,
    _token_tables,
    bucket_length,
    dense_mask,
    flex_mask_mod,
    windowed_attention,
)

TOL = 1e-5  # float32, forward and gradients: |a - b| <= TOL * (1 + |b|) elementwise


def _inputs(batch, heads, kv_heads, seq, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq, dim, generator=gen, requires_grad=True)
    k = torch.randn(batch, kv_heads, seq, dim, generator=gen, requires_grad=True)
    v = torch.randn(batch, kv_heads, seq, dim, generator=gen, requires_grad=True)
    return q, k, v, gen


def _out_and_grads(fn, q, k, v):
    out = fn(q, k, v)
    weights = torch.linspace(-1.0, 1.0, out.numel()).view_as(out)  # non-uniform upstream grad
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    return out, grads


def _max_diff(a, b):
    """Largest difference, relative above magnitude 1 (a global key's gradient sums over every
    query, so float32 summation order alone moves it by ~1e-7 of its size)."""
    return ((a - b).abs() / (1 + b.abs())).max().item()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(1, 2),
    kv_heads=st.sampled_from([1, 2]),
    rep=st.sampled_from([1, 2]),
    seq=st.integers(1, 150),
    window=st.integers(1, 48),
    n_glob=st.integers(0, 6),
    causal=st.booleans(),
    padding=st.sampled_from(["none", "left", "right", "random"]),
    packed=st.booleans(),
    block=st.sampled_from([None, 3, 8, 32]),
    seed=st.integers(0, 2**16),
)
def test_blocked_matches_dense(
    batch, kv_heads, rep, seq, window, n_glob, causal, padding, packed, block, seed
):
    assume(not (packed and not causal and min(n_glob, seq) > min(window, seq)))  # raises, tested below
    q, k, v, gen = _inputs(batch, kv_heads * rep, kv_heads, seq, 8, seed)
    kpm = None
    if padding != "none":
        kpm = torch.ones(batch, seq, dtype=torch.bool)
        cut = int(torch.randint(0, seq + 1, (1,), generator=gen))
        if padding == "left":
            kpm[0, :cut] = False
        elif padding == "right":
            kpm[-1, cut:] = False
        else:
            kpm = torch.rand(batch, seq, generator=gen) > 0.3
    doc_ids = None
    if packed:
        doc_ids = torch.sort(torch.randint(0, 4, (batch, seq), generator=gen), dim=1).values
    spec = WindowSpec(window, n_glob, causal)
    scale = 8**-0.5

    def blocked(q, k, v):
        qdoc, kdoc, start = _token_tables(batch, seq, q.device, kpm, doc_ids)
        return _blocked(q, k, v, spec, qdoc, kdoc, start, scale, packed=packed, block_size=block)

    def dense(q, k, v):
        return windowed_attention(q, k, v, spec, impl="dense", key_padding_mask=kpm, doc_ids=doc_ids)

    out_b, grads_b = _out_and_grads(blocked, q, k, v)
    out_d, grads_d = _out_and_grads(dense, q, k, v)
    assert torch.isfinite(out_b).all()
    assert _max_diff(out_b, out_d) <= TOL
    for g_b, g_d in zip(grads_b, grads_d, strict=True):
        assert torch.isfinite(g_b).all()
        assert _max_diff(g_b, g_d) <= TOL


def test_auto_on_cpu_is_blocked_and_long_sequence_matches_dense():
    # S = 517: not a multiple of the default block (32 at W=64), several blocks, globals outside.
    q, k, v, _ = _inputs(1, 4, 2, 517, 16, seed=1)
    doc_ids = torch.zeros(1, 517, dtype=torch.long)
    doc_ids[:, 300:] = 1
    spec = WindowSpec(64, 4)
    out_a, grads_a = _out_and_grads(lambda *t: windowed_attention(*t, spec, doc_ids=doc_ids), q, k, v)
    dense = lambda *t: windowed_attention(*t, spec, impl="dense", doc_ids=doc_ids)  # noqa: E731
    out_d, grads_d = _out_and_grads(dense, q, k, v)
    assert _max_diff(out_a, out_d) <= TOL
    assert max(_max_diff(a, b) for a, b in zip(grads_a, grads_d, strict=True)) <= TOL


def test_mask_semantics_on_a_small_example():
    # 2 packed documents of 6 and 4 tokens, W=2, G=1, causal; key 9 is padding.
    doc_ids = torch.tensor([[0] * 6 + [1] * 4])
    kpm = torch.ones(1, 10, dtype=torch.bool)
    kpm[0, 9] = False
    qdoc, kdoc, start = _token_tables(1, 10, torch.device("cpu"), kpm, doc_ids)
    mask = dense_mask(WindowSpec(2, 1), qdoc, kdoc, start)[0]
    assert mask[5].nonzero().flatten().tolist() == [0, 4, 5]  # global 0 + window {4, 5}
    assert mask[8].nonzero().flatten().tolist() == [6, 7, 8]  # doc 2's global is token 6
    assert mask[9].nonzero().flatten().tolist() == [6, 8]  # key 9 is padding
    assert not mask[6, :6].any()  # nothing crosses the document boundary


def test_fully_padded_rows_give_zeros_not_nan():
    q, k, v, _ = _inputs(2, 2, 2, 20, 8, seed=3)
    kpm = torch.ones(2, 20, dtype=torch.bool)
    kpm[0, :7] = False  # left padding: queries 0..6 see no real key (window 4, no globals)
    for impl in ("dense", "blocked"):
        out, grads = _out_and_grads(
            lambda *t, impl=impl: windowed_attention(*t, WindowSpec(4, 0), impl=impl, key_padding_mask=kpm),
            q,
            k,
            v,
        )
        assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
        assert out[0, :, :7].abs().max() == 0
        assert out[0, :, 7:].abs().max() > 0


def test_flex_mask_mod_matches_dense_mask():
    from torch.nn.attention.flex_attention import create_mask

    gen = torch.Generator().manual_seed(0)
    doc_ids = torch.sort(torch.randint(0, 3, (2, 45), generator=gen), dim=1).values
    kpm = torch.rand(2, 45, generator=gen) > 0.2
    qdoc, kdoc, start = _token_tables(2, 45, torch.device("cpu"), kpm, doc_ids)
    for spec in (WindowSpec(5, 2), WindowSpec(7, 3, causal=False), WindowSpec(1, 0)):
        flex = create_mask(flex_mask_mod(spec, qdoc, kdoc, start), 2, 1, 45, 45, device="cpu")
        assert torch.equal(flex[:, 0], dense_mask(spec, qdoc, kdoc, start))


def test_flex_on_cpu_raises_clearly():
    q, k, v, _ = _inputs(1, 2, 2, 16, 8, seed=0)
    with pytest.raises(ValueError, match="flex.*CUDA"):
        windowed_attention(q, k, v, WindowSpec(4), impl="flex")


def test_bucket_length_is_coarse_and_bounded():
    lengths = [1, 100, 128, 129, 700, 1000, 4097, 8192, 12000, 32768]
    for s in lengths:
        b = bucket_length(s)
        assert b >= s and b % 128 == 0 and b <= max(s + 127, 1.25 * s)
    assert len({bucket_length(s) for s in range(1, 32769)}) < 40  # few compiled shapes


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window": 0}, "window.*0"),
        ({"window": -3}, "window.*-3"),
        ({"window": 2.5}, "window.*2.5"),
        ({"window": 8, "global_tokens": -1}, "global_tokens.*-1"),
        ({"window": 8, "causal": "yes"}, "causal"),
    ],
)
def test_window_spec_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WindowSpec(**kwargs)


def test_window_spec_rejects_values_above_length():
    WindowSpec(128, 4).validate_for_length(128)
    with pytest.raises(ValueError, match=r"window=256.*sequence length 128"):
        WindowSpec(256, 4).validate_for_length(128)
    with pytest.raises(ValueError, match=r"global_tokens=9.*sequence length 8"):
        WindowSpec(4, 9).validate_for_length(8)


def test_bad_impl_and_shapes():
    q, k, v, _ = _inputs(1, 3, 2, 8, 4, seed=0)
    with pytest.raises(ValueError, match="impl"):
        windowed_attention(q[:, :2], k, v, WindowSpec(2), impl="fast")
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        windowed_attention(q, k, v, WindowSpec(2))
    with pytest.raises(ValueError, match="non-causal packed"):
        doc_ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
        windowed_attention(q[:, :2], k, v, WindowSpec(2, 4, causal=False), impl="blocked", doc_ids=doc_ids)


# -- transformers backend ---------------------------------------------------------------------
def _tiny_configs():
    from transformers import GPTNeoXConfig, LlamaConfig, MistralConfig, Qwen2Config

    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=97,
        max_position_embeddings=256,
    )
    return {
        "llama": LlamaConfig(num_key_value_heads=2, **common),  # GQA
        "qwen2": Qwen2Config(num_key_value_heads=2, **common),
        "mistral": MistralConfig(num_key_value_heads=2, sliding_window=4096, **common),
        "gpt_neox": GPTNeoXConfig(**common),
    }


CONFIGS = _tiny_configs()


def _pair(name, window, global_tokens):
    """An sdpa reference model and a windowed copy with the same weights."""
    from transformers import AutoModelForCausalLM

    from lora_gui.attention import configure_windowed

    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(CONFIGS[name]), attn_implementation="sdpa")
    cfg = copy.deepcopy(CONFIGS[name])
    configure_windowed(cfg, window=window, global_tokens=global_tokens)
    win = AutoModelForCausalLM.from_config(cfg, attn_implementation="windowed")
    win.load_state_dict(ref.state_dict())
    assert win.config._attn_implementation == "windowed"
    return ref.eval(), win.eval()


IDS = torch.randint(0, 97, (2, 48), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hf_full_window_matches_sdpa_and_trains(name):
    ref, win = _pair(name, window=64, global_tokens=0)  # W >= S = 48, no globals: full causal
    assert _max_diff(ref(IDS).logits, win(IDS).logits) <= TOL
    mask = torch.ones_like(IDS)
    mask[1, 36:] = 0  # right padding
    real = mask.bool()
    got, want = win(IDS, attention_mask=mask).logits, ref(IDS, attention_mask=mask).logits
    assert _max_diff(got[real], want[real]) <= TOL
    # forward + backward through the windowed backend
    win.train()
    loss = win(IDS, labels=IDS).loss
    loss.backward()
    grads = [p.grad for p in win.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hf_small_window_differs_and_packed_rows_are_isolated(name):
    ref, win = _pair(name, window=64, global_tokens=0)
    full = win(IDS).logits
    win.config.windowed_window, win.config.windowed_global_tokens = 4, 2
    small = win(IDS).logits
    assert _max_diff(small[:, :4], full[:, :4]) <= TOL  # first W tokens see the same keys
    assert _max_diff(small, full) > 1e-3  # the window is really applied
    # Packed: positions restart at 20 -> two documents, equal to running them separately.
    positions = torch.cat([torch.arange(20), torch.arange(28)])[None].expand(2, -1)
    packed = win(IDS, position_ids=positions).logits
    separate = torch.cat([win(IDS[:, :20]).logits, win(IDS[:, 20:]).logits], dim=1)
    assert _max_diff(packed, separate) <= TOL


def test_hf_mistral_native_sliding_window_is_respected():
    from transformers import AutoModelForCausalLM

    from lora_gui.attention import enable_windowed_attention

    cfg = copy.deepcopy(CONFIGS["mistral"])
    cfg.sliding_window = 8
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="sdpa").eval()
    win = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    win.load_state_dict(ref.state_dict())
    enable_windowed_attention(win, window=64, global_tokens=0)  # min(8, 64) = 8 is used
    assert _max_diff(ref(IDS).logits, win(IDS).logits) <= TOL


def test_hf_generate_with_cache_matches_sdpa():
    ref, win = _pair("llama", window=64, global_tokens=0)
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(ref.generate(IDS[:1, :10], **kwargs), win.generate(IDS[:1, :10], **kwargs))


def test_hf_unsupported_model_and_settings_raise():
    from transformers import BloomConfig

    from lora_gui.attention import check_windowed_support, configure_windowed

    with pytest.raises(ValueError, match="BloomForCausalLM"):
        check_windowed_support(BloomConfig(hidden_size=64, n_layer=1, n_head=4, vocab_size=97))
    cfg = copy.deepcopy(CONFIGS["llama"])
    cfg.attention_dropout = 0.1
    with pytest.raises(ValueError, match=r"LlamaForCausalLM.*attention_dropout=0.1"):
        check_windowed_support(cfg)
    with pytest.raises(ValueError, match="window=512.*sequence length 256"):
        configure_windowed(copy.deepcopy(CONFIGS["llama"]), window=512, max_seq_len=256)
    with pytest.raises(ValueError, match="global_tokens.*-2"):
        configure_windowed(copy.deepcopy(CONFIGS["llama"]), global_tokens=-2)
