"""Text-to-video transformers trained with flow matching: Wan 2.1 / 2.2 (``WanPipeline``,
``WanTransformer3DModel``, ``AutoencoderKLWan``) and LTX-Video (``LTXPipeline``; what differs is in
:mod:`lora_gui.models.ltx`), from a Hugging Face id or a folder saved with ``save_pretrained``.
The run is the image run's (:mod:`lora_gui.engine.image.train`): the same loop, cache and
flow-matching objective (:class:`lora_gui.models.dit.FlowMatching`, kind ``wan`` or ``ltx``), with
clips for pictures.

The training recipe is the one Wan's trainers use (diffusers' finetrainers, musubi-tuner):

- latents: drawn once from the VAE's latent distribution (cached), then normalised per channel
  with the VAE's ``latents_mean`` / ``latents_std`` (what ``WanPipeline`` undoes before decoding);
- sigma = the training scheduler's (``FlowMatchEulerDiscreteScheduler`` with the pipeline
  scheduler's shift: ``flow_shift`` 3.0 for the published Wan 2.1 pipelines) at an index drawn
  from the weighting scheme's density (uniform by default, ``weighting_scheme`` as for SD3 / Flux);
- noisy input ``(1 - sigma) * x0 + sigma * noise``, target ``noise - x0``, plain MSE;
- text: the pipeline's own ``encode_prompt`` (UMT5 hidden states, zero-padded past each prompt's
  end, ``text_max_length`` tokens; 512 by default as the pipeline's).

LoRA goes on the attention projections of every block (self- and cross-attention: ``to_q``,
``to_k``, ``to_v``, ``to_out.0``, the targets of diffusers' and finetrainers' Wan LoRA), and is
saved with the pipeline's ``save_lora_weights`` (``WanPipeline`` / ``LTXPipeline``) so that
``pipe.load_lora_weights(run/adapter)`` loads it. LTX-Video's LoRA has the same targets (its
``LTXAttention`` projections).
"""

from __future__ import annotations

from typing import Any

import torch

from lora_gui.data.video_batches import VideoGeometry
from lora_gui.models.text import ModelError

VIDEO_PIPELINES = {"WanPipeline": "wan", "LTXPipeline": "ltx"}
PIPELINE_OF = {kind: name for name, kind in VIDEO_PIPELINES.items()}
VAE_CLASSES = {"wan": "AutoencoderKLWan", "ltx": "AutoencoderKLLTXVideo"}
VIDEO_TRANSFORMERS = {"wan": "WanTransformer3DModel", "ltx": "LTXVideoTransformer3DModel"}
LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]  # every attention block's projections
DEFAULT_TEXT_LENGTH = {"wan": 512, "ltx": 128}  # the pipelines' max_sequence_length defaults
DEFAULT_WEIGHTING = {"wan": "none", "ltx": "logit_normal"}  # weighting_scheme 'auto' (see the recipes)
DEFAULT_SHIFT = 3.0  # Wan 2.1's flow_shift at 480p (its UniPC inference scheduler's)


def is_video_kind(kind: str) -> bool:
    """True for the video pipeline kinds ('wan', 'ltx')."""
    return kind in VIDEO_PIPELINES.values()


def is_video_module(module: Any) -> bool:
    """True for a Wan or LTX-Video transformer (peft-wrapped or not)."""
    base = module.get_base_model() if hasattr(module, "get_base_model") else module
    return type(base).__name__ in VIDEO_TRANSFORMERS.values()


def lora_targets(setting: str) -> list[str]:
    """'all-linear': the attention projections of every block; else the comma list given."""
    if setting == "all-linear":
        return list(LORA_TARGETS)
    return [t.strip() for t in setting.split(",") if t.strip()]


def text_length_for(kind: str, setting: int) -> int:
    """0 -> the pipeline's default prompt length for the kind."""
    return setting or DEFAULT_TEXT_LENGTH[kind]


def geometry_of(vae_config: dict[str, Any], transformer_config: dict[str, Any],
                kind: str = "wan") -> VideoGeometry:
    """How a Wan or LTX-Video pipeline turns clips into tokens, from its VAE and transformer configs."""
    if kind == "ltx":
        from lora_gui.models import ltx

        return ltx.geometry_of(vae_config, transformer_config)
    patch = transformer_config.get("patch_size", (1, 2, 2))
    return VideoGeometry(temporal=int(vae_config.get("scale_factor_temporal", 4)),
                         spatial=int(vae_config.get("scale_factor_spatial", 8)),
                         patch=int(patch[1]), patch_t=int(patch[0]))


def source_geometry(source: str, kind: str) -> VideoGeometry:
    """A pipeline folder's (or cached hub id's) geometry from its configs, nothing loaded: what
    the data check needs before the model is read."""
    import diffusers

    vae = getattr(diffusers, VAE_CLASSES[kind]).load_config(source, subfolder="vae")
    transformer = getattr(diffusers, VIDEO_TRANSFORMERS[kind]).load_config(source, subfolder="transformer")
    return geometry_of(vae, transformer, kind)


def check_swap_setting(source: str, kind: str, blocks_to_swap: int) -> None:
    """Refuses ``blocks_to_swap`` off the transformer's block count (its config's ``num_layers``)
    before anything is loaded or written.

    Raises:
        ModelError: the value is more than the model's blocks.
    """
    if not blocks_to_swap:
        return
    import diffusers

    from lora_gui.models.block_swap import check_blocks_to_swap

    config = getattr(diffusers, VIDEO_TRANSFORMERS[kind]).load_config(source, subfolder="transformer")
    check_blocks_to_swap(blocks_to_swap, int(config["num_layers"]))


def load_video_parts(source: str, weights_dtype: torch.dtype, cfg: Any, pipe: Any = None,
                     kind: str = "wan") -> dict[str, Any]:
    """Loads a Wan or LTX-Video pipeline (or takes ``pipe``, e.g. one built on the meta device);
    returns the parts of a :class:`~lora_gui.models.diffusion.ImageModel` (VAE in float32, as the
    Wan pipelines' own docs advise).

    Raises:
        ModelError: an unknown weighting scheme.
    """
    import copy

    import diffusers

    from lora_gui.models.dit import WEIGHTING_SCHEMES, FlowMatching

    if pipe is None:
        pipe = getattr(diffusers, PIPELINE_OF[kind]).from_pretrained(source, torch_dtype=weights_dtype)
    torch.nn.Module.to(pipe.vae, torch.float32)
    for module in (pipe.transformer, pipe.vae, pipe.text_encoder):
        module.requires_grad_(False)
        module.eval()
    scheme = getattr(cfg, "weighting_scheme", "auto")
    scheme = DEFAULT_WEIGHTING[kind] if scheme == "auto" else scheme
    if scheme not in WEIGHTING_SCHEMES:
        raise ModelError(f"weighting_scheme: {scheme!r} is not one of {', '.join(WEIGHTING_SCHEMES)}")
    sched = pipe.scheduler.config
    shift = float(sched.get("flow_shift") or sched.get("shift") or DEFAULT_SHIFT)
    training = diffusers.FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=int(sched.get("num_train_timesteps", 1000)), shift=shift)
    length = text_length_for(kind, int(getattr(cfg, "text_max_length", 0)))
    geometry = geometry_of(dict(pipe.vae.config), dict(pipe.transformer.config), kind)
    objective = FlowMatching(kind, copy.deepcopy(training), scheme, float(getattr(cfg, "logit_mean", 0.0)),
                             float(getattr(cfg, "logit_std", 1.0)), float(getattr(cfg, "mode_scale", 1.29)),
                             vae_scale_factor=geometry.spatial, rope_scale=rope_scale_for(kind, geometry))
    info = {"text_length": length, "text_tokens": length, "geometry": geometry,
            "text_width": int(pipe.text_encoder.config.d_model)}
    return {"transformer": pipe.transformer, "vae": pipe.vae, "text_encoders": [pipe.text_encoder],
            "tokenizers": [pipe.tokenizer], "objective": objective, "pipe": pipe, "info": info}


def rope_scale_for(kind: str, geometry: VideoGeometry) -> tuple[float, float, float] | None:
    """LTX-Video's rotary scale (None for Wan, which ropes its latent grid as it is)."""
    if kind != "ltx":
        return None
    from lora_gui.models import ltx

    return ltx.rope_scale(geometry)


@torch.no_grad()
def encode_video_prompts(pipe: Any, kind: str, captions: list[str], device: torch.device,
                         text_length: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prompt embeddings (B, text_length, D) through the pipeline's own ``encode_prompt``, and
    for LTX-Video their attention mask (B, text_length) (None for Wan, which zeroes the padding)."""
    if kind == "ltx":
        from lora_gui.models import ltx

        return ltx.encode_prompts(pipe, captions, device, text_length)
    embeds, _negative = pipe.encode_prompt(prompt=captions, do_classifier_free_guidance=False,
                                           max_sequence_length=text_length, device=device)
    return embeds, None


def normalise_latents(kind: str, vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """(B, C, T, h, w) VAE latents -> the transformer's space: per channel (x - mean) / std (the
    inverse of what ``WanPipeline`` / ``LTXPipeline`` do before decoding)."""
    if kind == "ltx":
        from lora_gui.models import ltx

        return ltx.normalise_latents(vae, latents)
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=latents.device, dtype=latents.dtype).view(shape)
    std = torch.tensor(vae.config.latents_std, device=latents.device, dtype=latents.dtype).view(shape)
    return (latents - mean) / std


def set_video_attention(transformer: Any, backend: str, window: tuple[int, int, int] | None = None) -> None:
    """sdpa: the model's own processors (torch SDPA); eager: the same under torch's math SDPA backend
    (the scores kept, as eager attention keeps them). ``window`` (frames, rows, columns half-widths
    in tokens): windowed space-time self-attention (:mod:`lora_gui.attention.video_window`: the
    blocked kernel on a CPU, FlexAttention on CUDA), in place of either backend's self-attention."""
    from lora_gui.models.dit import MathAttention

    if backend not in ("sdpa", "eager"):
        raise ModelError(f"attn_backend: {backend!r} is not supported by the video engine (eager, sdpa)")
    if backend == "eager":
        transformer.set_attn_processor({n: MathAttention(p) for n, p in transformer.attn_processors.items()})
    if window:
        from lora_gui.attention.video_window import enable_video_window

        enable_video_window(transformer, window)
