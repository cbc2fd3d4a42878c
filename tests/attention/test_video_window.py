"""Windowed space-time attention over video tokens: the blocked kernel exact against the dense
masked reference (outputs and gradients), the mask's semantics, no N x N tensor in the blocked
kernel, and the switch inside a tiny Wan transformer (self-attention windowed, text unchanged)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lora_gui.attention.video_window import (
    check_window,
    dense_video_window_attention,
    tile_sides,
    video_window_attention,
    video_window_mask,
)


def _qkv(seq, heads=2, dim=8, batch=2, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq, dim, generator=gen, dtype=dtype).requires_grad_()
            for _ in range(3)]


@pytest.mark.parametrize(("grid", "window", "tiles"),
                         [((3, 4, 5), (1, 1, 2), None), ((5, 6, 7), (1, 2, 1), (2, 4, 4)),
                          ((2, 3, 3), (0, 1, 1), (1, 2, 2)), ((7, 5, 9), (2, 1, 3), (2, 2, 4)),
                          ((6, 8, 8), (1, 2, 2), None), ((4, 4, 4), (3, 3, 3), (3, 3, 3))])
def test_blocked_equals_the_dense_masked_reference(grid, window, tiles):
    q, k, v = _qkv(grid[0] * grid[1] * grid[2])
    out = video_window_attention(q, k, v, grid, window, impl="blocked", tiles=tiles)
    ref = dense_video_window_attention(q, k, v, grid, window)
    assert torch.allclose(out, ref, atol=1e-10)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize(("grid", "window", "tiles"),
                         [((3, 4, 5), (1, 1, 2), (2, 3, 2)),  # every dimension pads
                          ((2, 3, 3), (0, 1, 1), (1, 2, 2)), ((4, 2, 5), (1, 0, 1), (3, 1, 4)),
                          ((3, 3, 3), (2, 2, 2), (1, 1, 1))])  # halos clamped at both borders
@pytest.mark.parametrize("chunk_bytes", [None, 1])  # one chunk; one tile a chunk
def test_blocked_gradcheck_in_float64(grid, window, tiles, chunk_bytes, monkeypatch):
    import lora_gui.attention.video_window as vw

    if chunk_bytes:
        monkeypatch.setattr(vw, "CHUNK_BYTES", chunk_bytes)
        monkeypatch.setattr(vw, "MAX_CHUNKS", 10**6)
    q, k, v = _qkv(grid[0] * grid[1] * grid[2], heads=1, dim=3, batch=1, seed=3)
    fn = lambda q, k, v: video_window_attention(q, k, v, grid, window, impl="blocked", tiles=tiles)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)  # random projections: seconds, not minutes
    out, ref = fn(q, k, v), dense_video_window_attention(q, k, v, grid, window)
    assert torch.allclose(out, ref, atol=1e-12)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(got, want, strict=True))


def test_chunks_are_a_function_of_the_shapes_and_split_the_tiles(monkeypatch):
    import lora_gui.attention.video_window as vw

    grid, window = (5, 6, 7), (1, 2, 1)
    q, k, v = _qkv(210, dtype=torch.float64)
    ref = video_window_attention(q, k, v, grid, window, impl="blocked", tiles=(2, 2, 2))
    monkeypatch.setattr(vw, "CHUNK_BYTES", 3 * 2 * 2 * 8 * (4 * 6 * 4) * 4)  # 3 tiles' float32 scores a chunk
    lay = vw._Layout(grid, window, (2, 2, 2), q.shape, q.device)
    assert lay.chunks[0] == (0, 3) and lay.chunks[-1][1] == lay.n_tiles == 3 * 3 * 4
    assert all(a[1] == b[0] for a, b in zip(lay.chunks, lay.chunks[1:], strict=False))
    out = video_window_attention(q, k, v, grid, window, impl="blocked", tiles=(2, 2, 2))
    assert torch.allclose(out, ref, atol=1e-12)
    monkeypatch.setattr(vw, "MAX_CHUNKS", 4)  # the cap on Python iterations wins over the byte size
    assert len(vw._Layout(grid, window, (2, 2, 2), q.shape, q.device).chunks) == 4


def test_the_blocked_kernel_keeps_only_q_k_v_out_and_the_logsumexp():
    grid, window = (4, 8, 8), (1, 2, 2)  # 256 tokens, 75 keys a query
    b, h, n, d = 1, 2, 256, 16
    q, k, v = _qkv(n, heads=h, batch=b, dim=d, dtype=torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = video_window_attention(q, k, v, grid, window, impl="blocked")
    import lora_gui.attention.video_window as vw

    lay = vw._Layout(grid, window, vw.tile_sides(grid, window, d), q.shape, q.device)
    assert sum(saved) == 4 * b * h * n * d + b * h * lay.n_tiles * lay.tile_vol, saved  # + lse, tile rows
    assert b * h * n * lay.halo_vol > 2 * sum(saved)  # what keeping the scores would have cost
    out.sum().backward()
    assert q.grad.shape == q.shape and torch.isfinite(q.grad).all()


def test_bfloat16_blocked_is_close_to_the_float32_reference():
    grid, window = (3, 6, 6), (1, 2, 2)
    q, k, v = _qkv(108, dtype=torch.float32)
    ref = dense_video_window_attention(q, k, v, grid, window)
    out = video_window_attention(*(x.detach().bfloat16() for x in (q, k, v)), grid, window, impl="blocked")
    assert (out.float() - ref).abs().max() < 0.03


def test_mask_semantics():
    grid = (3, 4, 5)  # token (t, r, c) at 20 t + 5 r + c
    mask = video_window_mask(grid, (1, 1, 2))
    at = lambda t, r, c: 20 * t + 5 * r + c  # noqa: E731
    assert mask[at(0, 0, 0), at(1, 1, 2)] and not mask[at(0, 0, 0), at(2, 0, 0)]
    assert not mask[at(1, 1, 1), at(1, 3, 1)] and not mask[at(1, 1, 1), at(1, 1, 4)]
    assert mask[at(1, 1, 2)].sum() == 3 * 3 * 5 and mask[at(0, 0, 0)].sum() == 2 * 2 * 3  # clipped
    assert torch.equal(mask, mask.T)


def test_a_window_covering_the_clip_is_full_attention():
    grid = (3, 4, 5)
    q, k, v = _qkv(60)
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(video_window_attention(q, k, v, grid, (2, 3, 4)), full, atol=1e-10)


class _Largest(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_the_blocked_kernel_never_holds_an_n_by_n_tensor():
    grid, window = (8, 16, 16), (1, 2, 2)  # 2,048 tokens, 75 keys a query
    n = 8 * 16 * 16
    q, k, v = _qkv(n, heads=1, batch=1, dim=16, dtype=torch.float32)
    with _Largest() as watch:
        out = video_window_attention(q, k, v, grid, window, impl="blocked")
        out.sum().backward()
    assert watch.largest < n * n / 4, (watch.largest, n * n, tile_sides(grid, window, 16))


def test_bad_windows_and_lengths_are_refused():
    q, k, v = _qkv(60)
    for bad in ((0, 0, 0), (1, -1, 1), (1, 2), (1.5, 1, 1)):
        with pytest.raises(ValueError, match="video window"):
            check_window(bad)
    with pytest.raises(ValueError, match="does not match"):
        video_window_attention(q, k, v, (3, 4, 4), (1, 1, 1))
    with pytest.raises(ValueError, match="impl"):
        video_window_attention(q, k, v, (3, 4, 5), (1, 1, 1), impl="nope")
    with pytest.raises(ValueError, match="CUDA"):
        video_window_attention(q, k, v, (3, 4, 5), (1, 1, 1), impl="flex")


def _tiny_wan(seed=0):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
                                 in_channels=4, out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32,
                                 num_layers=2, rope_max_seq_len=64).eval()


def test_inside_wan_a_covering_window_is_the_model_and_a_small_one_changes_it():
    from lora_gui.models.video import set_video_attention

    x = torch.randn(1, 4, 3, 8, 10)  # 3 latent frames x 4 x 5 tokens
    text = torch.randn(1, 6, 16)
    t = torch.tensor([500.0])
    with torch.no_grad():
        plain = _tiny_wan()(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
        covering = _tiny_wan()
        set_video_attention(covering, "sdpa", (2, 3, 4))
        same = covering(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
        small = _tiny_wan()
        set_video_attention(small, "sdpa", (0, 1, 1))
        other = small(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
    assert torch.allclose(plain, same, atol=1e-5)
    assert not torch.allclose(plain, other, atol=1e-3)


def test_inside_ltx_video_a_covering_window_is_the_model_and_a_small_one_changes_it():
    from diffusers import LTXVideoTransformer3DModel

    from lora_gui.models.video import set_video_attention

    def tiny(window=None):
        torch.manual_seed(0)
        model = LTXVideoTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=2,
                                           attention_head_dim=8, cross_attention_dim=16, num_layers=2,
                                           caption_channels=16).eval()
        if window:
            set_video_attention(model, "sdpa", window)
        return model

    grid = (3, 4, 5)
    x = torch.randn(1, 60, 8)  # packed tokens, (frame, row, column) order
    text, mask = torch.randn(1, 60, 16), torch.ones(1, 60)  # a prompt as long as the clip: still cross
    kwargs = {"hidden_states": x, "encoder_hidden_states": text, "timestep": torch.tensor([500]),
              "encoder_attention_mask": mask, "num_frames": grid[0], "height": grid[1], "width": grid[2],
              "return_dict": False}
    with torch.no_grad():
        plain = tiny()(**kwargs)[0]
        same = tiny((2, 3, 4))(**kwargs)[0]
        other = tiny((0, 1, 1))(**kwargs)[0]
    assert torch.allclose(plain, same, atol=1e-5)
    assert not torch.allclose(plain, other, atol=1e-3)
