"""ComfyUI's LTX-Video key names: an LTX-Video LoRA written in them converts back, through diffusers'
own reader of that layout, to the same layers and the same weight deltas (the run's scale folded
into lora_B, since neither reader takes an alpha from this layout); a run's export_kohya file
loads in LTXPipeline as its diffusers file does."""

from __future__ import annotations

import pytest
import torch
from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_ltxv_lora_to_diffusers
from peft import LoraConfig, get_peft_model_state_dict

from lora_gui.models.ltx_comfy import LtxExportError, comfy_layer, comfy_ltx_state_dict, lora_scale

RANK, ALPHA = 4, 8.0
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]


def trained_lora_state() -> dict[str, torch.Tensor]:
    """A tiny LTX-Video transformer's LoRA state with random A and B (B starts at zero in training)."""
    from lora_gui.models.build_ltx import build_pipeline

    transformer = build_pipeline(seed=1, clips=None).transformer
    transformer.add_adapter(LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p))
    return get_peft_model_state_dict(transformer)


def delta(state: dict[str, torch.Tensor], layer: str, scale: float = 1.0) -> torch.Tensor:
    return scale * state[f"{layer}.lora_B.weight"] @ state[f"{layer}.lora_A.weight"]


def test_comfy_ltx_keys_convert_back_with_diffusers_to_the_same_deltas():
    ours = trained_lora_state()
    comfy = comfy_ltx_state_dict(ours, ALPHA / RANK)
    assert "diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight" in comfy
    assert "diffusion_model.transformer_blocks.1.attn2.to_out.0.lora_B.weight" in comfy
    assert "diffusion_model.transformer_blocks.1.ff.net.2.lora_A.weight" in comfy
    assert not any(k.endswith(".alpha") for k in comfy)  # ComfyUI: scale 1 without one
    back = _convert_non_diffusers_ltxv_lora_to_diffusers(dict(comfy))
    back = {k.removeprefix("transformer."): v for k, v in back.items()}
    assert set(back) == set(ours)  # every layer, none lost or added
    layers = {k.rsplit(".lora_", 1)[0] for k in ours}
    assert len(layers) == 2 * (2 * 4 + 2)  # both blocks: q, k, v, out of both attentions, ff in and out
    for layer in layers:  # read at scale 1 (ComfyUI, diffusers without metadata): the run's delta
        torch.testing.assert_close(delta(back, layer), delta(ours, layer, ALPHA / RANK))


def test_a_layer_without_a_comfy_name_is_refused_by_name():
    assert comfy_layer("transformer_blocks.12.attn2.to_out.0") == "transformer_blocks.12.attn2.to_out.0"
    with pytest.raises(LtxExportError, match="proj_in has no name"):
        comfy_layer("proj_in")
    with pytest.raises(LtxExportError, match="time_embed.linear has no name"):
        comfy_layer("time_embed.linear")
    with pytest.raises(LtxExportError, match="lora_magnitude_vector"):
        comfy_ltx_state_dict({"transformer_blocks.0.attn1.to_q.lora_magnitude_vector": torch.ones(4)}, 1.0)


def test_the_folded_scale_is_peft_s_own():
    assert lora_scale(LoraConfig(r=4, lora_alpha=8)) == 2.0
    assert lora_scale(LoraConfig(r=4, lora_alpha=8, use_rslora=True)) == 4.0  # alpha / sqrt(rank)
    with pytest.raises(LtxExportError, match="per-layer ranks"):
        lora_scale(LoraConfig(r=4, lora_alpha=8, rank_pattern={"to_q": 8}))


def test_an_ltx_adapter_saved_with_export_kohya_loads_in_diffusers_as_its_diffusers_file(tmp_path):
    from diffusers import LTXPipeline

    from lora_gui.config import RunConfig, apply_overrides
    from lora_gui.models.diffusion import image_model_for_run, resolve_pipeline_source
    from lora_gui.models.diffusion_files import KOHYA_FILE, save_adapter

    cfg = apply_overrides(RunConfig(), {"task": "video", "model": "builtin:ltx", "lora_rank": RANK,
                                        "lora_alpha": ALPHA, "export_kohya": True})
    model = image_model_for_run(cfg, torch.float32)
    with torch.no_grad():  # B starts at zero: give the adapter a delta to carry
        for name, p in model.unet.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p))
    adapter = save_adapter(model, tmp_path, export_kohya=True)
    fused = []
    for weight_name in ("pytorch_lora_weights.safetensors", KOHYA_FILE):
        pipe = LTXPipeline.from_pretrained(resolve_pipeline_source("builtin:ltx"))
        pipe.load_lora_weights(str(adapter), weight_name=weight_name)
        pipe.fuse_lora()
        fused.append({k.replace(".base_layer", ""): v for k, v in pipe.transformer.state_dict().items()
                      if "lora_" not in k})
    base = LTXPipeline.from_pretrained(resolve_pipeline_source("builtin:ltx")).transformer.state_dict()
    changed = [k for k in base if not torch.equal(base[k], fused[0][k])]
    assert len(changed) == 2 * 2 * 4  # q, k, v, out of both attentions of both blocks
    for key in base:
        torch.testing.assert_close(fused[1][key], fused[0][key])
