"""Windowed attention over DiT image tokens: exact against the dense masked reference (outputs
and gradients), the mask's semantics, and the switch inside tiny SD3 / Flux transformers."""

import pytest
import torch

from lora_gui.attention.image_window import (
    ImageLayout,
    dense_image_window_attention,
    image_window_attention,
    image_window_mask,
)


def _qkv(seq, heads=2, dim=8, batch=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq, dim, generator=gen, dtype=torch.float64, requires_grad=True)
            for _ in range(3)]


@pytest.mark.parametrize("text_first", [True, False])
@pytest.mark.parametrize(("text", "grid", "radius", "tile"),
                         [(3, (5, 7), 1, 2), (4, (6, 6), 2, 3), (0, (7, 5), 1, 8), (5, (9, 4), 3, 4)])
def test_blocked_equals_the_dense_masked_reference(text_first, text, grid, radius, tile):
    layout = ImageLayout(text, grid, text_first)
    q, k, v = _qkv(layout.seq_len)
    out = image_window_attention(q, k, v, layout, radius, tile=tile)
    ref = dense_image_window_attention(q, k, v, layout, radius)
    assert torch.allclose(out, ref, atol=1e-10)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(got, want, strict=True))


def test_mask_semantics():
    layout = ImageLayout(2, (3, 4), text_first=True)  # text 0-1, image cell (r, c) at 2 + 4r + c
    mask = image_window_mask(layout, radius=1)
    assert mask[:2].all() and mask[:, :2].all()  # text queries see all; every query sees the text
    cell = lambda r, c: 2 + 4 * r + c  # noqa: E731
    assert mask[cell(0, 0), cell(1, 1)] and not mask[cell(0, 0), cell(0, 2)]
    assert mask[cell(1, 1)].sum() == 2 + 9 and mask[cell(0, 0)].sum() == 2 + 4  # corners clipped
    image_first = image_window_mask(ImageLayout(2, (3, 4), text_first=False), radius=1)
    assert image_first[-2:].all() and not image_first[0, 2]  # cell (0, 0) vs (0, 2)


def test_a_window_covering_the_picture_is_full_attention():
    layout = ImageLayout(3, (4, 5), text_first=False)
    q, k, v = _qkv(layout.seq_len)
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(image_window_attention(q, k, v, layout, radius=5), full, atol=1e-10)


def test_bad_radius_and_length_are_refused():
    layout = ImageLayout(3, (4, 5), text_first=True)
    q, k, v = _qkv(layout.seq_len)
    with pytest.raises(ValueError, match="radius"):
        image_window_attention(q, k, v, layout, 0)
    with pytest.raises(ValueError, match="does not match"):
        image_window_attention(q, k, v, ImageLayout(3, (4, 4), True), 1)


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_the_switch_inside_tiny_dit_transformers(kind):
    """The flow-matching loss with the switch: a window covering the picture is full attention,
    a small one changes the loss; the trace sees the same step (memory, source: tracker)."""
    import types

    from diffusers import FlowMatchEulerDiscreteScheduler

    from lora_gui.memory.predict.dit_trace import build_dit, trace_dit_step
    from lora_gui.models.build_dit import FLUX_TRANSFORMER, SD3_TRANSFORMER
    from lora_gui.models.dit import FlowMatching, set_dit_attention

    config = {"_class_name": "FluxTransformer2DModel", **FLUX_TRANSFORMER} if kind == "flux" else \
        {"_class_name": "SD3Transformer2DModel", **SD3_TRANSFORMER}
    objective = FlowMatching(kind, FlowMatchEulerDiscreteScheduler(), "none",
                             guidance=3.5 if kind == "flux" else None)
    gen = torch.Generator().manual_seed(0)
    lat = torch.randn(1, 4 if kind == "sd3" else 16 // 4, 24, 16, generator=gen)  # 12 x 8 image tokens
    enc = types.SimpleNamespace(latents=lat, hidden=torch.randn(1, 5, 32, generator=gen),
                                pooled=torch.randn(1, 64 if kind == "sd3" else 32, generator=gen))
    noise, sig = torch.randn(lat.shape, generator=gen), torch.tensor([0.5])

    def loss(window):
        torch.manual_seed(0)
        model = build_dit(config, dtype=torch.float32, lora_rank=4, lora_alpha=4, target_modules=["to_q"])
        model = model.to_empty(device="cpu")
        torch.manual_seed(1)
        for t in (*model.parameters(), *model.buffers()):  # to_empty leaves garbage: fill all
            if t.is_floating_point():
                torch.nn.init.normal_(t, std=0.05)
        set_dit_attention(model.get_base_model(), "sdpa", window)
        return objective.loss_at(model, enc, noise, sig, sig * 1000).item()

    full, covering, local = loss(0), loss(12), loss(1)
    assert covering == pytest.approx(full, rel=1e-5)
    assert abs(local - full) > 1e-4
    kw = {"batch_size": 1, "resolution": 256, "lora_rank": 4, "dtype": "float32", "device": "cpu",
          "text_seq_len": 8, "image_window": 2}
    fake, real = trace_dit_step(config, **kw), trace_dit_step(config, fake=False, **kw)
    assert fake.traced_peak_bytes == real.traced_peak_bytes
    assert fake.traced_peak_bytes != trace_dit_step(config, **{**kw, "image_window": 0}).traced_peak_bytes
