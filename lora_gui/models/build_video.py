"""Builds the built-in tiny video pipeline: ``python -m lora_gui.models.build_video``.

A ``WanPipeline`` of the same classes as Wan 2.1 (``WanTransformer3DModel`` with patch
(1, 2, 2), ``AutoencoderKLWan`` with 8x spatial and 4x temporal compression, a T5 encoder,
``FlowMatchEulerDiscreteScheduler``) at a width of 32, small enough to train a LoRA on two CPU
cores in minutes (``model: builtin:video``, the ``video-demo`` preset). The weights are seeded
random ones: the pipeline is not pretrained, so its samples are noise before and after a LoRA;
what a run shows is the loss, the memory plan against the tracked peak, the clips' path through
cache and buckets, and an adapter that ``WanPipeline.load_lora_weights`` reads.

The VAE's posterior is made narrow (log-variance -12), as a trained VAE's is: with random
weights its sampled latents would be mostly noise. Its ``latents_mean`` / ``latents_std`` are
measured on the demo clips (:mod:`lora_gui.data.build_clips`), as a real VAE's are on its data,
so the latents the transformer trains on have unit scale. The tokenizer has one piece per caption word
(:func:`lora_gui.models.build_dit.build_t5_tokenizer`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from lora_gui.config import ASSETS, BUILTIN_CLIPS

VIDEO_DIR = ASSETS / "video-model"  # model=builtin:video
TEXT_TOKENS = 8  # the demo captions are at most 6 words; pass as max_sequence_length
VAE = {"base_dim": 8, "z_dim": 4, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1,
       "temperal_downsample": [False, True, True]}
T5 = {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
      "relative_attention_num_buckets": 8, "feed_forward_proj": "gated-gelu"}
TRANSFORMER = {"patch_size": [1, 2, 2], "num_attention_heads": 2, "attention_head_dim": 16,
               "in_channels": 4, "out_channels": 4, "text_dim": 32, "freq_dim": 32, "ffn_dim": 64,
               "num_layers": 2, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
               "rope_max_seq_len": 32}
LOG_VARIANCE = -12.0  # the VAE posterior's (random weights would give a std near the latents' own)
SCHEDULER = {"num_train_timesteps": 1000, "shift": 1.0}  # tiny clips: no shift towards high noise


def build_pipeline(seed: int = 0, clips: Path | None = BUILTIN_CLIPS, **transformer_overrides):
    """The tiny WanPipeline with seeded random weights; ``clips``: a folder whose clips set the
    VAE's latent statistics (None: mean 0, std 1)."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import T5Config, T5EncoderModel

    from lora_gui.data.build_clips import CLIP_WORDS
    from lora_gui.models.build_dit import build_t5_tokenizer

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(**VAE, latents_mean=[0.0] * VAE["z_dim"], latents_std=[1.0] * VAE["z_dim"])
    with torch.no_grad():  # a trained VAE's posterior is narrow: log-variance -12 (std 0.0025)
        z = VAE["z_dim"]
        vae.quant_conv.weight[z:] = 0.0
        vae.quant_conv.bias[z:] = LOG_VARIANCE
    tokenizer = build_t5_tokenizer(CLIP_WORDS)
    tokenizer.model_max_length = TEXT_TOKENS
    torch.manual_seed(seed + 1)
    encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                      eos_token_id=tokenizer.eos_token_id, **T5))
    torch.manual_seed(seed + 2)
    transformer = WanTransformer3DModel(**{**TRANSFORMER, **transformer_overrides})
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=encoder, vae=vae, transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER))
    if clips is not None and Path(clips).is_dir():
        mean, std = latent_statistics(vae, Path(clips))
        vae.register_to_config(latents_mean=mean, latents_std=std)
    return pipe


# a tiny LTX-Video: 8x spatial (patch 1, three 2x stages) and 8x temporal compression, so clips
# are 8k+1 frames and multiples of 8 px a side (the published VAE: patch 4, 32 px)
LTX_VAE = {"latent_channels": 4, "block_out_channels": [8, 8, 8, 8],
           "decoder_block_out_channels": [8, 8, 8, 8], "layers_per_block": [1, 1, 1, 1, 1],
           "decoder_layers_per_block": [1, 1, 1, 1, 1],
           "spatio_temporal_scaling": [True, True, True, False],
           "decoder_spatio_temporal_scaling": [True, True, True, False], "patch_size": 1, "patch_size_t": 1}
LTX_TRANSFORMER = {"in_channels": 4, "out_channels": 4, "patch_size": 1, "patch_size_t": 1,
                   "num_attention_heads": 2, "attention_head_dim": 16, "num_layers": 2,
                   "caption_channels": 32}


def build_ltx_pipeline(seed: int = 0, **transformer_overrides):
    """A tiny ``LTXPipeline`` with seeded random weights (LTX-Video's classes at a width of 32;
    ``transformer_overrides`` change the transformer's shape), its VAE's posterior made narrow as
    the Wan one's (:data:`LOG_VARIANCE`)."""
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )
    from transformers import T5Config, T5EncoderModel

    from lora_gui.data.build_clips import CLIP_WORDS
    from lora_gui.models.build_dit import build_t5_tokenizer

    torch.manual_seed(seed)
    vae = AutoencoderKLLTXVideo(**LTX_VAE)
    with torch.no_grad():  # the encoder's last channel is the shared log-variance of its posterior
        conv = vae.encoder.conv_out.conv
        conv.weight[-1] = 0.0
        conv.bias[-1] = LOG_VARIANCE
    tokenizer = build_t5_tokenizer(CLIP_WORDS)
    tokenizer.model_max_length = TEXT_TOKENS
    torch.manual_seed(seed + 1)
    encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                      eos_token_id=tokenizer.eos_token_id, **T5))
    torch.manual_seed(seed + 2)
    shape = {**LTX_TRANSFORMER, **transformer_overrides}
    # the caption projection maps prompts to the transformer's width, which cross-attention reads
    shape["cross_attention_dim"] = shape["num_attention_heads"] * shape["attention_head_dim"]
    transformer = LTXVideoTransformer3DModel(**shape)
    return LTXPipeline(tokenizer=tokenizer, text_encoder=encoder, vae=vae, transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER))


@torch.no_grad()
def latent_statistics(vae, folder: Path) -> tuple[list[float], list[float]]:
    """Per-channel mean and standard deviation of the VAE's latent means over the clips of
    ``folder`` (each cut to its first 4k+1 frames)."""
    from lora_gui.data.videos import ClipItem, frame_bucket, load_clip, load_clips

    latents = []
    for item in load_clips(folder, min_frames=5):
        n = frame_bucket(item.frames, item.frames, 4)
        pixels = load_clip(ClipItem(item.path, "", item.size, item.frames), (*item.size, n))
        latents.append(vae.encode(pixels[None]).latent_dist.mean.transpose(0, 1).reshape(VAE["z_dim"], -1))
    every = torch.cat(latents, dim=1)
    return every.mean(1).tolist(), every.std(1).clamp_min(1e-3).tolist()


def build(out: Path = VIDEO_DIR, seed: int = 0) -> Path:
    """Builds and saves the pipeline into ``out`` (written beside it first, then renamed)."""
    pipe = build_pipeline(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        pipe.save_pretrained(tmp)
        record = {"seed": seed, "text_tokens": TEXT_TOKENS}
        (Path(tmp) / "build.json").write_text(json.dumps(record, indent=1))
        if out.exists():
            import shutil

            shutil.rmtree(out)
        Path(tmp).rename(out)
        Path(tmp).mkdir()  # the context manager removes it again
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=VIDEO_DIR)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"built {build(args.out, args.seed)}")


if __name__ == "__main__":
    main()
