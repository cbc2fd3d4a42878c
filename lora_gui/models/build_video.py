"""Builds and pretrains the built-in tiny video pipeline: ``python -m lora_gui.models.build_video``.

A ``WanPipeline`` of the same classes as Wan 2.1 (``WanTransformer3DModel`` with patch
(1, 2, 2), ``AutoencoderKLWan`` with 4x spatial and 4x temporal compression, a T5 encoder,
``FlowMatchEulerDiscreteScheduler``), small enough to pretrain on one CPU core in about half an
hour and to train a LoRA on two cores in minutes (``model: builtin:video``, the ``video-demo``
preset). Pretrained on the procedural clips of :func:`lora_gui.data.build_clips.clip_batch`
(a red, green, blue or yellow square sliding left, right, up or down over gray, 32 x 32 px, 9
frames), meant to make "a red square moving right" give one. The VAE's measured round trips
(per stage) are in docs/guide/video.md, "The demo". The parts:

- AutoencoderKLWan: base width 8, 4 latent channels (a 32 px, 9-frame clip is 4 x 3 x 8 x 8),
  a plain autoencoder (the posterior's mean decoded, no KL term), trained first on 5-frame,
  :data:`CROP` px windows of the clips of every colour, the demo's pink included (MSE, the
  square's pixels weighted :data:`FOREGROUND_WEIGHT` x, learning rate 1e-3: at 3e-3 it stayed
  at the plain-gray error); then its decoder alone on clips half of them pink
  (:func:`tune_decoder`); its latents' per-channel mean and standard deviation become
  ``latents_mean`` / ``latents_std``, so the transformer's latents have unit scale.
- WanTransformer3DModel: 4 blocks of width 64 (4 heads of 16), trained with the engine's own
  flow-matching objective (:class:`lora_gui.models.dit.FlowMatching`, kind "wan": logit-normal
  timesteps, velocity target), 10% empty captions so classifier-free guidance (the pipeline's
  default 5.0) works, and an exponential moving average of the weights (what is saved).
- A two-layer T5 encoder (width 32, :data:`TEXT_TOKENS` tokens), seeded random weights, frozen,
  with a tokenizer of one piece per caption word (:func:`lora_gui.models.build_dit.build_t5_tokenizer`):
  call the pipeline with ``max_sequence_length=8`` (the preset's ``text_max_length``).

Seeded: every step's batch, noise and timesteps come from a generator seeded by (seed, step), so
a resumed build continues exactly. The build keeps checkpoints in ``--work`` (a rerun continues
from them; delete the folder to start over) and logs to stderr.

:func:`build_pipeline` (random weights of any transformer shape) and :func:`build_ltx_pipeline`
make the untrained pipelines the tests and the GPU benches trace.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from lora_gui.config import ASSETS, BUILTIN_CLIPS

log = logging.getLogger(__name__)

VIDEO_DIR = ASSETS / "video-model"  # model=builtin:video
TEXT_TOKENS = 8  # the demo captions are 5 words; pass as max_sequence_length
# 4x spatial (two 2x stages; a 32 px clip is 8 x 8 latents) and 4x temporal compression
VAE = {"base_dim": 8, "z_dim": 4, "dim_mult": [1, 1, 1], "num_res_blocks": 1,
       "temperal_downsample": [True, True], "scale_factor_spatial": 4, "scale_factor_temporal": 4}
T5 = {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
      "relative_attention_num_buckets": 8, "feed_forward_proj": "gated-gelu"}
TRANSFORMER = {"patch_size": [1, 2, 2], "num_attention_heads": 4, "attention_head_dim": 16,
               "in_channels": 4, "out_channels": 4, "text_dim": 32, "freq_dim": 32, "ffn_dim": 128,
               "num_layers": 4, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
               "rope_max_seq_len": 32}
LOG_VARIANCE = -12.0  # an untrained VAE's posterior made narrow (random weights: std near the latents')
SCHEDULER = {"num_train_timesteps": 1000, "shift": 1.0}  # tiny clips: no shift towards high noise
CAPTION_DROPOUT = 0.1
FOREGROUND_WEIGHT = 10.0
CROP = 24  # px: the VAE trains on windows of the clips (see train_vae)
START_LOG_VARIANCE = -6.0  # the VAE posterior's at the start of its training (std 0.05)


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


def _step_generator(seed: int, step: int, phase: int) -> torch.Generator:
    """The generator of one step (so a resumed build draws what an uninterrupted one draws)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + phase * 100_003 + step)


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    from lora_gui.models.build_drawing import _lr as cosine

    return cosine(step, total, peak, warmup)


def to_pixels(clips: np.ndarray) -> torch.Tensor:
    """uint8 (B, F, H, W, 3) -> float (B, 3, F, H, W) in [-1, 1] (the video VAE's input)."""
    return torch.from_numpy(clips).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0


def train_vae(clips: np.ndarray, steps: int, seed: int, work: Path, batch: int = 8, lr: float = 1e-3):
    """Trains the AutoencoderKLWan on the clips (weighted MSE of the posterior mean's decoding);
    checkpoint in ``work``."""
    from diffusers import AutoencoderKLWan

    path = work / "vae.pt"
    torch.manual_seed(seed)
    vae = AutoencoderKLWan(**VAE)
    if path.is_file():
        vae.load_state_dict(torch.load(path, weights_only=True))
        log.info("vae: loaded from %s", path)
        return vae.eval()
    with torch.no_grad():  # start with a narrow posterior: at random init its std (about 1) drowns
        z = VAE["z_dim"]   # the means, and the decoder learns to ignore its input (gray clips)
        vae.quant_conv.weight[z:] = 0.0
        vae.quant_conv.bias[z:] = START_LOG_VARIANCE
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    start, recent = time.time(), []
    for step in range(steps):
        gen = _step_generator(seed, step, 1)
        x = to_pixels(clips[torch.randint(0, len(clips), (batch,), generator=gen).numpy()])
        # a random 5-frame, CROP x CROP px window (the VAE is convolutional: a third of a whole
        # clip's compute for the same kinds of content: a first frame alone, then a 4-frame chunk)
        t0 = int(torch.randint(0, x.shape[2] - 4, (1,), generator=gen))
        y0, x0 = (int(v) for v in torch.randint(0, x.shape[-1] - CROP + 1, (2,), generator=gen))
        x = x[:, :, t0:t0 + 5, y0:y0 + CROP, x0:x0 + CROP]
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, lr, min(50, steps // 10))
        # a plain (deterministic) autoencoder: the posterior's mean decoded, no KL term (a KL
        # pull on a tiny VAE made its decoder ignore the latents); the transformer's latents are
        # normalised by their statistics afterwards
        z = vae.encode(x).latent_dist.mode()
        # the square is a tenth of a clip: its pixels weigh FOREGROUND_WEIGHT x (else the VAE
        # first learns the gray background alone)
        squared = (vae.decode(z).sample - x) ** 2
        shape = ((x - x[..., :1, :1]).abs().amax(1, keepdim=True) > 0.1).float()
        mse = squared.mean()
        weights = 1 + (FOREGROUND_WEIGHT - 1) * shape
        loss = (squared * weights).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        recent.append(mse.item())
        if step % 25 == 0 or step == steps - 1:
            log.info("vae step %d/%d mse %.5f (%.0f s)", step, steps, sum(recent) / len(recent),
                     time.time() - start)
            recent = []
    torch.save(vae.state_dict(), path)
    return vae.eval()


def tune_decoder(vae, clips: np.ndarray, steps: int, seed: int, work: Path, batch: int = 8,
                 lr: float = 1e-3):
    """Fine-tunes the VAE's decoder alone (the encoder, so every latent, unchanged) on ``clips``
    (the build passes half of them pink: in the first stage pink was 4% of the clips and came
    back a dim magenta the detector does not see); checkpoint ``work/vae_tuned.pt``."""
    path = work / "vae_tuned.pt"
    if path.is_file():
        vae.load_state_dict(torch.load(path, weights_only=True))
        log.info("vae decoder: loaded from %s", path)
        return vae.eval()
    params = [*vae.post_quant_conv.parameters(), *vae.decoder.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    vae.train()
    start, recent = time.time(), []
    for step in range(steps):
        gen = _step_generator(seed, step, 3)
        x = to_pixels(clips[torch.randint(0, len(clips), (batch,), generator=gen).numpy()])
        t0 = int(torch.randint(0, x.shape[2] - 4, (1,), generator=gen))
        y0, x0 = (int(v) for v in torch.randint(0, x.shape[-1] - CROP + 1, (2,), generator=gen))
        x = x[:, :, t0:t0 + 5, y0:y0 + CROP, x0:x0 + CROP]
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, lr, min(50, steps // 10))
        with torch.no_grad():
            z = vae.encode(x).latent_dist.mode()
        squared = (vae.decode(z).sample - x) ** 2
        shape = ((x - x[..., :1, :1]).abs().amax(1, keepdim=True) > 0.1).float()
        loss = (squared * (1 + (FOREGROUND_WEIGHT - 1) * shape)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        recent.append(squared.mean().item())
        if step % 25 == 0 or step == steps - 1:
            log.info("decoder step %d/%d mse %.5f (%.0f s)", step, steps, sum(recent) / len(recent),
                     time.time() - start)
            recent = []
    torch.save(vae.state_dict(), path)
    return vae.eval()


@torch.no_grad()
def encode_latents(vae, clips: np.ndarray, seed: int, batch: int = 16) -> torch.Tensor:
    """Samples of the VAE posterior for every clip (unnormalised), seeded."""
    gen = torch.Generator().manual_seed(seed + 2)
    out = []
    for i in range(0, len(clips), batch):
        dist = vae.encode(to_pixels(clips[i:i + batch])).latent_dist
        out.append(dist.mean + dist.std * torch.randn(dist.mean.shape, generator=gen))
    return torch.cat(out)


def make_pipeline(transformer, vae, seed: int):
    """The WanPipeline around a transformer and a VAE, with the seeded frozen T5 and its tokenizer."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline
    from transformers import T5Config, T5EncoderModel

    from lora_gui.data.build_clips import CLIP_WORDS
    from lora_gui.models.build_dit import build_t5_tokenizer

    tokenizer = build_t5_tokenizer(CLIP_WORDS)
    tokenizer.model_max_length = TEXT_TOKENS
    torch.manual_seed(seed + 1)
    encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                      eos_token_id=tokenizer.eos_token_id, **T5)).eval()
    return WanPipeline(tokenizer=tokenizer, text_encoder=encoder, vae=vae, transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER))


@torch.no_grad()
def encode_captions(pipe, captions: list[str]) -> dict[str, torch.Tensor]:
    """caption -> its T5 embeddings (TEXT_TOKENS, 32), as the pipeline and the engine make them."""
    embeds, _ = pipe.encode_prompt(captions, do_classifier_free_guidance=False,
                                   max_sequence_length=TEXT_TOKENS, device=torch.device("cpu"))
    return {c: embeds[i] for i, c in enumerate(captions)}


def train_transformer(latents: torch.Tensor, captions: list[str], table: dict, steps: int, seed: int,
                      work: Path, batch: int = 32, lr: float = 1e-3, ema_decay: float = 0.998):
    """Trains the Wan transformer with the engine's flow-matching objective; returns the EMA copy."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanTransformer3DModel

    from lora_gui.models.dit import FlowMatching

    torch.manual_seed(seed + 3)
    model = WanTransformer3DModel(**TRANSFORMER)
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    objective = FlowMatching("wan", FlowMatchEulerDiscreteScheduler(**SCHEDULER), "logit_normal")
    path, start_step = work / "transformer.pt", 0
    if path.is_file():
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["opt"])
        start_step = state["step"]
        log.info("transformer: resumed at step %d", start_step)
    start, recent = time.time(), []
    for step in range(start_step, steps):
        gen = _step_generator(seed, step, 2)
        idx = torch.randint(0, len(latents), (batch,), generator=gen)
        drop = torch.rand(batch, generator=gen) < CAPTION_DROPOUT
        texts = ["" if d else captions[i] for i, d in zip(idx.tolist(), drop.tolist(), strict=True)]
        enc = SimpleNamespace(latents=latents[idx], hidden=torch.stack([table[t] for t in texts]))
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
        if step % 200 == 0 or step == steps - 1:
            log.info("transformer step %d/%d loss %.4f (%.0f s)", step, steps, sum(recent) / len(recent),
                     time.time() - start)
            recent = []
        if (step + 1) % 500 == 0 or step == steps - 1:
            torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                        "step": step + 1}, work / "transformer.tmp")
            (work / "transformer.tmp").replace(path)
    return ema.eval()


def draw_clips(pipe, prompts: list[str], seed: int = 0, steps: int = 10, **kwargs) -> np.ndarray:
    """(len(prompts), 9, 32, 32, 3) uint8 clips from a loaded video pipeline, prompt i drawn from a
    generator seeded ``seed + i`` (a clip does not depend on the others), with the T5 length it
    was pretrained with; ``kwargs`` go to the pipeline (e.g. ``guidance_scale``)."""
    from lora_gui.data.build_clips import FRAMES, SIDE

    out = []
    for i, prompt in enumerate(prompts):
        frames = pipe(prompt, num_inference_steps=steps, height=SIDE, width=SIDE, num_frames=FRAMES,
                      generator=torch.Generator().manual_seed(seed + i), output_type="np",
                      max_sequence_length=TEXT_TOKENS, **kwargs).frames[0]
        out.append((np.asarray(frames).clip(0, 1) * 255).round().astype(np.uint8))
    return np.stack(out)


def build(out: Path = VIDEO_DIR, *, seed: int = 0, clips: int = 1024, vae_steps: int = 400,
          decoder_steps: int = 150, transformer_steps: int = 1500, work: Path | None = None) -> Path:
    """Pretrains the pipeline and saves it into ``out`` (``save_pretrained``; renamed into place).

    ``work`` keeps the checkpoints (kept after the build, so a rerun with the same settings
    reuses them; delete it to start over).
    """
    from lora_gui.data.build_clips import COLOURS, DEMO_COLOUR, clip_batch

    t0 = time.time()
    out = Path(out)
    work = Path(work or out.parent / ".video-build")
    work.mkdir(parents=True, exist_ok=True)
    pixels, captions = clip_batch(clips, seed)
    every_colour, _ = clip_batch(clips // 4, seed + 7, tuple(COLOURS))  # the VAE sees pink too
    vae = train_vae(np.concatenate([pixels, every_colour]), vae_steps, seed, work)
    pink, _ = clip_batch(clips // 4, seed + 11, (DEMO_COLOUR,))  # the decoder: half its clips pink
    vae = tune_decoder(vae, np.concatenate([pixels[:clips // 4], pink]), decoder_steps, seed, work)
    raw = encode_latents(vae, pixels, seed)
    every = raw.transpose(0, 1).reshape(VAE["z_dim"], -1)
    mean, std = every.mean(1), every.std(1).clamp_min(1e-3)
    vae.register_to_config(latents_mean=[round(v, 5) for v in mean.tolist()],
                           latents_std=[round(v, 5) for v in std.tolist()])
    shape = (1, -1, 1, 1, 1)
    latents = (raw - torch.tensor(vae.config.latents_mean).view(shape)) / torch.tensor(
        vae.config.latents_std).view(shape)
    from diffusers import WanTransformer3DModel

    pipe = make_pipeline(WanTransformer3DModel(**TRANSFORMER), vae, seed)  # its text parts only
    table = encode_captions(pipe, ["", *sorted(set(captions))])
    t1 = time.time()
    transformer = train_transformer(latents, captions, table, transformer_steps, seed, work)
    pipe = make_pipeline(transformer, vae, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".video-"))
    pipe.save_pretrained(tmp)
    info = {"seed": seed, "clips": clips, "vae_steps": vae_steps, "decoder_steps": decoder_steps,
            "transformer_steps": transformer_steps,
            "text_tokens": TEXT_TOKENS, "build_seconds": round(time.time() - t0),
            "transformer_seconds": round(time.time() - t1), "torch_threads": torch.get_num_threads()}
    (tmp / "build.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    if (out / "BUILD.md").is_file():  # the folder's hand-written notes survive a rebuild
        shutil.copy2(out / "BUILD.md", tmp / "BUILD.md")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=VIDEO_DIR)
    parser.add_argument("--work", type=Path, default=None, help="checkpoint folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clips", type=int, default=1024)
    parser.add_argument("--vae-steps", type=int, default=400)
    parser.add_argument("--decoder-steps", type=int, default=150)
    parser.add_argument("--transformer-steps", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1 is fastest on a shared machine)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    path = build(args.out, seed=args.seed, clips=args.clips, vae_steps=args.vae_steps,
                 decoder_steps=args.decoder_steps, transformer_steps=args.transformer_steps, work=args.work)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    log.info("video pipeline in %s: %.1f MiB", path, size / 2**20)


if __name__ == "__main__":
    main()
