"""Image and video runs' settings: three groups of :class:`lora_gui.config.RunConfig`'s fields
(images, video clips, DiT pipelines) and the rules that resolve their 'auto' by the mode."""

from __future__ import annotations

from dataclasses import dataclass

from lora_gui.errors import clip
from lora_gui.options import ConfigError, option

IMAGE_GRID = 64  # image sides are multiples of 64 px
CLIPS = ("image", "video")  # option(tasks=CLIPS): an image setting a video run reads too
DIT, UNET = ("sd3", "flux"), ("sd", "sdxl")  # option(kinds=...): image pipelines a setting is for


@dataclass
class ImageSettings:
    """Image runs' inputs, batches and samples (mixed into RunConfig, whose ``mode`` the rules
    below read). ``lean_backward``, a memory switch of every task, is declared among them to keep
    its place in the settings' order (the form shows it under Memory)."""

    # -- image runs (task=image); each memory switch's 'auto' follows mode ----------------------
    resolution: int = option(512, "Image: training resolution in px (64-1536, steps of 64; the "
                             "built-in drawing model draws at 64); buckets hold about resolution^2 "
                             "pixels.", "image", low=64, high=1536, tasks=CLIPS)
    cache_latents: str = option("auto", "Image: encode latents and text embeddings once and keep "
                                "them in RAM or on disk, freeing the VAE and text encoder from the "
                                "device; auto picks off (traditional) or ram (optimized).", "image",
                                choices=("auto", "off", "ram", "disk"), tasks=CLIPS)
    aspect_buckets: str = option("auto", "Image: on = aspect-ratio buckets of about equal area; off "
                                 "= square resize + centre crop; auto: off (traditional), on "
                                 "(optimized).", "image", choices=("auto", "off", "on"), tasks=CLIPS)
    image_batch: str = option("auto", "Image: fixed = batch_size images a micro-batch; adaptive = "
                              "micro-batch per bucket from batch_table (or the planner under "
                              "budget_gb), gradient accumulation keeps batch_size; auto: fixed "
                              "(traditional), adaptive (optimized).", "image",
                              choices=("auto", "fixed", "adaptive"))
    lean_backward: str = option("auto", "Keep for the backward only what it reads: LoRA layers keep "
                                "their 16-bit input once instead of a copy per adapter, and norms "
                                "their 16-bit input instead of a float32 copy (bf16 / fp16 runs); "
                                "a decoder's gated MLP keeps two of its four intermediate tensors "
                                "and recomputes the others (without checkpointing); "
                                "in a UNet, frozen convolutions keep no input and the normalised "
                                "and GELU activations are recomputed instead of kept. The same "
                                "gradients, less memory; auto: off (traditional), on (optimized).",
                                "memory", choices=("auto", "off", "on"))
    batch_table: str = option("512:8,768:4,1024:2,1536:1", "Image, adaptive batch without a budget: "
                              "micro-batch per resolution (a 24 GB card); a bucket uses the entry "
                              "of the smallest resolution whose area covers it.", "image")
    bucket_max_ratio: float = option(2.0, "Image: largest long/short side ratio of a bucket.",
                                     "image", low=1.0, high=4.0, tasks=CLIPS)
    bucket_no_upscale: bool = option(False, "Image: never upscale; images smaller than every "
                                     "bucket are skipped.", "image")
    export_kohya: bool = option(False, "Image: also write adapter/kohya_lora.safetensors (kohya / "
                                "A1111 / ComfyUI keys; SD3 / Flux.1: a layout ComfyUI reads, Forge "
                                "too for Flux.1 LoRA; Wan and LTX-Video: ComfyUI's layer names).", "image",
                                tasks=CLIPS)
    sample_images: int = option(2, "Image: sample pictures generated from validation prompts at "
                                "the end (samples/*.png; 0 = none).", "image", low=0, high=16, tasks=CLIPS)
    sample_steps: int = option(8, "Image: denoising steps per sample picture.", "image",
                               low=1, high=200, tasks=CLIPS)

    def resolved_cache_latents(self) -> str:
        """Image: 'off', 'ram' or 'disk' once 'auto' is resolved by the mode."""
        if self.cache_latents != "auto":
            return self.cache_latents
        return "off" if self.mode == "traditional" else "ram"

    def resolved_aspect_buckets(self) -> bool:
        """Image: True for aspect-ratio buckets, False for square crops."""
        if self.aspect_buckets != "auto":
            return self.aspect_buckets == "on"
        return self.mode != "traditional"

    def resolved_lean_backward(self) -> bool:
        """True when layers keep only what their backward reads (lora_gui.models.lean_backward)."""
        if self.lean_backward != "auto":
            return self.lean_backward == "on"
        return self.mode != "traditional"

    def resolved_image_batch(self) -> str:
        """Image: 'fixed' or 'adaptive' once 'auto' is resolved by the mode."""
        if self.image_batch != "auto":
            return self.image_batch
        return "fixed" if self.mode == "traditional" else "adaptive"

    def batch_by_resolution(self) -> dict[int, int]:
        """batch_table parsed: {resolution px: micro-batch}."""
        try:
            table = {int(k): int(v) for k, v in (p.split(":") for p in self.batch_table.split(","))}
        except ValueError:
            raise ConfigError(f"batch_table: {clip(self.batch_table)} is not 'px:batch,px:batch' "
                              "(e.g. 512:8,768:4)") from None
        if not table or min(table.values()) < 1 or min(table) < IMAGE_GRID:
            raise ConfigError(f"batch_table: {clip(self.batch_table)} needs positive batches and sizes")
        return table


@dataclass
class VideoSettings:
    """Video runs' clip size and frames (mixed into RunConfig)."""

    # -- video runs (task=video: lora_gui.data.videos, lora_gui.models.video) -------------------
    video_size: str = option("", "Video: clip size as WxH (e.g. 832x480); set it by giving resolution "
                             "as WxH. Empty: resolution x resolution.", "video", tasks=("video",))
    video_frames: int = option(17, "Video: the longest frame bucket (4k+1 frames for Wan, 8k+1 for "
                               "LTX-Video); a shorter clip trains on the longest bucket it fills.",
                               "video", low=1, high=1025, tasks=("video",))
    clip_frames: str = option("first", "Video: which frames of a longer clip train: its first ones, "
                              "frames spread evenly over it, or every window of consecutive frames "
                              "(a long clip trains as several clips).", "video",
                              choices=("first", "spaced", "windows"), tasks=("video",))
    blocks_to_swap: int = option(0, "Video: keep the frozen weights of the last N transformer blocks "
                                 "in the computer's memory (RAM) and copy each block to the GPU only "
                                 "while it runs; the LoRA weights stay on the GPU. Lowers the GPU's "
                                 "need by about N blocks' weights, needs as much RAM, and slows each "
                                 "step by the copies. 0 = off; at most the model's block count (Wan "
                                 "2.1 14B has 40).", "video", low=0, high=1024, tasks=("video",))
    video_window: str = option("", "Video: windowed space-time attention; 'F,H,W' lets each video token "
                               "of self-attention see only the tokens at most F latent frames, H rows and "
                               "W columns away (tokens after patching: Wan 2.1 has one a latent frame "
                               "and 2 x 2 latent pixels, i.e. 4 frames and 16 x 16 px); the text "
                               "cross-attention is unchanged. Empty or 0: full attention. It changes "
                               "what the model computes: use the adapter with the same window.",
                               "video", tasks=("video",))

    def resolved_video_window(self) -> tuple[int, int, int] | None:
        """video_window parsed: (frames, rows, columns) half-widths, or None for full attention."""
        return parse_video_window(self.video_window)


def parse_video_window(value: str) -> tuple[int, int, int] | None:
    """``"F,H,W"`` half-widths in latent tokens after patching -> (F, H, W); ``""`` or ``"0"`` ->
    None (full attention).

    Raises:
        ConfigError: naming the value, for anything but three whole numbers >= 0, not all 0.
    """
    text = str(value).strip()
    if text in ("", "0"):
        return None
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"video_window: {clip(value)} is not three whole numbers >= 0 "
                          "'frames,rows,columns' (half-widths in tokens after patching, e.g. '2,4,4'), "
                          "or empty / 0 for full attention")
    window = (int(parts[0]), int(parts[1]), int(parts[2]))
    if window == (0, 0, 0):
        raise ConfigError(f"video_window: {clip(value)} would let each token see only itself; leave it "
                          "empty (or 0) for full attention, or give a half-width >= 1")
    return window


@dataclass
class DiTSettings:
    """SD3 / Flux.1 training as diffusers' scripts run it, and SD / SDXL text encoders' LoRA
    (mixed into RunConfig)."""

    # -- DiT image models (SD3 / SD3.5, Flux.1): flow matching as diffusers' LoRA scripts -------
    weighting_scheme: str = option("auto", "DiT: timestep density and loss weighting; auto = the "
                                   "diffusers script's default (SD3: logit_normal, Flux: none).", "image",
                                   choices=("auto", "none", "sigma_sqrt", "logit_normal", "mode", "cosmap"),
                                   kinds=DIT, tasks=CLIPS)
    logit_mean: float = option(0.0, "DiT: mean of the logit_normal timestep density.", "image",
                               low=-10.0, high=10.0, kinds=DIT, tasks=CLIPS)
    logit_std: float = option(1.0, "DiT: standard deviation of the logit_normal density.", "image",
                              low=0.01, high=10.0, kinds=DIT, tasks=CLIPS)
    mode_scale: float = option(1.29, "DiT: scale of the 'mode' timestep density.", "image",
                               low=0.0, high=10.0, kinds=DIT, tasks=CLIPS)
    guidance_scale: float = option(3.5, "Flux.1-dev: the guidance value fed to its guidance "
                                   "embedding while training.", "image", low=0.0, high=30.0, kinds=("flux",))
    text_max_length: int = option(0, "DiT: T5 tokens per caption; 0 = the script's default (SD3: "
                                  "77, Flux: 512).", "image", low=0, high=512, kinds=DIT, tasks=CLIPS)
    image_window: int = option(0, "DiT: windowed attention over image tokens; each image token "
                               "attends to the image tokens at most this many rows and columns away "
                               "and to every text token; 0 = full attention. Faster at high "
                               "resolution, but holds more memory than fused SDPA.", "image", low=0, high=512,
                               kinds=DIT)
    train_text_encoder: bool = option(False, "SD 1.x / SDXL: also train LoRA on the CLIP text "
                                      "encoder(s); needs cache_latents=off (the embeddings change).",
                                      "image", kinds=UNET)
    text_encoder_lr: float = option(5e-5, "Learning rate of the text encoders' LoRA "
                                    "(train_text_encoder).", "image", low=0.0, high=1.0, kinds=UNET)


def video_side(size: str) -> int:
    """The square side (px, a multiple of 64) nearest the area of a ``WxH`` clip size: what
    ``resolution`` holds when it is given as WxH (the clip size itself goes to ``video_size``)."""
    try:
        w, h = (int(v) for v in size.lower().split("x"))
    except ValueError:
        raise ConfigError(f"resolution: {size!r} is not a side (512) or WxH (832x480)") from None
    return max(IMAGE_GRID, round((w * h) ** 0.5 / IMAGE_GRID) * IMAGE_GRID)
