"""The lean DiT attention processors are copies of diffusers' own: on the installed diffusers each
copy gives diffusers' outputs and gradients, bit for bit, on a tiny attention layer; on a release
they were not checked against, or one without the private helper the Flux copy calls, diffusers'
own processors stay, with one warning, in the run and in its plan's trace alike."""

import copy
import logging

import pytest
import torch
from diffusers.models.attention_processor import Attention, JointAttnProcessor2_0
from diffusers.models.transformers import transformer_flux
from diffusers.models.transformers.transformer_flux import FluxAttention, FluxAttnProcessor
from peft import LoraConfig

from lora_gui.config import RunConfig
from lora_gui.models import dit, lean_attention, stand_ins
from lora_gui.models.build_dit import (
    FLUX_TRANSFORMER,
    SD3_TRANSFORMER,
    build_flux_pipeline,
    build_sd3_pipeline,
)
from lora_gui.models.lean_backward import lean_frozen_layers

WIDTH, HEADS, IMAGE, TEXT = 32, 2, 12, 5  # a tiny layer: 2 heads of 16, 12 image and 5 text tokens
CHECKED = lean_attention.copies_unusable() is None


@pytest.fixture(autouse=True)
def _every_width_and_fresh_warnings(monkeypatch):
    """The tiny layers are narrower than where a run rebuilds (tested apart): rebuild every width;
    each test sees its own warnings (one per reason and process)."""
    monkeypatch.setattr(stand_ins, "MIN_REBUILD_WIDTH", 0)
    lean_attention._warn_unusable.cache_clear()
    yield
    lean_attention._warn_unusable.cache_clear()


def _joint_layer(text: bool, context_pre_only: bool, qk_norm: str | None) -> Attention:
    """An SD3 block's attention layer, as diffusers' JointTransformerBlock builds it."""
    torch.manual_seed(0)
    return Attention(query_dim=WIDTH, cross_attention_dim=None, added_kv_proj_dim=WIDTH if text else None,
                     dim_head=WIDTH // HEADS, heads=HEADS, out_dim=WIDTH, context_pre_only=context_pre_only,
                     bias=True, processor=JointAttnProcessor2_0(), qk_norm=qk_norm, eps=1e-6)


def _flux_layer(text: bool) -> FluxAttention:
    """A Flux double block's attention layer (text: its added projections) or a single block's."""
    torch.manual_seed(0)
    if text:
        return FluxAttention(query_dim=WIDTH, added_kv_proj_dim=WIDTH, dim_head=WIDTH // HEADS, heads=HEADS,
                             out_dim=WIDTH, context_pre_only=False, bias=True, processor=FluxAttnProcessor())
    return FluxAttention(query_dim=WIDTH, dim_head=WIDTH // HEADS, heads=HEADS, out_dim=WIDTH, bias=True,
                         processor=FluxAttnProcessor(), eps=1e-6, pre_only=True)


def _rotary(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flux's rotary embedding as its transformer hands it to each layer: (cos, sin), tokens x head dim."""
    angles = torch.rand(tokens, WIDTH // HEADS // 2, generator=torch.Generator().manual_seed(3)) * 6.0
    return angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)


def _forward_backward(layer: torch.nn.Module, text: bool, flux: bool) -> tuple[list, dict]:
    """The layer's outputs and every gradient (its inputs' and its weights') of one step."""
    gen = torch.Generator().manual_seed(1)
    image = torch.randn(2, IMAGE, WIDTH, generator=gen).requires_grad_()
    inputs = {"hidden_states": image}
    if text:
        inputs["encoder_hidden_states"] = torch.randn(2, TEXT, WIDTH, generator=gen).requires_grad_()
    if flux:  # a single block's tokens are the text and image tokens already joined
        inputs["image_rotary_emb"] = _rotary(IMAGE + TEXT if text else IMAGE)
    out = layer(**inputs)
    outs = list(out) if isinstance(out, tuple) else [out]
    sum((o.float() * torch.linspace(-1, 1, o.shape[-1])).square().mean() for o in outs).backward()
    grads = {name: t.grad for name, t in inputs.items() if isinstance(t, torch.Tensor)}
    grads.update({name: p.grad for name, p in layer.named_parameters() if p.grad is not None})
    return outs, grads


def _compare_with_diffusers(layer: torch.nn.Module, lean_class: type, text: bool, flux: bool,
                            monkeypatch) -> int:
    """Runs ``layer`` with diffusers' processor and a copy with ``lean_class``: the same outputs
    and gradients; returns how many kernel calls kept their query and key as recomputes."""
    lean_layer = copy.deepcopy(layer)
    lean_layer.set_processor(lean_class())
    recomputes = []
    real = lean_attention._kernel_keeping_recomputes
    monkeypatch.setattr(lean_attention, "_kernel_keeping_recomputes",
                        lambda *a, **k: recomputes.append(1) or real(*a, **k))
    theirs, their_grads = _forward_backward(layer, text, flux)
    ours, our_grads = _forward_backward(lean_layer, text, flux)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert their_grads.keys() == our_grads.keys() and len(their_grads) > 2
    for name, grad in their_grads.items():
        assert torch.equal(our_grads[name], grad), name
    return len(recomputes)


def _copied_release():
    if not CHECKED:
        pytest.skip(f"the installed diffusers: {lean_attention.copies_unusable()}; runs use diffusers' "
                    "own processors there (tested below); compare the copies before listing it")


@pytest.mark.parametrize(("text", "context_pre_only", "qk_norm"), [
    (True, False, "rms_norm"),  # SD3.5's joint blocks
    (True, True, "rms_norm"),  # its last block: the text tokens' output is not projected
    (False, None, "rms_norm"),  # attention over image tokens only
    (True, False, None),  # SD3-medium: no query / key norms (nothing to recompute from)
])
def test_joint_copy_matches_diffusers_processor(text, context_pre_only, qk_norm, monkeypatch):
    _copied_release()
    layer = _joint_layer(text, context_pre_only, qk_norm)
    calls = _compare_with_diffusers(layer, lean_attention._lean_joint_processor_class(), text, False,
                                    monkeypatch)
    assert calls == (1 if qk_norm else 0)  # the copied path ran, keeping its query and key as recomputes


@pytest.mark.parametrize("text", [True, False])  # a double block's attention, a single block's
def test_flux_copy_matches_diffusers_processor(text, monkeypatch):
    _copied_release()
    calls = _compare_with_diffusers(_flux_layer(text), lean_attention._lean_flux_processor_class(), text,
                                    True, monkeypatch)
    assert calls == 1


def _tiny(kind: str) -> torch.nn.Module:
    model = (build_sd3_pipeline(seed=0, qk_norm="rms_norm") if kind == "sd3" else build_flux_pipeline(seed=0)
             ).transformer
    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=dit.lora_targets(kind, "all-linear")))
    return model


def _processor_names(model: torch.nn.Module) -> set[str]:
    return {type(p).__name__ for p in model.attn_processors.values()}


def test_an_unchecked_diffusers_keeps_diffusers_processors_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(lean_attention, "CHECKED_DIFFUSERS", ("0.0.1",))
    import diffusers

    models = [_tiny("flux"), _tiny("flux"), _tiny("sd3")]
    with caplog.at_level(logging.WARNING, logger=lean_attention.__name__):
        for model in models:
            lean_frozen_layers(model)
    assert _processor_names(models[0]) == _processor_names(models[1]) == {"FluxAttnProcessor"}
    assert _processor_names(models[2]) == {"JointAttnProcessor2_0"}
    warnings = [r.getMessage() for r in caplog.records if r.name == lean_attention.__name__]
    assert len(warnings) == 1, warnings  # one reason: the release, whichever processor
    assert f"diffusers {diffusers.__version__} is not a release they were checked against (0.0.1)" \
        in warnings[0] and "diffusers' own attention processors" in warnings[0]


def test_a_diffusers_without_the_flux_helper_keeps_flux_processor(monkeypatch, caplog):
    if not CHECKED:
        pytest.skip(f"the installed diffusers: {lean_attention.copies_unusable()}")
    monkeypatch.delattr(transformer_flux, lean_attention.FLUX_QKV_HELPER)
    flux, sd3 = _tiny("flux"), _tiny("sd3")
    with caplog.at_level(logging.WARNING, logger=lean_attention.__name__):
        lean_frozen_layers(flux)
        lean_frozen_layers(sd3)
    assert _processor_names(flux) == {"FluxAttnProcessor"}
    assert _processor_names(sd3) == {"LeanJointAttnProcessor"}  # its copy calls no private helper
    warnings = [r.getMessage() for r in caplog.records if r.name == lean_attention.__name__]
    assert len(warnings) == 1 and "has no transformer_flux._get_qkv_projections" in warnings[0]


@pytest.mark.parametrize("checked", [True, False])
@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_the_plan_traces_the_processor_the_run_uses(kind, checked, monkeypatch):
    """The run (diffusion.attach_unet_lora) and its plan's trace (dit_trace.build_dit, on the meta
    device) swap processors through one decision: both lean, or both diffusers' own."""
    from lora_gui.memory.predict.dit_trace import build_dit
    from lora_gui.models.diffusion import attach_unet_lora

    if checked and not CHECKED:
        pytest.skip(f"the installed diffusers: {lean_attention.copies_unusable()}")
    if not checked:
        monkeypatch.setattr(lean_attention, "CHECKED_DIFFUSERS", ("0.0.1",))
    cls = {"sd3": "SD3Transformer2DModel", "flux": "FluxTransformer2DModel"}[kind]
    transformer = {"sd3": SD3_TRANSFORMER, "flux": FLUX_TRANSFORMER}[kind]
    traced = build_dit({"_class_name": cls, **transformer}, dtype=torch.float32, lora_rank=4, lora_alpha=4,
                       target_modules=dit.lora_targets(kind, "all-linear"))
    run = (build_sd3_pipeline(seed=0) if kind == "sd3" else build_flux_pipeline(seed=0)).transformer
    run.requires_grad_(False)
    attach_unet_lora(run, RunConfig(task="image", mode="optimized"))
    plain = {"sd3": "JointAttnProcessor2_0", "flux": "FluxAttnProcessor"}[kind]
    lean = {"sd3": "LeanJointAttnProcessor", "flux": "LeanFluxAttnProcessor"}[kind]
    expected = {lean if checked else plain}
    assert _processor_names(traced.get_base_model()) == _processor_names(run) == expected
