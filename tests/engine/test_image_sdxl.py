"""The SDXL path: two text encoders, pooled embedding and time ids, on a tiny SDXL pipeline
built in code (same layout as a real one: StableDiffusionXLPipeline.save_pretrained)."""

import json

import pytest
import torch

from lora_gui.data.build_images import build
from lora_gui.engine.image.train import train_image
from lora_gui.models.build_diffusion import SCHEDULER, VAE, build_tokenizer
from lora_gui.models.diffusion import load_pipeline
from lora_gui.presets import load_config


@pytest.fixture(scope="module")
def sdxl_dir(tmp_path_factory):
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    tok = build_tokenizer()
    torch.manual_seed(0)
    text = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=77)
    enc1 = CLIPTextModel(CLIPTextConfig(hidden_size=32, **text))
    enc2 = CLIPTextModelWithProjection(CLIPTextConfig(hidden_size=32, projection_dim=32, **text))
    unet = UNet2DConditionModel(
        sample_size=64, block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=64,  # 32 + 32
        attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, projection_class_embeddings_input_dim=32 + 6 * 8)
    euler = {k: v for k, v in SCHEDULER.items() if k not in ("clip_sample", "set_alpha_to_one")}
    pipe = StableDiffusionXLPipeline(vae=AutoencoderKL(**VAE), text_encoder=enc1, text_encoder_2=enc2,
                                     tokenizer=tok, tokenizer_2=tok, unet=unet,
                                     scheduler=EulerDiscreteScheduler(**euler))
    out = tmp_path_factory.mktemp("sdxl") / "pipe"
    pipe.save_pretrained(out)
    return out


def test_sdxl_lora_trains_with_added_conditioning_and_loads(sdxl_dir, tmp_path):
    data = tmp_path / "pics"
    build(data, count=3)
    cfg = load_config("image-512", {"model": str(sdxl_dir), "data": str(data), "max_steps": 1,
                                    "batch_size": 1, "eval_fraction": 0.0, "monitor_hz": 0,
                                    "sample_images": 0})
    summary = train_image(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed" and summary["steps"] == 1
    assert json.loads((tmp_path / "run" / "adapter" / "adapter_info.json").read_text())["kind"] == "sdxl"
    pipe = load_pipeline(str(sdxl_dir), tmp_path / "run" / "adapter")
    assert "default_0" in pipe.unet.peft_config
    image = pipe("a red circle", num_inference_steps=1, height=128, width=128).images[0]
    assert image.size == (128, 128)
