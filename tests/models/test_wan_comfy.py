"""ComfyUI's Wan key names: a Wan LoRA written in them converts back, through diffusers' own
reader of that layout, to the same layers and the same weight deltas; a run writes the file and
WanPipeline.load_lora_weights reads it as it reads the diffusers file."""

from __future__ import annotations

import pytest
import torch
from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_wan_lora_to_diffusers
from peft import LoraConfig, get_peft_model_state_dict

from lora_gui.models.wan_comfy import WanExportError, comfy_layer, comfy_wan_state_dict

RANK, ALPHA = 4, 8.0
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]


def trained_lora_state() -> dict[str, torch.Tensor]:
    """A tiny Wan transformer's LoRA state with random A and B (B starts at zero in training)."""
    from lora_gui.models.build_video import build_pipeline

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


def test_comfy_wan_keys_convert_back_with_diffusers_to_the_same_deltas():
    ours = trained_lora_state()
    comfy = comfy_wan_state_dict(ours, ALPHA)
    assert "diffusion_model.blocks.0.self_attn.q.lora_down.weight" in comfy
    assert "diffusion_model.blocks.1.cross_attn.o.lora_up.weight" in comfy
    assert "diffusion_model.blocks.1.ffn.2.lora_down.weight" in comfy
    assert comfy["diffusion_model.blocks.0.self_attn.q.alpha"].item() == ALPHA
    back = _convert_non_diffusers_wan_lora_to_diffusers(dict(comfy))
    back = {k.removeprefix("transformer."): v for k, v in back.items()}
    assert set(back) == set(ours)  # every layer, none lost or added
    layers = {k.rsplit(".lora_", 1)[0] for k in ours}
    for layer in layers:  # diffusers folds alpha / rank into the weights; the delta is ours
        torch.testing.assert_close(delta(back, layer), delta(ours, layer, ALPHA / RANK))


def test_a_layer_without_a_comfy_name_is_refused_by_name():
    assert comfy_layer("blocks.12.attn2.add_k_proj") == "blocks.12.cross_attn.k_img"
    with pytest.raises(WanExportError, match="condition_embedder.time_proj has no name"):
        comfy_layer("condition_embedder.time_proj")
    with pytest.raises(WanExportError, match="lora_magnitude_vector"):
        comfy_wan_state_dict({"blocks.0.attn1.to_q.lora_magnitude_vector": torch.ones(4)}, ALPHA)


def test_a_wan_adapter_saved_with_export_kohya_loads_in_diffusers_as_its_diffusers_file(tmp_path):
    from diffusers import WanPipeline

    from lora_gui.config import RunConfig, apply_overrides
    from lora_gui.models.diffusion import image_model_for_run, resolve_pipeline_source
    from lora_gui.models.diffusion_files import KOHYA_FILE, save_adapter

    cfg = apply_overrides(RunConfig(), {"task": "video", "model": "builtin:video", "lora_rank": RANK,
                                        "lora_alpha": ALPHA, "export_kohya": True})
    model = image_model_for_run(cfg, torch.float32)
    with torch.no_grad():  # B starts at zero: give the adapter a delta to carry
        for name, p in model.unet.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p))
    adapter = save_adapter(model, tmp_path, export_kohya=True)
    fused = []
    for weight_name in ("pytorch_lora_weights.safetensors", KOHYA_FILE):
        pipe = WanPipeline.from_pretrained(resolve_pipeline_source("builtin:video"))
        pipe.load_lora_weights(str(adapter), weight_name=weight_name)
        pipe.fuse_lora()
        fused.append({k.replace(".base_layer", ""): v for k, v in pipe.transformer.state_dict().items()
                      if "lora_" not in k})
    base = WanPipeline.from_pretrained(resolve_pipeline_source("builtin:video")).transformer.state_dict()
    changed = [k for k in base if not torch.equal(base[k], fused[0][k])]
    assert len(changed) == 4 * 2 * 4  # q, k, v, out of both attentions of the 4 blocks
    for key in base:
        torch.testing.assert_close(fused[1][key], fused[0][key])
