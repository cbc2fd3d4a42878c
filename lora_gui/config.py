"""Settings of one run: a single source of truth for defaults, help, ranges and validation.

Every setting is a field of :class:`RunConfig` declared with :func:`option`, which carries its
default, help text, group, range and choices. CLI ``--set key=value``, preset YAML files and UI
widgets are all derived from these fields, so a setting is declared once. The keys are flat
(``lora_rank``, ``max_seq_len``...) because users type them; ``group`` orders them in the UI.

A bad value raises :class:`ConfigError` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lora_gui.errors import UserError, clip
from lora_gui.objective import PreferenceSettings
from lora_gui.options import READS, TEXT, WRITES, option

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BUILTIN_MODEL_DIR = ASSETS / "base-model"
BUILTIN_DATA = {"builtin": ASSETS / "corpus" / "finetune.txt",
                "builtin:finetune": ASSETS / "corpus" / "finetune.txt",
                "builtin:pretrain": ASSETS / "corpus" / "pretrain.txt",
                "builtin:chat": ASSETS / "chat" / "demo.jsonl",  # lora_gui.data.build_chat_demo
                "builtin:pairs": ASSETS / "pairs" / "demo.jsonl",  # lora_gui.data.build_pairs_demo
                "builtin:stars": ASSETS / "drawing-stars"}  # image folder (lora_gui.data.drawings)
BUILTIN_IMAGES = ASSETS / "images"  # data=builtin when task=image (lora_gui.data.build_images)
BUILTIN_CLIPS = ASSETS / "video-clips"  # data=builtin when task=video (lora_gui.data.build_clips)
IMAGE_GRID = 64  # image sides are multiples of 64 px
MIN_SEQ_LEN = 16  # shorter rows leave no room for a useful document
AUTO_LOSS_CHUNK = 1024  # loss_chunk=-1 in optimized mode: 1024 x vocab x 12 bytes of logits at most
TRACKERS = ("none", "tensorboard", "trackio", "mlflow", "wandb")  # report_to names
ADAPTERS = ("lora", "dora", "loha", "lokr", "oft")  # lora_gui.models.adapters
IMAGE_ADAPTERS = ADAPTERS[:4]  # OFT's blocks are not offered for UNet / DiT layers
LORA_INITS = ("default", "gaussian", "pissa", "olora", "loftq", "eva", "corda")
DATA_INITS = ("eva", "corda")  # lora_init that reads a few batches of the run's data first
DIT, UNET = ("sd3", "flux"), ("sd", "sdxl")  # option(kinds=...): image pipelines a setting is for


class ConfigError(UserError, ValueError):
    """A setting is unknown or out of range; the message names it."""


@dataclass
class RunConfig(PreferenceSettings):
    """All settings of a training run (text now; image settings join with the image engine)."""

    # -- task and model ----------------------------------------------------------------------
    task: str = option("text", "What to train: a causal language model (text), a diffusion "
                       "model's UNet (image) or a text-to-video transformer (video: Wan, LTX-Video).",
                       "task", choices=("text", "image", "video"))
    model: str = option("builtin", "Base model: 'builtin' (text: bundled 4M-parameter Llama; image: "
                        "bundled small SD-style pipeline), 'builtin:drawing' (image: bundled SD3-style "
                        "pipeline that draws shapes at 64 px), a Hugging Face id (needs network) or a "
                        "local directory saved with save_pretrained (image: SD 1.x, SDXL, SD3 / "
                        "SD3.5 or Flux.1).", "task", path=READS)
    data: str = option("builtin", "Training data: 'builtin' (text: bundled fine-tune corpus; image: "
                       "bundled demo pictures), a .txt / .jsonl / .csv file (text) or an image "
                       "folder with .txt captions or metadata.jsonl (image).", "task", path=READS)
    eval_fraction: float = option(0.05, "Share of documents held out for eval_loss.", "task",
                                  low=0.0, high=0.5)
    # -- instruction and chat data (lora_gui.data.chat) --------------------------------------------
    data_format: str = option("auto", "Text data format; auto detects it from the first record: messages "
                              "(role/content), sharegpt (conversations from/value), alpaca (instruction/"
                              "input/output), prompt_response, text.", "task",
                              choices=("auto", "messages", "sharegpt", "alpaca", "prompt_response", "text"),
                              tasks=TEXT)
    chat_template: str = option("auto", "Conversations: auto uses the tokenizer's chat template (ChatML "
                                "when it has none, with a warning); chatml forces ChatML.", "task",
                                choices=("auto", "chatml"), tasks=TEXT)
    train_on_prompt: bool = option(False, "Conversations: also take the loss on system and user turns "
                                   "(default: on the assistant answers and their end of turn only).", "task",
                                   tasks=TEXT)
    # -- the three memory switches -------------------------------------------------------------
    mode: str = option("optimized", "traditional: pad to max_seq_len, eager attention, fixed "
                       "batch. optimized: dynamic sizing, SDPA, token budget.", "memory",
                       choices=("traditional", "optimized"))
    batching: str = option("auto", "Batch builder; auto picks fixed (traditional) or bucketed "
                           "(optimized).", "memory", choices=("auto", "fixed", "bucketed", "packed"),
                           tasks=TEXT)
    attn_backend: str = option("auto", "Attention kernel; auto picks eager (traditional) or "
                               "sdpa (optimized).", "memory", choices=("auto", "eager", "sdpa"))
    token_budget: int = option(2048, "Bucketed/packed: at most this many (padded) tokens in one "
                               "micro-batch (packed: one row of several documents); steps above "
                               "it are split by gradient accumulation.",
                               "memory", low=16, high=1 << 22, tasks=TEXT)
    # 8: the tensor-core multiple of 16-bit GEMMs; 64 padded the bundled corpus 11% (8: 6%)
    pad_multiple: int = option(8, "Bucketed: pad each batch to its longest sample rounded up to "
                               "this multiple; packed: each row to this multiple (larger: fewer "
                               "shapes, more padded tokens).", "memory",
                               low=1, high=4096, tasks=TEXT)
    attention: str = option("full", "full: every token attends to all earlier ones. windowed: each "
                            "token sees the previous `window` tokens and the first `global_tokens` "
                            "of its document (Longformer style); O(S x (W + G)) instead of O(S^2).",
                            "memory", choices=("full", "windowed"), tasks=TEXT)
    window: int = option(256, "Windowed attention: tokens each query sees behind it.", "memory",
                         low=1, high=1 << 20, tasks=TEXT)
    global_tokens: int = option(4, "Windowed attention: leading tokens of each document that every "
                                "query also sees.", "memory", low=0, high=1 << 20, tasks=TEXT)
    gradient_checkpointing: bool = option(False, "Recompute activations in backward: less memory, "
                                          "about 30% more compute.", "memory")
    checkpoint_layers: int = option(0, "Gradient checkpointing: checkpoint only this many of the "
                                    "model's first decoder layers; the last ones keep their "
                                    "activations and are not recomputed (faster, more memory; the "
                                    "plan shows how much). 0 = every layer.", "memory", low=0,
                                    high=1 << 16, tasks=TEXT)
    loss_chunk: int = option(-1, "Chunked loss: compute the cross-entropy over this many token "
                             "positions at a time instead of the whole batch's float32 logits (same "
                             "value; saves ~12 bytes x vocab per token). 0 = off; -1 = auto: "
                             f"{AUTO_LOSS_CHUNK} in optimized mode, off in traditional.", "memory",
                             low=-1, high=1 << 22, tasks=TEXT)
    # long context: each switch trades speed for accelerator memory; the planner traces each one
    offload_checkpoints: bool = option(False, "Gradient checkpointing: keep each layer's saved "
                                       "input in host memory and bring it back for backward (no "
                                       "accelerator memory for checkpoints; costs host copies).",
                                       "memory", tasks=TEXT)
    mlp_chunk: int = option(0, "Sequence-tiled MLP: run each layer's MLP and its LoRA over this "
                            "many tokens at a time, so its intermediates do not grow with the "
                            "sequence (same result). 0 = off.", "memory", low=0, high=1 << 22,
                            tasks=TEXT)
    attention_head_groups: int = option(0, "Attention in head groups: run each layer's attention as "
                                        "this many calls, each over an equal share of the key/value "
                                        "heads, so the GPU kernels' backward scratch is that many "
                                        "times smaller (same result, more kernel launches). Must "
                                        "divide the model's key/value heads. 0 = one call.", "memory",
                                        low=0, high=1024, tasks=TEXT)
    embeddings_on_host: bool = option(False, "Keep the frozen input embedding table in host memory "
                                      "and move only the looked-up rows to the accelerator.",
                                      "memory", tasks=TEXT)
    precision: str = option("auto", "auto measures: bf16 on GPUs that support it, fp32 on CPUs "
                            "where bf16 autocast is slower.", "memory",
                            choices=("auto", "fp32", "bf16", "fp16"))
    budget_gb: float = option(0.0, "VRAM budget in GB (0 = none). Without a GPU it is a simulated "
                              "budget enforced by the tracker.", "memory", low=0.0, high=4096.0,
                              label="VRAM budget (GB)")
    # -- throughput-aware plan (lora_gui.memory.predict.step_time) -----------------------------
    batch_choice: str = option("fastest", "Bucketed batches under a VRAM budget: which micro-batch "
                               "each length bucket trains with, among those that fit. fastest: the "
                               "highest predicted tokens/s (step time measured on this device; of "
                               "equally fast ones the smallest); headroom: the smallest that keeps 90% "
                               "of the fastest tokens/s (more memory left free); largest: the largest "
                               "that fits.", "memory", choices=("fastest", "headroom", "largest"),
                               tasks=TEXT, label="Micro-batch choice")
    # -- fast kernels from libraries on CUDA (lora_gui.models.fast_kernels) ---------------------
    liger_kernels: str = option("auto", "CUDA: Liger-Kernel's fused RMSNorm, RoPE, SwiGLU and (without "
                                "loss_chunk) fused linear cross-entropy, from the optional liger-kernel "
                                "package. auto / on: used on a CUDA GPU with the package installed, "
                                "otherwise the run goes on without them and logs why; off: never.",
                                "memory", choices=("auto", "on", "off"), tasks=TEXT)
    compile_blocks: str = option("auto", "CUDA: compile each decoder block with torch.compile (one "
                                 "graph for every layer and length; the first steps take longer). "
                                 "auto / on: on a CUDA GPU, not on CPUs (their memory measurement runs "
                                 "compiled code eagerly); off: never.", "memory",
                                 choices=("auto", "on", "off"), tasks=TEXT)
    monitor_hz: float = option(2.0, "Memory samples per second written to memory.jsonl (0 = off).",
                               "memory", low=0.0, high=20.0)
    measure_every_step: bool = option(False, "CPU runs: measure every step's peak memory with the "
                                      "tracker (2-3x slower steps). Off: the first 2 steps of each "
                                      "step shape are measured; later ones, and steps no larger than "
                                      "a measured one, run at full speed and record no peak. GPU "
                                      "runs measure every step either way.",
                                      "memory")
    # -- training ------------------------------------------------------------------------------
    max_seq_len: int = option(1024, "Longest sample in tokens; longer documents are truncated.",
                              "train", low=MIN_SEQ_LEN, high=1 << 20, tasks=TEXT,
                              label="Max sequence length (tokens)")
    batch_size: int = option(8, "Samples per optimizer step (the effective batch).", "train",
                             low=1, high=4096)
    max_steps: int = option(0, "Stop after this many optimizer steps (0 = run all epochs).",
                            "train", low=0, high=10_000_000)
    epochs: int = option(1, "Passes over the training documents.", "train", low=1, high=1000)
    lr: float = option(1e-3, "Peak learning rate (AdamW), cosine decay after warmup.", "train",
                       low=1e-7, high=1.0, label="Learning rate")
    warmup_steps: int = option(5, "Linear warmup steps.", "train", low=0, high=1_000_000)
    weight_decay: float = option(0.0, "AdamW weight decay.", "train", low=0.0, high=1.0)
    seed: int = option(0, "Seed for the data split, data order and LoRA init.", "train",
                       low=0, high=2**31 - 1)
    checkpoint_every: int = option(50, "Save a checkpoint every N steps (and always on stop).",
                                   "train", low=1, high=10_000_000)
    report_to: str = option("none", "Also log the run to experiment trackers: a comma list of "
                            f"{', '.join(TRACKERS)} (e.g. tensorboard,trackio). TensorBoard and "
                            "trackio write beside the run (offline); mlflow needs MLFLOW_TRACKING_URI, "
                            "wandb a login (wandb login) or WANDB_MODE=offline.", "train")
    tracker_dir: str = option("", "Folder for TensorBoard and trackio data (empty: TensorBoard in the "
                              "run folder, trackio in TRACKIO_DIR or trackio/ beside the run folder).",
                              "train", path=WRITES)
    # -- image runs (task=image); each memory switch's 'auto' follows mode ----------------------
    resolution: int = option(512, "Image: training resolution in px (64-1536, steps of 64; the "
                             "built-in drawing model draws at 64); buckets hold about resolution^2 "
                             "pixels.", "image", low=64, high=1536)
    cache_latents: str = option("auto", "Image: encode latents and text embeddings once and keep "
                                "them in RAM or on disk, freeing the VAE and text encoder from the "
                                "device; auto picks off (traditional) or ram (optimized).", "image",
                                choices=("auto", "off", "ram", "disk"))
    aspect_buckets: str = option("auto", "Image: on = aspect-ratio buckets of about equal area; off "
                                 "= square resize + centre crop; auto: off (traditional), on "
                                 "(optimized).", "image", choices=("auto", "off", "on"))
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
                                     "image", low=1.0, high=4.0)
    bucket_no_upscale: bool = option(False, "Image: never upscale; images smaller than every "
                                     "bucket are skipped.", "image")
    export_kohya: bool = option(False, "Image: also write adapter/kohya_lora.safetensors (kohya / "
                                "A1111 / ComfyUI keys; SD3 / Flux.1: a layout ComfyUI reads, Forge "
                                "too for Flux.1 LoRA).", "image")
    sample_images: int = option(2, "Image: sample pictures generated from validation prompts at "
                                "the end (samples/*.png; 0 = none).", "image", low=0, high=16)
    sample_steps: int = option(8, "Image: denoising steps per sample picture.", "image",
                               low=1, high=200)
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
    # -- quantized base and 8-bit optimizer states (bitsandbytes) ------------------------------
    quantization: str = option("none", "Text: store the frozen base weights in 4-bit NF4 (QLoRA, "
                               "about 0.56 bytes/weight) or 8-bit int8 (about 1.0) instead of the "
                               "compute dtype (2 bytes in bf16); LoRA trains on top. Needs "
                               "bitsandbytes.", "quantization", choices=("none", "nf4", "int8"), tasks=TEXT)
    double_quant: bool = option(True, "nf4: also quantize the per-block scales (saves about 0.4 "
                                "bits/weight: ~0.37 GB on an 8B model).", "quantization", tasks=TEXT)
    optimizer: str = option("auto", "adamw (fp32 states, 8 bytes/trainable param), adamw8bit or "
                            "paged_adamw8bit (bitsandbytes 8-bit states, ~2 bytes/param; paged "
                            "moves them to CPU RAM under pressure on CUDA). auto: adamw for text; "
                            "image picks adamw8bit in optimized mode on a GPU with bitsandbytes.",
                            "quantization", choices=("auto", "adamw", "adamw8bit", "paged_adamw8bit"))

    # -- DiT image models (SD3 / SD3.5, Flux.1): flow matching as diffusers' LoRA scripts -------
    weighting_scheme: str = option("auto", "DiT: timestep density and loss weighting; auto = the "
                                   "diffusers script's default (SD3: logit_normal, Flux: none).", "image",
                                   choices=("auto", "none", "sigma_sqrt", "logit_normal", "mode", "cosmap"),
                                   kinds=DIT)
    logit_mean: float = option(0.0, "DiT: mean of the logit_normal timestep density.", "image",
                               low=-10.0, high=10.0, kinds=DIT)
    logit_std: float = option(1.0, "DiT: standard deviation of the logit_normal density.", "image",
                              low=0.01, high=10.0, kinds=DIT)
    mode_scale: float = option(1.29, "DiT: scale of the 'mode' timestep density.", "image",
                               low=0.0, high=10.0, kinds=DIT)
    guidance_scale: float = option(3.5, "Flux.1-dev: the guidance value fed to its guidance "
                                   "embedding while training.", "image", low=0.0, high=30.0, kinds=("flux",))
    text_max_length: int = option(0, "DiT: T5 tokens per caption; 0 = the script's default (SD3: "
                                  "77, Flux: 512).", "image", low=0, high=512, kinds=DIT)
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
    # -- LoRA ----------------------------------------------------------------------------------
    lora_rank: int = option(8, "LoRA rank r.", "lora", low=1, high=1024)
    lora_alpha: float = option(16.0, "LoRA alpha (scale = alpha / r).", "lora", low=0.0,
                               high=1e4)
    lora_dropout: float = option(0.0, "Dropout on the LoRA input.", "lora", low=0.0, high=0.9)
    lora_targets: str = option("all-linear", "Modules that get LoRA: 'all-linear' or a comma list "
                               "such as q_proj,v_proj.", "lora")
    adapter: str = option("lora", "Adapter kind: lora; dora (LoRA plus a learned magnitude per "
                          "output: often closer to full fine-tuning, about 25% slower, more "
                          "activation memory); loha (low-rank Hadamard product); lokr (Kronecker "
                          "product); oft (orthogonal rotation of blocks of lora_rank input features; "
                          "text runs).", "lora", choices=ADAPTERS)
    lora_fused: bool = option(True, "LoRA: add the adapter's output inside the base layer's matmul "
                              "(one fused multiply-add, no full-width temporaries): same results "
                              "and memory, faster. Off: peft's own forward.", "lora", tasks=TEXT)
    rslora: bool = option(False, "LoRA / DoRA: rank-stabilised scale alpha / sqrt(r) instead of "
                          "alpha / r (keeps high ranks learning).", "lora", tasks=TEXT)
    lora_init: str = option("default", "LoRA / DoRA initial weights: default (A random, B zero); "
                            "gaussian (A Gaussian); pissa (A and B from the weight's principal "
                            "singular vectors, the base keeps the rest; an SVD of every adapted layer "
                            "before the first step); olora (A and B from a QR decomposition); loftq (with "
                            "quantization nf4: A and B fitted to each weight's 4-bit rounding error); "
                            "eva (A from the principal directions of each layer's inputs on a few "
                            "batches of the training data); corda (A and B from the weights shaped by "
                            "those inputs' covariance, the base keeps the rest).",
                            "lora", choices=LORA_INITS, tasks=TEXT)
    lora_plus_ratio: float = option(1.0, "LoRA / DoRA: LoRA+, the learning rate of B is this many "
                                    "times that of A (1 = off; the LoRA+ paper uses 16).", "lora",
                                    low=1.0, high=1024.0, tasks=TEXT)
    lora_fa: bool = option(False, "LoRA / DoRA: LoRA-FA, keep A frozen at its random init and train "
                           "B only (less gradient, optimizer and activation memory).", "lora",
                           tasks=TEXT, label="LoRA-FA (frozen A)")

    # -- derived -------------------------------------------------------------------------------
    def resolved_batching(self) -> str:
        """The batch builder this run uses once 'auto' is resolved by the mode."""
        if self.batching != "auto":
            return self.batching
        return "fixed" if self.mode == "traditional" else "bucketed"

    def packed_row_tokens(self) -> int:
        """Tokens a packed row holds at most: the token budget where each document is attended
        on its own (sdpa, full attention; every document still at most max_seq_len), else one
        sample's length (there a row's mask grows with its length squared)."""
        if self.attention != "windowed" and self.resolved_attn_backend() == "sdpa":
            return self.token_budget
        return min(self.max_seq_len, self.token_budget)

    def resolved_attn_backend(self) -> str:
        """The attention kernel this run uses once 'auto' is resolved by the mode."""
        if self.attn_backend != "auto":
            return self.attn_backend
        return "eager" if self.mode == "traditional" else "sdpa"

    def resolved_loss_chunk(self) -> int:
        """Chunked-loss positions once auto (-1) is resolved by the mode; 0 = off."""
        if self.loss_chunk >= 0:
            return self.loss_chunk
        return 0 if self.mode == "traditional" else AUTO_LOSS_CHUNK

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

    def resolved_optimizer(self, device_type: str) -> str:
        """The optimizer once 'auto' is resolved: adamw for text; for images, adamw8bit in
        optimized mode on a GPU when bitsandbytes is installed.

        Args:
            device_type: where the run trains ('cuda' or 'cpu').
        """
        if self.optimizer != "auto":
            return self.optimizer
        if self.task in ("image", "video") and self.mode == "optimized" and device_type == "cuda" \
                and bitsandbytes_present():
            return "adamw8bit"
        return "adamw"

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

    def trackers(self) -> list[str]:
        """report_to as a list of tracker names, without 'none' (empty: no tracker)."""
        names = [n.strip().lower() for n in self.report_to.split(",") if n.strip()]
        unknown = [n for n in names if n not in TRACKERS]
        if unknown:
            raise ConfigError(f"report_to: {clip(unknown[0])} is not a tracker; use a comma list of "
                              f"{', '.join(TRACKERS)}")
        if "none" in names and len(names) > 1:
            raise ConfigError(f"report_to: {clip(self.report_to)} names 'none' with other trackers")
        return list(dict.fromkeys(n for n in names if n != "none"))

    def data_path(self) -> Path:
        """The data file (or image folder): a bundled name resolved to its path, or the given path."""
        if self.task == "image" and self.data == "builtin":
            return BUILTIN_IMAGES
        if self.task == "video" and self.data == "builtin":
            return BUILTIN_CLIPS
        return BUILTIN_DATA.get(self.data, Path(self.data))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> RunConfig:
        """Checks every field against its type, range and choices; returns self."""
        hints = typing.get_type_hints(RunConfig)
        for f in dataclasses.fields(self):
            _check_value(f, hints[f.name], getattr(self, f.name))
        if self.resolution % IMAGE_GRID and self.task != "video":  # clips: the model's grid (data)
            raise ConfigError(f"resolution: {self.resolution} is not a multiple of {IMAGE_GRID} "
                              f"(64-1536 in steps of {IMAGE_GRID})")
        self.batch_by_resolution()
        self.trackers()
        if self.task in ("image", "video") and self.quantization != "none":
            raise ConfigError(f"quantization: {self.quantization!r} is for text runs; image runs "
                              "use quantization: none")
        if self.task in ("image", "video") and self.attention == "windowed":
            raise ConfigError("attention: windowed is for text runs; image runs use attn_backend")
        if self.attention == "windowed":
            for key in ("window", "global_tokens"):
                if getattr(self, key) > self.max_seq_len:
                    raise ConfigError(f"{key}: {getattr(self, key)} is above max_seq_len "
                                      f"{self.max_seq_len}; windowed attention needs it shorter")
        self._check_adapter()
        if problem := self.preference_problem():
            raise ConfigError(problem)
        if self.checkpoint_layers and self.task in ("image", "video"):
            raise ConfigError("checkpoint_layers: applies to text runs (a decoder's layers); image runs "
                              "checkpoint every block, leave it at 0")
        if self.checkpoint_layers and not self.gradient_checkpointing:
            raise ConfigError("checkpoint_layers: needs gradient_checkpointing: true (it says how "
                              "many layers are checkpointed)")
        if self.offload_checkpoints and not self.gradient_checkpointing:
            raise ConfigError("offload_checkpoints: needs gradient_checkpointing: true (the "
                              "offloaded tensors are the checkpointed layer inputs)")
        if self.attention_head_groups > 1 and self.attention != "windowed" \
                and self.resolved_attn_backend() == "eager":
            raise ConfigError("attention_head_groups: needs attn_backend sdpa (or attention: windowed); "
                              "eager attention keeps its own score matrices")
        return self


    def _check_image_adapter(self) -> None:
        if self.adapter not in IMAGE_ADAPTERS:
            raise ConfigError(f"adapter: {self.adapter} is for text runs; image runs use one of "
                              f"{', '.join(IMAGE_ADAPTERS)}")
        text_only = [k for k, on in (("rslora", self.rslora), ("lora_fa", self.lora_fa),
                                     ("lora_init", self.lora_init != "default"),
                                     ("lora_plus_ratio", self.lora_plus_ratio != 1.0)) if on]
        if text_only:
            raise ConfigError(f"{text_only[0]}: applies to text runs; leave it at its default for an "
                              "image run")
        if self.adapter != "lora" and self.train_text_encoder:
            raise ConfigError(f"train_text_encoder: the text encoders train plain LoRA; use adapter: lora "
                              f"with train_text_encoder, or train_text_encoder: false with "
                              f"{self.adapter}")

    def _check_adapter(self) -> None:
        """Refuses adapter settings that peft or bitsandbytes cannot run, naming what works."""
        if self.task in ("image", "video"):
            self._check_image_adapter()
        if self.adapter not in ("lora", "dora"):
            lora_only = {"rslora": self.rslora, "lora_fa": self.lora_fa,
                         "lora_init": self.lora_init != "default",
                         "lora_plus_ratio": self.lora_plus_ratio != 1.0}
            for key, used in lora_only.items():
                if used:
                    raise ConfigError(f"{key}: applies to adapter: lora or dora, not {self.adapter}; "
                                      f"use adapter: lora or leave {key} at its default")
            if self.quantization != "none":
                raise ConfigError(f"adapter: {self.adapter} cannot train on a {self.quantization} "
                                  "base (peft has no quantized layer for it); use adapter: lora or "
                                  "dora with quantization, or quantization: none")
            if self.lora_dropout:
                raise ConfigError(f"lora_dropout: adapter {self.adapter} has no input dropout; use "
                                  "lora_dropout: 0 or adapter: lora / dora")
        self._check_init()
        if self.lora_init in ("pissa", "olora") and self.quantization != "none":
            raise ConfigError(f"lora_init: {self.lora_init} needs the full-precision weights it "
                              f"decomposes, not a {self.quantization} base; use lora_init: default "
                              "with quantization, or quantization: none")
        if self.lora_fa and self.lora_plus_ratio != 1.0:
            raise ConfigError("lora_plus_ratio: LoRA+ speeds up B relative to A, but lora_fa freezes "
                              "A; use one of them")


    def _check_init(self) -> None:
        """The data-driven and quantization-aware initialisations, as peft runs them."""
        init = self.lora_init
        if init == "loftq" and self.quantization != "nf4":
            raise ConfigError(f"lora_init: loftq fits the adapter to a 4-bit base's rounding error and "
                              f"needs quantization: nf4, not {self.quantization}; use quantization: nf4 "
                              "or lora_init: pissa on a full-precision base")
        if init in ("loftq", *DATA_INITS) and self.adapter != "lora":
            raise ConfigError(f"lora_init: {init} initialises plain LoRA layers only, not "
                              f"adapter: {self.adapter}; use adapter: lora with it")
        if init in DATA_INITS and self.quantization != "none":
            raise ConfigError(f"lora_init: {init} reads the full-precision weights and layer inputs, "
                              f"not a {self.quantization} base; use quantization: none, or "
                              "lora_init: loftq with quantization: nf4")


def _check_value(f: dataclasses.Field, kind: type, value: Any) -> None:
    meta = f.metadata
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{f.name}: expected true or false, got {clip(value)}")
        return
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            kind is int and not float(value).is_integer()
        ):
            raise ConfigError(f"{f.name}: expected {kind.__name__}, got {clip(value)}")
        if not math.isfinite(value):  # NaN compares false with both bounds: name it here
            raise ConfigError(f"{f.name}: {value} is not a number; give a value in [{meta['low']}, "
                              f"{meta['high']}]")
        low, high = meta["low"], meta["high"]
        if (low is not None and value < low) or (high is not None and value > high):
            raise ConfigError(f"{f.name}: {value} is out of range [{low}, {high}]")
        return
    if not isinstance(value, str):
        raise ConfigError(f"{f.name}: expected text, got {clip(value)}")
    if meta["choices"] and value not in meta["choices"]:
        raise ConfigError(f"{f.name}: {clip(value)} is not one of {', '.join(meta['choices'])}")


def bitsandbytes_present() -> bool:
    """True when the bitsandbytes package can be imported (8-bit optimizers, nf4 / int8 weights)."""
    return importlib.util.find_spec("bitsandbytes") is not None


def choices_of(name: str) -> tuple[str, ...]:
    """The choices a setting accepts, as RunConfig declares them (the one list every module reads)."""
    return tuple(RunConfig.__dataclass_fields__[name].metadata["choices"])


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(RunConfig)]


def unknown_key_message(key: str, where: str = "") -> str:
    """'unknown key' with the closest known key suggested."""
    close = difflib.get_close_matches(key, field_names(), n=1, cutoff=0.5) if len(key) < 100 else []
    hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(field_names())}"
    prefix = f"{where}: " if where else ""
    return f"{prefix}unknown key {clip(key)}{hint}"


def parse_value(key: str, text: str) -> Any:
    """Converts a command-line string to the field's type (YAML scalars: 1e-3, true, 8)."""
    hints = typing.get_type_hints(RunConfig)
    if key not in hints:
        raise ConfigError(unknown_key_message(key))
    kind = hints[key]
    if kind is str:
        return text
    if kind in (int, float):
        try:  # float() takes '3e-4', which YAML 1.1 would leave as a string
            number = float(text)
            return int(number) if kind is int and number.is_integer() and "." not in text else number
        except ValueError:
            return text  # validation names the field and the bad value
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(cfg: RunConfig, overrides: dict[str, Any], where: str = "") -> RunConfig:
    """Returns a copy of cfg with overrides applied and validated; unknown keys are refused."""
    hints = typing.get_type_hints(RunConfig)
    values = cfg.to_dict()
    for key, value in overrides.items():
        if key not in values:
            raise ConfigError(unknown_key_message(key, where))
        if key == "resolution" and isinstance(value, str) and "x" in value.lower():
            values["video_size"], value = value.lower(), video_side(value)  # WxH: a video clip size
        elif key == "resolution" and "video_size" not in overrides:
            values["video_size"] = ""  # a side replaces an earlier WxH
        if hints[key] in (int, float) and isinstance(value, str):
            value = parse_value(key, value)  # YAML 1.1 reads 3e-4 as text
        if hints[key] is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if key == "report_to" and isinstance(value, list):  # YAML: report_to: [tensorboard, trackio]
            value = ",".join(str(v) for v in value)
        values[key] = value
    try:
        return RunConfig(**values).validate()
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}" if where else str(err)) from None


def video_side(size: str) -> int:
    """The square side (px, a multiple of 64) nearest the area of a ``WxH`` clip size: what
    ``resolution`` holds when it is given as WxH (the clip size itself goes to ``video_size``)."""
    try:
        w, h = (int(v) for v in size.lower().split("x"))
    except ValueError:
        raise ConfigError(f"resolution: {size!r} is not a side (512) or WxH (832x480)") from None
    return max(IMAGE_GRID, round((w * h) ** 0.5 / IMAGE_GRID) * IMAGE_GRID)


def parse_set_args(pairs: list[str]) -> dict[str, Any]:
    """Parses ['key=value', ...] from --set into typed overrides."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair!r}: expected key=value")
        out[key.strip()] = parse_value(key.strip(), text.strip())
    return out


def load_yaml_overrides(path: str | Path) -> dict[str, Any]:
    """Reads a preset/config YAML file of flat overrides; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: preset file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of key: value, got {type(data).__name__}")
    return data


def diff_from_defaults(cfg: RunConfig) -> dict[str, Any]:
    """Only the settings that differ from the defaults (what a preset file holds)."""
    default = RunConfig().to_dict()
    return {k: v for k, v in cfg.to_dict().items() if default[k] != v}
