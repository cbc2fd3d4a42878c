"""Builds the built-in tiny LTX-Video pipeline: ``python -m lora_gui.models.build_ltx``.

An ``LTXPipeline`` of LTX-Video's classes (``LTXVideoTransformer3DModel``, ``AutoencoderKLLTXVideo``
with 8x temporal compression, a T5 encoder, ``FlowMatchEulerDiscreteScheduler``) at a width of
32, small enough to train a LoRA on two CPU cores in a few minutes (``model: builtin:ltx``, the
``ltx-demo`` preset). Clips are ``8k + 1`` frames as for the published VAE; its spatial
compression is 8x (patch 1, three 2x stages) where the published one's is 32x (patch 4), so that
the demo's 32 x 32 px clips are 4 x 4 latent pixels rather than one.

The weights are seeded random ones: the pipeline is not pretrained, so its samples are noise
before and after a LoRA; what a run shows is the loss, the memory plan against the tracked peak
and an adapter that ``LTXPipeline.load_lora_weights`` (and ComfyUI, from ``export_kohya``) reads.
The VAE's posterior is made narrow (log-variance -12), as a trained VAE's is; its
``latents_mean`` / ``latents_std`` buffers are measured on the clips (``assets/video-clips``), so
that the latents the transformer trains on have unit scale. The tokenizer has one piece per word
of the clips' captions (:func:`lora_gui.models.build_dit.build_t5_tokenizer`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from lora_gui.config import ASSETS, BUILTIN_CLIPS

LTX_DIR = ASSETS / "ltx-model"  # model=builtin:ltx
TEXT_TOKENS = 8  # the demo captions are at most 6 words; pass as max_sequence_length
# words every tokenizer holds besides the clips' captions (the demo's colours and directions)
BASE_WORDS = ("a", "square", "moving", "red", "green", "blue", "yellow", "left", "right", "up", "down")
VAE = {"latent_channels": 4, "block_out_channels": [8, 8, 8, 8],
       "decoder_block_out_channels": [8, 8, 8, 8], "layers_per_block": [1, 1, 1, 1, 1],
       "decoder_layers_per_block": [1, 1, 1, 1, 1],
       "spatio_temporal_scaling": [True, True, True, False],
       "decoder_spatio_temporal_scaling": [True, True, True, False], "patch_size": 1, "patch_size_t": 1}
T5 = {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
      "relative_attention_num_buckets": 8, "feed_forward_proj": "gated-gelu"}
TRANSFORMER = {"in_channels": 4, "out_channels": 4, "patch_size": 1, "patch_size_t": 1,
               "num_attention_heads": 2, "attention_head_dim": 16, "num_layers": 2,
               "caption_channels": 32, "cross_attention_dim": 32}
LOG_VARIANCE = -12.0  # the VAE posterior's (random weights would give a std near the latents' own)
SCHEDULER = {"num_train_timesteps": 1000, "shift": 1.0}  # tiny clips: no shift towards high noise


def caption_words(folder: Path | None) -> tuple[str, ...]:
    """Every word of the ``.txt`` captions in ``folder`` with :data:`BASE_WORDS`."""
    words = set(BASE_WORDS)
    if folder is not None and Path(folder).is_dir():
        for path in sorted(Path(folder).glob("*.txt")):
            words.update(path.read_text(encoding="utf-8").lower().split())
    return tuple(sorted(words))


def build_pipeline(seed: int = 0, clips: Path | None = BUILTIN_CLIPS, **transformer_overrides: Any) -> Any:
    """The tiny LTXPipeline with seeded random weights; ``clips``: a folder whose clips set the
    VAE's latent statistics and the tokenizer's words (None: mean 0, std 1, :data:`BASE_WORDS`);
    ``transformer_overrides`` change the transformer's shape."""
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )
    from transformers import T5Config, T5EncoderModel

    from lora_gui.models.build_dit import build_t5_tokenizer

    torch.manual_seed(seed)
    vae = AutoencoderKLLTXVideo(**VAE)
    with torch.no_grad():  # the encoder's last channel is the shared log-variance of its posterior
        conv = vae.encoder.conv_out.conv
        conv.weight[-1] = 0.0
        conv.bias[-1] = LOG_VARIANCE
    tokenizer = build_t5_tokenizer(caption_words(clips))
    tokenizer.model_max_length = TEXT_TOKENS
    torch.manual_seed(seed + 1)
    encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                      eos_token_id=tokenizer.eos_token_id, **T5))
    torch.manual_seed(seed + 2)
    shape = {**TRANSFORMER, **transformer_overrides}
    # the caption projection maps prompts to the transformer's width, which cross-attention reads
    shape["cross_attention_dim"] = shape["num_attention_heads"] * shape["attention_head_dim"]
    transformer = LTXVideoTransformer3DModel(**shape)
    if clips is not None and Path(clips).is_dir():
        mean, std = latent_statistics(vae, Path(clips))
        with torch.no_grad():  # buffers of the VAE (saved with its weights), not config entries
            vae.latents_mean.copy_(mean)
            vae.latents_std.copy_(std)
    return LTXPipeline(tokenizer=tokenizer, text_encoder=encoder, vae=vae, transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER))


@torch.no_grad()
def latent_statistics(vae: Any, folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation of the VAE's latent means over the clips of
    ``folder`` (each cut to its first 8k+1 frames at its own size)."""
    from lora_gui.data.videos import ClipItem, frame_bucket, load_clip, load_clips
    from lora_gui.models.ltx import vae_factors

    temporal, _spatial = vae_factors(dict(vae.config))
    channels = int(vae.config.latent_channels)
    latents = []
    for item in load_clips(folder, min_frames=temporal + 1):
        n = frame_bucket(item.frames, item.frames, temporal)
        pixels = load_clip(ClipItem(item.path, "", item.size, item.frames), (*item.size, n))
        latents.append(vae.encode(pixels[None]).latent_dist.mean.transpose(0, 1).reshape(channels, -1))
    if not latents:
        return torch.zeros(channels), torch.ones(channels)
    every = torch.cat(latents, dim=1)
    return every.mean(1), every.std(1).clamp_min(1e-3)


def build(out: Path = LTX_DIR, seed: int = 0, clips: Path | None = BUILTIN_CLIPS) -> Path:
    """Builds and saves the pipeline into ``out`` (written beside it first, then renamed)."""
    pipe = build_pipeline(seed, clips)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        pipe.save_pretrained(tmp)
        record = {"seed": seed, "text_tokens": TEXT_TOKENS, "clips": _shown(clips),
                  "latents_mean": pipe.vae.latents_mean.tolist(),
                  "latents_std": pipe.vae.latents_std.tolist()}
        (Path(tmp) / "build.json").write_text(json.dumps(record, indent=1))
        (Path(tmp) / "BUILD.md").write_text(BUILD_NOTE)
        if out.exists():
            shutil.rmtree(out)
        Path(tmp).rename(out)
        Path(tmp).mkdir()  # the context manager removes it again
    return out


def _shown(folder: Path | None) -> str | None:
    """A folder as the record names it: relative to the repository when inside it."""
    if folder is None:
        return None
    try:
        return str(Path(folder).resolve().relative_to(ASSETS.parent))
    except ValueError:
        return str(folder)


BUILD_NOTE = """Built by `python -m lora_gui.models.build_ltx` (seeded, after
`python -m lora_gui.data.build_clips`, whose clips set the VAE's latent statistics and the
tokenizer's words). An LTXPipeline of LTX-Video's classes at a width of 32 (VAE: 8x temporal,
8x spatial compression), with random weights (not pretrained: its samples are noise). Clips are
8k+1 frames; use `max_sequence_length=8`:

    pipe = LTXPipeline.from_pretrained("assets/ltx-model")
    pipe("a red square moving right", height=32, width=32, num_frames=9, max_sequence_length=8)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=LTX_DIR)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clips", type=Path, default=BUILTIN_CLIPS)
    args = parser.parse_args()
    print(f"built {build(args.out, args.seed, args.clips)}")


if __name__ == "__main__":
    main()
