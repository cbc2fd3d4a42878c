"""Tiny SD3- and Flux-shaped pipelines built from config dicts (as diffusers' own pipeline tests
build them), with tokenizers made locally: ``python -m lora_gui.models.build_dit --kind flux --out DIR``.

They exercise the DiT path offline (tests, benchmarks, and a future built-in DiT): the same
classes as Stable Diffusion 3.5 / Flux.1 (``StableDiffusion3Pipeline`` / ``FluxPipeline``,
``SD3Transformer2DModel`` / ``FluxTransformer2DModel``, CLIP + T5 encoders, an 8x-downsampling
``AutoencoderKL`` with shift and scaling factors, ``FlowMatchEulerDiscreteScheduler``),
at a width of 32-64. A 512 px picture is (512 / 16)^2 = 1,024 image tokens, as in the real
models at the same resolution. The weights are random (seeded): samples are noise.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from lora_gui.data.build_images import CAPTION_WORDS

VAE = {"sample_size": 512, "in_channels": 3, "out_channels": 3, "latent_channels": 4,
       "block_out_channels": (8, 16, 32, 32), "layers_per_block": 1, "norm_num_groups": 8,
       "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4,
       "use_quant_conv": False, "use_post_quant_conv": False,
       "shift_factor": 0.0609, "scaling_factor": 1.5035}  # SD3's VAE factors
CLIP = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4,
        "max_position_embeddings": 77, "projection_dim": 32, "hidden_act": "gelu"}
T5 = {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
      "relative_attention_num_buckets": 8, "feed_forward_proj": "gated-gelu"}
SD3_TRANSFORMER = {"sample_size": 64, "patch_size": 2, "in_channels": 4, "num_layers": 2,
                   "attention_head_dim": 8, "num_attention_heads": 4, "caption_projection_dim": 32,
                   "joint_attention_dim": 32, "pooled_projection_dim": 64, "out_channels": 4,
                   "pos_embed_max_size": 96}
FLUX_TRANSFORMER = {"patch_size": 1, "in_channels": 16, "num_layers": 1, "num_single_layers": 1,
                    "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 32,
                    "pooled_projection_dim": 32, "guidance_embeds": True, "axes_dims_rope": (4, 4, 8)}
SD3_SCHEDULER = {"num_train_timesteps": 1000, "shift": 3.0}
FLUX_SCHEDULER = {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True,
                  "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256, "max_image_seq_len": 4096}


def build_t5_tokenizer(words: tuple[str, ...] = CAPTION_WORDS):
    """A T5 (unigram) tokenizer: one piece per caption word, single characters for anything else."""
    from transformers import T5TokenizerFast

    chars = sorted(set("abcdefghijklmnopqrstuvwxyz0123456789.,-'"))
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    vocab += [("▁" + w, -1.0) for w in sorted(set(words))] + [(c, -5.0) for c in chars]
    return T5TokenizerFast(vocab=vocab, extra_ids=0)


def _clip_encoder(tokenizer, with_projection: bool, seed: int):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    config = CLIPTextConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **CLIP)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(config)


def _t5_encoder(tokenizer, seed: int):
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    return T5EncoderModel(T5Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                   eos_token_id=tokenizer.eos_token_id, **T5))


def build_sd3_pipeline(seed: int = 0, **transformer_overrides):
    """A tiny StableDiffusion3Pipeline (CLIP-L- and CLIP-G-shaped encoders with projection, a T5
    encoder, SD3 transformer with patch 2) with seeded random weights."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )

    from lora_gui.models.build_diffusion import build_tokenizer

    clip_tok, t5_tok = build_tokenizer(), build_t5_tokenizer()
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(**{**SD3_TRANSFORMER, **transformer_overrides})
    torch.manual_seed(seed + 1)
    vae = AutoencoderKL(**VAE)
    return StableDiffusion3Pipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(**SD3_SCHEDULER),
        text_encoder=_clip_encoder(clip_tok, True, seed + 2), tokenizer=clip_tok,
        text_encoder_2=_clip_encoder(clip_tok, True, seed + 3), tokenizer_2=clip_tok,
        text_encoder_3=_t5_encoder(t5_tok, seed + 4), tokenizer_3=t5_tok)


def build_flux_pipeline(seed: int = 0, **transformer_overrides):
    """A tiny FluxPipeline (CLIP encoder for the pooled embedding, T5 for the sequence, Flux
    transformer with guidance embedding unless overridden) with seeded random weights."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    from lora_gui.models.build_diffusion import build_tokenizer

    clip_tok, t5_tok = build_tokenizer(), build_t5_tokenizer()
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(**{**FLUX_TRANSFORMER, **transformer_overrides})
    torch.manual_seed(seed + 1)
    vae = AutoencoderKL(**VAE)
    scheduler = FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER)
    return FluxPipeline(transformer=transformer, vae=vae, scheduler=scheduler,
                        text_encoder=_clip_encoder(clip_tok, False, seed + 2), tokenizer=clip_tok,
                        text_encoder_2=_t5_encoder(t5_tok, seed + 3), tokenizer_2=t5_tok)


def build(out: Path, kind: str = "flux", seed: int = 0, **transformer_overrides) -> Path:
    """Saves a tiny 'sd3' or 'flux' pipeline into ``out`` (``save_pretrained``; renamed into place)."""
    make = {"sd3": build_sd3_pipeline, "flux": build_flux_pipeline}[kind]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{kind}-"))
    make(seed, **transformer_overrides).save_pretrained(tmp)
    tmp.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("sd3", "flux"), default="flux")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    path = build(args.out, args.kind)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    print(f"{args.kind} pipeline in {path}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
