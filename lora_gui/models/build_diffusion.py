"""Builds the built-in small diffusion pipeline: ``python -m lora_gui.models.build_diffusion``.

An SD-1.x-shaped StableDiffusionPipeline small enough to train on a CPU, saved with
``save_pretrained`` into assets/diffusion-model/ so that ``StableDiffusionPipeline.from_pretrained``
and ``pipe.load_lora_weights`` work offline:

- UNet2DConditionModel: channels (32, 64), one layer per block, cross-attention at both levels,
  so the first attention level sees (resolution / 8)^2 tokens as in SD 1.5 (4,096 at 512 px):
  what makes eager attention and large resolutions expensive is kept, at 1/200 of the width.
- AutoencoderKL: four levels (8, 16, 32, 32 channels), 8x downsampling, 4 latent channels.
- CLIPTextModel (2 layers, width 64) and a CLIPTokenizer whose BPE merges spell out the words of
  the demo captions (other text falls back to byte-level characters), 77 tokens.
- DDIM scheduler with SD's scaled-linear betas (training uses DDPM with the same betas).

The weights are random (seeded, so the files are the same on every run): the model exists to
exercise the training loop, the memory switches and the adapter format, not to draw well.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch

from lora_gui.data.build_images import CAPTION_WORDS
from lora_gui.models.diffusion import BUILTIN_DIFFUSION_DIR

SCHEDULER = {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012,
             "beta_schedule": "scaled_linear", "clip_sample": False, "set_alpha_to_one": False,
             "steps_offset": 1, "prediction_type": "epsilon"}
UNET = {"sample_size": 64, "in_channels": 4, "out_channels": 4, "block_out_channels": (32, 64),
        "layers_per_block": 1, "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), "cross_attention_dim": 64,
        "attention_head_dim": (2, 4), "norm_num_groups": 8}  # attention_head_dim = heads (diffusers)
VAE = {"sample_size": 512, "in_channels": 3, "out_channels": 3, "latent_channels": 4,
       "block_out_channels": (8, 16, 32, 32), "layers_per_block": 1, "norm_num_groups": 8,
       "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4}
TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 2, "max_position_embeddings": 77, "projection_dim": 64}


def _bytes_to_unicode() -> list[str]:
    """GPT-2 / CLIP byte-level alphabet: one printable character per byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def build_tokenizer(words: tuple[str, ...] = CAPTION_WORDS):
    """A CLIPTokenizer: byte-level characters (with and without the end-of-word mark) plus merges
    that join each caption word into one token, right to left (``c at</w>`` after ``a t</w>``)."""
    from transformers import CLIPTokenizer

    alphabet = _bytes_to_unicode()
    vocab: dict[str, int] = {}
    for token in ["<|startoftext|>", "<|endoftext|>", *alphabet, *(c + "</w>" for c in alphabet)]:
        vocab.setdefault(token, len(vocab))
    merges: list[tuple[str, str]] = []
    for word in sorted(set(words)):
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        while len(pieces) > 1:
            pair = (pieces[-2], pieces[-1])
            if pair not in merges:
                merges.append(pair)
            pieces[-2:] = [pair[0] + pair[1]]
            vocab.setdefault(pieces[-1], len(vocab))
    tok = CLIPTokenizer(vocab=vocab, merges=merges)
    tok.model_max_length = 77
    return tok


def build_pipeline(seed: int = 0):
    """The built-in StableDiffusionPipeline with seeded random weights."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(**UNET)
    torch.manual_seed(seed + 1)
    vae = AutoencoderKL(**VAE)
    torch.manual_seed(seed + 2)
    text_config = CLIPTextConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                 **TEXT)
    encoder = CLIPTextModel(text_config)
    return StableDiffusionPipeline(vae=vae, text_encoder=encoder, tokenizer=tokenizer, unet=unet,
                                   scheduler=DDIMScheduler(**SCHEDULER), safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)


def build_sdxl_pipeline(seed: int = 0):
    """A tiny StableDiffusionXLPipeline (two CLIP encoders of width 32, the second with a
    projection for the pooled embedding; a UNet with SDXL's text_time added conditioning) with
    seeded random weights: the SDXL path in tests and benchmarks."""
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    tok = build_tokenizer()
    torch.manual_seed(seed)
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
    return StableDiffusionXLPipeline(vae=AutoencoderKL(**VAE), text_encoder=enc1, text_encoder_2=enc2,
                                     tokenizer=tok, tokenizer_2=tok, unet=unet,
                                     scheduler=EulerDiscreteScheduler(**euler))


def build(out: Path = BUILTIN_DIFFUSION_DIR, seed: int = 0) -> Path:
    """Saves the pipeline into ``out`` (written to a temp folder first, then renamed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".diffusion-model-"))
    build_pipeline(seed).save_pretrained(tmp)
    (tmp / "BUILD.md").write_text(
        "Built by `python -m lora_gui.models.build_diffusion` (seeded random weights; see the "
        "module docstring). Not trained: samples from it are noise-like by design.\n", encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BUILTIN_DIFFUSION_DIR)
    args = parser.parse_args()
    path = build(args.out)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    index = json.loads((path / "model_index.json").read_text())
    print(f"{index['_class_name']} in {path}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
