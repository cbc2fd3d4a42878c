"""DiT attention keeps its normalised query and key as recomputes from the norms' inputs: the
same gradients, bit for bit, as diffusers' own processors, and exactly two sequence x width
tensors less a block; under CUDA's autocast (emulated) too; the plain path where it must."""

import copy

import pytest
import torch
from peft import LoraConfig
from torch import nn

from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.models import dit
from lora_gui.models.build_dit import build_flux_pipeline, build_sd3_pipeline
from lora_gui.models.cuda_autocast import forward_under
from lora_gui.models.lean_attention import lean_dit_attention
from lora_gui.models.lean_backward import lean_frozen_layers
from tests.models.test_lean_backward import _dit_step


@pytest.fixture(autouse=True)
def _rebuild_every_size(monkeypatch):
    """These tiny models are narrower than where a run rebuilds (a recompute costs more than it
    saves there, tested apart): here every width is rebuilt, to check each one."""
    from lora_gui.models import stand_ins

    monkeypatch.setattr(stand_ins, "MIN_REBUILD_WIDTH", 0)


def _transformer(kind: str, bf16: bool = False) -> nn.Module:
    if kind == "sd3":  # the bundled drawing model's norms: SD3.5's RMSNorm on query and key
        model = build_sd3_pipeline(seed=0, qk_norm="rms_norm").transformer
    else:
        model = build_flux_pipeline(seed=0).transformer
    if bf16:
        model = model.to(torch.bfloat16)
    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=dit.lora_targets(kind, "all-linear"),
                                 init_lora_weights="gaussian"))
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()  # peft's float32 adapters (over bf16 weights when bf16)
    return model


def _without_lean_attention(model: nn.Module, monkeypatch) -> nn.Module:
    from lora_gui.models import lean_backward

    with monkeypatch.context() as m:
        m.setattr(lean_backward, "lean_dit_attention", lambda module: 0)
        lean_frozen_layers(model)
    return model


@pytest.mark.parametrize("kind", ["sd3", "flux"])
@pytest.mark.parametrize("bf16", [False, True])
def test_same_gradients_and_two_tensors_less_a_block(kind, bf16, monkeypatch):
    plain = _transformer(kind, bf16)
    lean, before = copy.deepcopy(plain), _without_lean_attention(copy.deepcopy(plain), monkeypatch)
    lean_frozen_layers(lean)
    kinds = {type(m.processor).__name__ for m in lean.modules() if hasattr(m, "processor")}
    assert kinds == {"LeanJointAttnProcessor" if kind == "sd3" else "LeanFluxAttnProcessor"}

    def step(model):
        with forward_under(model, torch.bfloat16 if bf16 else None):  # a GPU run's autocast, emulated
            return _dit_step(model, kind)

    outputs: dict[str, list] = {"plain": [], "lean": []}
    for label, model in (("plain", plain), ("lean", lean)):  # a step apart: the hooks keep outputs
        hooks = [m.register_forward_hook(lambda m, a, out, seen=outputs[label]: seen.append(out))
                 for m in model.modules() if hasattr(m, "processor")]
        step(model)
        for hook in hooks:
            hook.remove()
    (plain_kept, plain_grads), (before_kept, before_grads), (lean_kept, lean_grads) = map(
        step, (plain, before, lean))
    # what each attention layer hands on: the same dtype and values
    assert len(outputs["plain"]) == len(outputs["lean"]) > 0
    for ours, theirs in zip(outputs["lean"], outputs["plain"], strict=True):
        ours, theirs = (o if isinstance(o, tuple) else (o,) for o in (ours, theirs))
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert plain_grads and plain_grads.keys() == lean_grads.keys()
    for name, grad in plain_grads.items():
        assert torch.equal(grad, lean_grads[name]) and torch.equal(grad, before_grads[name]), name
    cfg = plain.config
    width = cfg.num_attention_heads * cfg.attention_head_dim
    image, text = (16, 6) if kind == "sd3" else (64, 6)
    blocks = cfg.num_layers + getattr(cfg, "num_single_layers", 0)
    # the kernel's query and key: batch 2 x every token x width, in the kernel's dtype
    kept = blocks * 2 * 2 * (image + text) * width * (2 if bf16 else 4)
    if kind == "flux":
        # and what to_out / to_add_out kept of a double block's output: the contiguous copies of
        # its parts (float32), or under autocast a bf16 copy of the float32 parts (SD3's parts
        # are slices of a batch of 2, not contiguous: kept as diffusers' processor keeps them)
        kept += cfg.num_layers * 2 * (image + text) * width * (2 if bf16 else 4)
    assert before_kept - lean_kept == kept, (before_kept, lean_kept)
    assert lean_kept < before_kept < plain_kept


def test_sd3_without_query_key_norms_keeps_the_plain_path():
    """SD3-medium has no query / key norms: nothing kept to recompute its query and key from; at a
    batch of 2 (the output's parts are not contiguous) it keeps what diffusers' processor keeps."""
    plain = build_sd3_pipeline(seed=0).transformer
    plain.requires_grad_(False)
    plain.add_adapter(LoraConfig(r=4, target_modules=dit.lora_targets("sd3", "all-linear")))
    lean = copy.deepcopy(plain)
    lean_dit_attention(lean)
    assert _dit_step(lean, "sd3")[0] == _dit_step(plain, "sd3")[0]


def test_wrapped_processors_get_the_lean_one_inside():
    """The eager backend and windowed image attention wrap the processor: the lean one goes
    inside the wrapper, whichever is set first (the run and the trace set them in either order)."""
    from lora_gui.models.dit import MathAttention, set_dit_attention

    first_wrapped, first_lean = _transformer("flux"), _transformer("flux")
    set_dit_attention(first_wrapped, "eager")
    assert lean_dit_attention(first_wrapped) == 2
    lean_dit_attention(first_lean)
    set_dit_attention(first_lean, "eager")
    for model in (first_wrapped, first_lean):
        procs = list(model.attn_processors.values())
        assert all(type(p) is MathAttention and type(p.inner).__name__ == "LeanFluxAttnProcessor"
                   for p in procs)
    assert _dit_step(first_wrapped, "flux")[0] == _dit_step(first_lean, "flux")[0]


def test_models_narrower_than_worth_it_keep_the_plain_path(monkeypatch):
    """Below MIN_REBUILD_WIDTH (a run's default: 256) the processor and the norms keep what
    diffusers' keep: in the tiny Flux (32 wide) a recompute costs more than it saves."""
    from lora_gui.models import stand_ins

    plain = _transformer("flux")
    lean = copy.deepcopy(plain)
    lean_frozen_layers(lean)
    before = _without_lean_attention(copy.deepcopy(plain), monkeypatch)
    monkeypatch.setattr(stand_ins, "MIN_REBUILD_WIDTH", 256)
    assert _dit_step(lean, "flux")[0] == _dit_step(before, "flux")[0]
    monkeypatch.setattr(stand_ins, "MIN_REBUILD_WIDTH", 32)  # 2 heads x 16
    assert _dit_step(lean, "flux")[0] < _dit_step(before, "flux")[0]


def test_another_attention_backend_keeps_autocasts_own_cast(monkeypatch):
    """The processor makes autocast's cast itself only where the kernel is torch's SDPA (the
    cast autocast would make); a backend it cannot tell leaves the cast to autocast, and the
    step stays the same, bit for bit."""
    from lora_gui.models import lean_attention

    assert lean_attention._native_kernel(None) and not lean_attention._native_kernel("flash")
    plain, lean = _transformer("flux", bf16=True), _transformer("flux", bf16=True)
    lean_frozen_layers(lean)
    monkeypatch.setattr(lean_attention, "_native_kernel", lambda backend: False)
    with forward_under(plain, torch.bfloat16):
        plain_grads = _dit_step(plain, "flux")[1]
    with forward_under(lean, torch.bfloat16):
        lean_grads = _dit_step(lean, "flux")[1]
    assert all(torch.equal(g, lean_grads[n]) for n, g in plain_grads.items())


def test_windowed_image_attention_keeps_diffusers_path_under_autocast():
    """Windowed image attention routes the processor's SDPA call to its own kernel: the lean
    processor inside it leaves the cast to autocast, as diffusers' processor does, so the step
    is the same, bit for bit, and every attention layer hands on the same dtype and values."""
    from lora_gui.attention.image_window import image_grid
    from lora_gui.models.dit import set_dit_attention

    plain, lean = _transformer("flux", bf16=True), _transformer("flux", bf16=True)
    for model in (plain, lean):
        set_dit_attention(model, "sdpa", image_window=1)
    lean_frozen_layers(lean)
    assert {type(p.inner).__name__ for p in lean.attn_processors.values()} == {"LeanFluxAttnProcessor"}
    results = {}
    for label, model in (("plain", plain), ("lean", lean)):
        seen: list = []
        hooks = [m.register_forward_hook(lambda m, a, out, seen=seen: seen.append(out))
                 for m in model.modules() if hasattr(m, "processor")]
        with forward_under(model, torch.bfloat16), image_grid(8, 8):
            results[label] = (_dit_step(model, "flux")[1], seen)
        for hook in hooks:
            hook.remove()
    (plain_grads, plain_out), (lean_grads, lean_out) = results["plain"], results["lean"]
    assert all(torch.equal(g, lean_grads[n]) for n, g in plain_grads.items())
    for ours, theirs in zip(lean_out, plain_out, strict=True):
        ours, theirs = (o if isinstance(o, tuple) else (o,) for o in (ours, theirs))
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_a_recompute_laid_out_otherwise_gives_the_saved_views_values():
    """What a kernel keeps may be a view of the query (diffusers' native backend permutes it);
    its recompute is laid out as the query was before the view is taken, whatever layout the
    recompute itself comes out in."""
    from lora_gui.models.lean_attention import _Strided

    base = torch.randn(2, 5, 3, 4).transpose(1, 2)  # the query, heads first, not contiguous
    view = base.permute(0, 2, 1, 3)[:, 1:]  # what the kernel saved
    recompute = _Strided(view, base, lambda args: args.contiguous())  # another layout, same values
    assert torch.equal(recompute(base.clone()), view)
    assert torch.equal(_Strided(view, base, lambda args: args)(base), view)


@pytest.mark.parametrize("qk_norm", [None, "rms_norm"])
@pytest.mark.parametrize("bf16", [False, True])
def test_sd3_output_laid_out_tokens_first_is_rebuilt_at_a_batch_of_one(qk_norm, bf16, monkeypatch):
    """SD3's kernel output is heads first, so the processor's tokens-first reshape copies it, and
    to_out / to_add_out's adapters kept that copy (at a batch of one their inputs are views of
    it) beside the kernel's own output; now they keep a recompute from the kernel's output: the
    same outputs and gradients as diffusers' processor, and exactly that copy less a block."""
    from lora_gui.models import lean_backward

    plain = build_sd3_pipeline(seed=0, qk_norm=qk_norm).transformer
    if bf16:
        plain = plain.to(torch.bfloat16)
    plain.requires_grad_(False)
    plain.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=dit.lora_targets("sd3", "all-linear"),
                                 init_lora_weights="gaussian"))
    for p in plain.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    lean, before = copy.deepcopy(plain), copy.deepcopy(plain)
    lean_frozen_layers(lean)
    with monkeypatch.context() as m:
        m.setattr(lean_backward, "lean_dit_attention", lambda module: 0)  # diffusers' processors
        lean_frozen_layers(before)
    cfg = plain.config

    def step(model: nn.Module) -> tuple[int, torch.Tensor, dict[str, torch.Tensor]]:
        gen = torch.Generator().manual_seed(4)
        inputs = {"hidden_states": torch.randn(1, cfg.in_channels, 8, 8, generator=gen),
                  "encoder_hidden_states": torch.randn(1, 6, cfg.joint_attention_dim, generator=gen),
                  "pooled_projections": torch.randn(1, cfg.pooled_projection_dim, generator=gen),
                  "timestep": torch.tensor([300.0])}
        model.zero_grad(set_to_none=True)
        tracker = StorageTracker()
        with forward_under(model, torch.bfloat16 if bf16 else None), tracker:
            out = model(**inputs).sample
            kept = tracker.live_bytes
            out.square().mean().backward()
        return kept, out.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    (before_kept, before_out, before_grads), (lean_kept, lean_out, lean_grads) = map(step, (before, lean))
    assert torch.equal(before_out, lean_out)
    for name, grad in before_grads.items():
        assert torch.equal(grad, lean_grads[name]), name
    width = cfg.num_attention_heads * cfg.attention_head_dim
    # per block, the copy: 16 image + 6 text tokens x width, in the kernel's dtype (bf16 where
    # the query is: diffusers' RMSNorm hands back its weight's dtype)
    size = (16 + 6) * width * (2 if bf16 else 4)
    copy_bytes = cfg.num_layers * size
    if qk_norm:  # and the kernel's query and key, recomputed from the norms' inputs
        copy_bytes += cfg.num_layers * 2 * size
    assert before_kept - lean_kept == copy_bytes, (before_kept, lean_kept, copy_bytes)
