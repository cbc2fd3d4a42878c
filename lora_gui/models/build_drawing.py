"""Builds and pretrains the built-in drawing pipeline: ``python -m lora_gui.models.build_drawing``.

A StableDiffusion3Pipeline small enough to pretrain on two CPU cores, trained on the procedural
pictures of :mod:`lora_gui.data.drawings` (circles, squares and triangles in six colours on
white, black or gray, 64 x 64 px) so that "a red circle on a white background" gives one:

- AutoencoderKL: three levels (8, 16, 16 channels), 4x downsampling, 4 latent channels, no
  attention, two norm groups (with one channel a group, GroupNorm would remove each channel's
  mean: the very colour of a flat picture); trained first on the pictures (MSE plus a small KL
  term), then its latents' mean and standard deviation become the pipeline's ``shift_factor`` /
  ``scaling_factor``.
- SD3Transformer2DModel: patch 2, so a 64 px picture is (64 / 4 / 2)^2 = 64 image tokens (each
  an 8 x 8 px square; with patch 4, 16 tokens of 16 x 16 px, 2,400 steps drew blobs without
  corners); width 64 (4 heads of 16), 4 joint blocks, RMS q/k norm. Trained with the engine's own
  flow-matching objective (:class:`lora_gui.models.dit.FlowMatching`: logit-normal timesteps,
  SD3's output preconditioning), 10% empty captions so classifier-free guidance works, and an
  exponential moving average of the weights (what is saved).
- Two CLIP text encoders with projection (width 32, two layers, 12 tokens) and a one-layer T5
  encoder (width 64, :data:`TEXT_TOKENS` tokens), seeded random weights, frozen, with tokenizers
  made locally (one token per caption word). Pretraining used 12 T5 tokens: call the pipeline
  with ``max_sequence_length=12`` (the image demo sets ``text_max_length: 12`` and the engine's
  samples pass it); diffusers' default of 256 pads the prompt far beyond what it saw.

Seeded: every step's batch, noise and timesteps come from a generator seeded by (seed, step), so
a resumed build continues exactly; results match across machines up to float rounding. The
build keeps checkpoints in ``--work`` (a rerun continues from them; delete the folder to start
over) and logs to stderr.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from lora_gui.config import ASSETS
from lora_gui.data.build_images import CAPTION_WORDS
from lora_gui.data.drawings import PIXELS, combos, drawing_batch

log = logging.getLogger(__name__)

DRAWING_DIR = ASSETS / "drawing-model"
TEXT_TOKENS = 12  # T5 tokens per caption in pretraining; pass as max_sequence_length
CLIP_TOKENS = 12  # the captions are at most 10 tokens with start and end
VAE = {"sample_size": PIXELS, "in_channels": 3, "out_channels": 3, "latent_channels": 4,
       "block_out_channels": (8, 16, 16), "layers_per_block": 1, "norm_num_groups": 2,
       "down_block_types": ("DownEncoderBlock2D",) * 3, "up_block_types": ("UpDecoderBlock2D",) * 3,
       "use_quant_conv": False, "use_post_quant_conv": False, "mid_block_add_attention": False}
CLIP = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "max_position_embeddings": CLIP_TOKENS, "projection_dim": 32, "hidden_act": "gelu"}
T5 = {"d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 1, "num_heads": 4,
      "relative_attention_num_buckets": 8, "feed_forward_proj": "gated-gelu"}
TRANSFORMER = {"sample_size": PIXELS // 4, "patch_size": 2, "in_channels": 4, "out_channels": 4,
               "num_layers": 4, "attention_head_dim": 16, "num_attention_heads": 4,
               "joint_attention_dim": 64, "caption_projection_dim": 64, "pooled_projection_dim": 64,
               "pos_embed_max_size": PIXELS // 8, "qk_norm": "rms_norm"}
SCHEDULER = {"num_train_timesteps": 1000, "shift": 1.0}  # 64 px: no shift towards high noise
KL_WEIGHT = 1e-5
CAPTION_DROPOUT = 0.1


def _step_generator(seed: int, step: int, phase: int) -> torch.Generator:
    """The generator of one step (so a resumed build draws what an uninterrupted one draws)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + phase * 100_003 + step)


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def build_text_parts(seed: int):
    """The tokenizers (CLIP, T5) and the frozen, seeded encoders (two CLIP with projection, T5)."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    from lora_gui.models.build_diffusion import build_tokenizer
    from lora_gui.models.build_dit import build_t5_tokenizer

    tokenizer = build_tokenizer(CAPTION_WORDS)
    tokenizer.model_max_length = CLIP_TOKENS
    encoders = []
    for i in range(2):
        torch.manual_seed(seed + 10 + i)
        config = CLIPTextConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                **CLIP)
        encoders.append(CLIPTextModelWithProjection(config).eval().requires_grad_(False))
    t5_tokenizer = build_t5_tokenizer(CAPTION_WORDS)
    t5_tokenizer.model_max_length = TEXT_TOKENS
    torch.manual_seed(seed + 12)
    t5 = T5EncoderModel(T5Config(vocab_size=len(t5_tokenizer), pad_token_id=t5_tokenizer.pad_token_id,
                                 eos_token_id=t5_tokenizer.eos_token_id, **T5))
    encoders.append(t5.eval().requires_grad_(False))
    return (tokenizer, t5_tokenizer), encoders


def to_pixels(images: np.ndarray) -> torch.Tensor:
    """uint8 (B, H, W, 3) -> float (B, 3, H, W) in [-1, 1]."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def train_vae(images: np.ndarray, steps: int, seed: int, work: Path, batch: int = 12, lr: float = 3e-3):
    """Trains the AutoencoderKL on the pictures (MSE + KL_WEIGHT x KL); checkpoint in ``work``."""
    from diffusers import AutoencoderKL

    path = work / "vae.pt"
    torch.manual_seed(seed)
    vae = AutoencoderKL(**VAE)
    if path.is_file():
        vae.load_state_dict(torch.load(path, weights_only=True))
        log.info("vae: loaded from %s", path)
        return vae.eval()
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    start = time.time()
    for step in range(steps):
        gen = _step_generator(seed, step, 1)
        idx = torch.randint(0, len(images), (batch,), generator=gen)
        x = to_pixels(images[idx.numpy()])
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, lr, 100)
        posterior = vae.encode(x).latent_dist
        z = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=gen)
        recon = vae.decode(z).sample
        mse = torch.nn.functional.mse_loss(recon, x)
        loss = mse + KL_WEIGHT * posterior.kl().mean() / x[0].numel()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            log.info("vae step %d/%d mse %.5f (%.0f s)", step, steps, mse.item(), time.time() - start)
    torch.save(vae.state_dict(), path)
    return vae.eval()


@torch.no_grad()
def encode_latents(vae, images: np.ndarray, seed: int, batch: int = 256) -> torch.Tensor:
    """Samples of the VAE posterior for every picture (unscaled), seeded."""
    gen = torch.Generator().manual_seed(seed + 2)
    out = []
    for i in range(0, len(images), batch):
        dist = vae.encode(to_pixels(images[i:i + batch])).latent_dist
        out.append(dist.mean + dist.std * torch.randn(dist.mean.shape, generator=gen))
    return torch.cat(out)


def make_pipeline(transformer, vae, tokenizers, encoders):
    """The StableDiffusion3Pipeline around the parts."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    return StableDiffusion3Pipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        text_encoder=encoders[0], tokenizer=tokenizers[0], text_encoder_2=encoders[1],
        tokenizer_2=tokenizers[0], text_encoder_3=encoders[2], tokenizer_3=tokenizers[1])


@torch.no_grad()
def encode_captions(pipe, captions: list[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """caption -> (prompt embeddings (24 tokens, 64), pooled (64,)) through the pipeline's encode_prompt."""
    embeds, _, pooled, _ = pipe.encode_prompt(prompt=captions, prompt_2=None, prompt_3=None,
                                              device=torch.device("cpu"), do_classifier_free_guidance=False,
                                              max_sequence_length=TEXT_TOKENS)
    return {c: (embeds[i], pooled[i]) for i, c in enumerate(captions)}


def all_captions() -> list[str]:
    """Every caption the pretraining pictures can have, and the empty one (guidance)."""
    from lora_gui.data.drawings import PRETRAIN_SHAPES, SIZE_WORDS, caption

    out = [""]
    for shape, colour, background in combos(PRETRAIN_SHAPES):
        out += [caption(shape, colour, background, s) for s in (None, *SIZE_WORDS)]
    return out


def train_dit(latents: torch.Tensor, captions: list[str], table: dict, steps: int, seed: int, work: Path,
              batch: int = 32, lr: float = 1e-3, ema_decay: float = 0.998):
    """Trains the SD3 transformer with the engine's flow-matching objective; returns the EMA copy."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

    from lora_gui.models.dit import FlowMatching

    torch.manual_seed(seed + 3)
    model = SD3Transformer2DModel(**TRANSFORMER)
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    objective = FlowMatching("sd3", FlowMatchEulerDiscreteScheduler(**SCHEDULER), "logit_normal",
                             precondition_outputs=True)
    path, start_step = work / "dit.pt", 0
    if path.is_file():
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["opt"])
        start_step = state["step"]
        log.info("dit: resumed at step %d", start_step)
    start, recent = time.time(), []
    for step in range(start_step, steps):
        gen = _step_generator(seed, step, 2)
        idx = torch.randint(0, len(latents), (batch,), generator=gen)
        drop = torch.rand(batch, generator=gen) < CAPTION_DROPOUT
        texts = ["" if d else captions[i] for i, d in zip(idx.tolist(), drop.tolist(), strict=True)]
        enc = SimpleNamespace(latents=latents[idx], hidden=torch.stack([table[t][0] for t in texts]),
                              pooled=torch.stack([table[t][1] for t in texts]))
        noise = torch.randn(enc.latents.shape, generator=gen)
        draws = torch.randint(0, 1000, (batch,), generator=gen)
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, lr, 200)
        loss = objective.loss(model, enc, noise, draws)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            decay = min(ema_decay, (1 + step) / (10 + step))
            for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                e.lerp_(p, 1 - decay)
        recent.append(loss.item())
        if step % 100 == 0 or step == steps - 1:
            log.info("dit step %d/%d loss %.4f (%.0f s)", step, steps, sum(recent) / len(recent),
                     time.time() - start)
            recent = []
        if (step + 1) % 500 == 0 or step == steps - 1:
            torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                        "step": step + 1}, work / "dit.tmp")
            (work / "dit.tmp").replace(path)
    return ema.eval()


def draw_pictures(pipe, prompts: list[str], seed: int = 0, steps: int = 20, **kwargs) -> list:
    """One 64 px picture per prompt from a loaded drawing pipeline (prompt i drawn from a
    generator seeded ``seed + i``, so a picture does not depend on the others), with the T5
    length it was pretrained with; ``kwargs`` go to the pipeline (e.g. ``guidance_scale``)."""
    generators = [torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
    return pipe(prompt=prompts, num_inference_steps=steps, height=PIXELS, width=PIXELS,
                generator=generators, max_sequence_length=TEXT_TOKENS, **kwargs).images


def build(out: Path = DRAWING_DIR, *, seed: int = 0, images: int = 8192, vae_steps: int = 700,
          dit_steps: int = 10000, work: Path | None = None) -> Path:
    """Pretrains the pipeline and saves it into ``out`` (``save_pretrained``; renamed into place).

    ``work`` keeps the checkpoints (kept after the build, so a rerun with the same settings
    reuses them; delete it to start over).
    """
    t0 = time.time()
    out = Path(out)
    work = Path(work or out.parent / ".drawing-build")
    work.mkdir(parents=True, exist_ok=True)
    pixels, captions = drawing_batch(images, seed)
    log.info("%d pictures drawn (%.0f s)", len(pixels), time.time() - t0)
    vae = train_vae(pixels, vae_steps, seed, work)
    raw = encode_latents(vae, pixels, seed)
    shift, std = raw.mean().item(), raw.std().item()
    vae.register_to_config(shift_factor=round(shift, 4), scaling_factor=round(1.0 / std, 4))
    latents = (raw - vae.config.shift_factor) * vae.config.scaling_factor
    tokenizer, encoders = build_text_parts(seed)
    from diffusers import SD3Transformer2DModel

    pipe = make_pipeline(SD3Transformer2DModel(**TRANSFORMER), vae, tokenizer, encoders)  # its config only
    table = encode_captions(pipe, all_captions())
    t1 = time.time()
    transformer = train_dit(latents, captions, table, dit_steps, seed, work)
    pipe = make_pipeline(transformer, vae, tokenizer, encoders)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".drawing-"))
    pipe.save_pretrained(tmp)
    info = {"seed": seed, "images": images, "vae_steps": vae_steps, "dit_steps": dit_steps,
            "text_tokens": TEXT_TOKENS, "build_seconds": round(time.time() - t0),
            "dit_seconds": round(time.time() - t1), "torch_threads": torch.get_num_threads()}
    (tmp / "build.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    if (out / "BUILD.md").is_file():  # the folder's hand-written notes survive a rebuild
        shutil.copy2(out / "BUILD.md", tmp / "BUILD.md")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DRAWING_DIR)
    parser.add_argument("--work", type=Path, default=None, help="checkpoint folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--images", type=int, default=8192)
    parser.add_argument("--vae-steps", type=int, default=700)
    parser.add_argument("--dit-steps", type=int, default=10000)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1 is fastest on a shared machine)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    path = build(args.out, seed=args.seed, images=args.images, vae_steps=args.vae_steps,
                 dit_steps=args.dit_steps, work=args.work)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    log.info("drawing pipeline in %s: %.1f MiB", path, size / 2**20)


if __name__ == "__main__":
    main()
