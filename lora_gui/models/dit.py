"""DiT image models trained with flow matching: Stable Diffusion 3 / 3.5 (``SD3Transformer2DModel``)
and Flux.1 (``FluxTransformer2DModel``), from a Hugging Face id or a folder saved with
``save_pretrained``.

The objective, the LoRA targets and the adapter format follow diffusers' own
``train_dreambooth_lora_sd3.py`` and ``train_dreambooth_lora_flux.py``:

- latents: ``(vae.encode(x).sample() - shift_factor) * scaling_factor``;
- a timestep index drawn from the weighting scheme's density (``logit_normal``, ``mode`` or
  uniform, :func:`diffusers.training_utils.compute_density_for_timestep_sampling`), the sigma of
  the training scheduler (``FlowMatchEulerDiscreteScheduler`` with the model's shift) at that index;
- noisy input ``(1 - sigma) * x0 + sigma * noise``, target ``noise - x0`` (the velocity);
  SD3 preconditions the output as its script does by default (``pred * -sigma + noisy``, target
  ``x0``); Flux packs the latents into 2 x 2 patches, passes text / image position ids and,
  for guidance-distilled models (Flux.1-dev), the guidance embedding;
- per-image loss ``mean(weighting * (pred - target)^2)`` with
  :func:`diffusers.training_utils.compute_loss_weighting_for_sd3`.

Adapters are written with the pipeline class's ``save_lora_weights`` so that
``pipe.load_lora_weights(run/adapter)`` loads them.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from lora_gui.attention.image_window import image_grid
from lora_gui.models.text import ModelError

log = logging.getLogger(__name__)

DIT_PIPELINES = {"StableDiffusion3Pipeline": "sd3", "FluxPipeline": "flux"}
DIT_TRANSFORMERS = {"sd3": "SD3Transformer2DModel", "flux": "FluxTransformer2DModel"}
# diffusers' train_dreambooth_lora_sd3.py default --lora_layers
SD3_LORA_TARGETS = ["attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
                    "attn.to_k", "attn.to_out.0", "attn.to_q", "attn.to_v"]
# diffusers' train_dreambooth_lora_flux.py default --lora_layers
FLUX_LORA_TARGETS = ["attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj",
                     "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2",
                     "ff_context.net.0.proj", "ff_context.net.2"]
WEIGHTING_SCHEMES = ("none", "sigma_sqrt", "logit_normal", "mode", "cosmap")
# the scripts' --max_sequence_length defaults (T5 tokens)
DEFAULT_TEXT_LENGTH = {"sd3": 77, "flux": 512}
# the scripts' --weighting_scheme defaults
DEFAULT_WEIGHTING = {"sd3": "logit_normal", "flux": "none"}


def is_dit_kind(kind: str) -> bool:
    """True for the flow-matching DiT kinds ('sd3', 'flux')."""
    return kind in DIT_TRANSFORMERS


def is_dit_module(module: Any) -> bool:
    """True for an SD3 or Flux transformer (peft-wrapped or not)."""
    return type(module).__name__ in DIT_TRANSFORMERS.values()


def lora_targets(kind: str, lora_targets_setting: str) -> list[str]:
    """The transformer modules that get LoRA: the script's defaults for 'all-linear', else the list."""
    if lora_targets_setting == "all-linear":
        return list(SD3_LORA_TARGETS if kind == "sd3" else FLUX_LORA_TARGETS)
    return [t.strip() for t in lora_targets_setting.split(",") if t.strip()]


def vae_factor(vae_block_out_channels: Any) -> int:
    """A VAE's downsampling factor (pixels per latent side): 2^(levels - 1); 8 for SD3 / Flux."""
    return 2 ** (len(vae_block_out_channels) - 1)


def patch_factor(kind: str, transformer_config: dict[str, Any], vae_block_out_channels: Any) -> int:
    """Pixels per image token side: the transformer's patch size (Flux: 2, its 2 x 2 packing)
    times the VAE's downsampling factor 2^(levels - 1)."""
    patch = 2 if kind == "flux" else int(transformer_config.get("patch_size", 2))
    return patch * vae_factor(vae_block_out_channels)


def check_resolution(kind: str, factor: int, sizes: list[tuple[int, int]]) -> None:
    """Every (width, height) bucket must split into whole image tokens.

    Raises:
        ModelError: naming the size and the factor.
    """
    for w, h in sizes:
        if w % factor or h % factor:
            raise ModelError(f"resolution: {w}x{h} px is not a multiple of {factor} (this {kind} model's "
                             f"patch size x VAE factor); pick a resolution that is")


def check_flux_guidance(config: dict[str, Any], where: str) -> bool:
    """Flux.1-dev embeds the guidance scale, schnell does not; the transformer config must say which.

    Raises:
        ModelError: ``guidance_embeds`` missing from the config.
    """
    if "guidance_embeds" not in config:
        raise ModelError(f"model: {where} has no 'guidance_embeds' in its transformer config: set it "
                         "to true for guidance-distilled models (Flux.1-dev) or false (Flux.1-schnell)")
    return bool(config["guidance_embeds"])


def density_from_uniform(v: torch.Tensor, scheme: str, logit_mean: float = 0.0, logit_std: float = 1.0,
                         mode_scale: float = 1.29) -> torch.Tensor:
    """Maps uniform draws in (0, 1) to the scheme's timestep density, the same distribution as
    :func:`diffusers.training_utils.compute_density_for_timestep_sampling` (inverse transform:
    logit_normal = sigmoid(mean + std * Phi^-1(v)); mode applies its formula to v; else v). Drawing
    v per image from a seeded generator keeps a step identical on any rank and after a resume."""
    if scheme == "logit_normal":
        return torch.sigmoid(logit_mean + logit_std * math.sqrt(2.0) * torch.erfinv(2 * v - 1))
    if scheme == "mode":
        return 1 - v - mode_scale * (torch.cos(math.pi * v / 2) ** 2 - 1 + v)
    return v


@dataclass
class FlowMatching:
    """The flow-matching objective of one DiT run (see the module docstring).

    Attributes:
        kind: 'sd3' or 'flux'.
        scheduler: the training FlowMatchEulerDiscreteScheduler (its ``sigmas`` / ``timesteps``
            at construction, as the scripts' ``noise_scheduler_copy``).
        weighting_scheme, logit_mean, logit_std, mode_scale: the scripts' timestep options.
        guidance: Flux guidance embedding value (None when the model has none).
        vae_scale_factor: VAE downsampling (8 for SD3 / Flux): unpacks Flux's latents.
        precondition_outputs: SD3's default output preconditioning.
        rope_scale: LTX-Video's rotary scale (seconds a latent frame, px a latent pixel x2).
    """

    kind: str
    scheduler: Any
    weighting_scheme: str
    logit_mean: float = 0.0
    logit_std: float = 1.0
    mode_scale: float = 1.29
    guidance: float | None = None
    vae_scale_factor: int = 8
    precondition_outputs: bool = False
    rope_scale: tuple[float, float, float] | None = None

    @property
    def config(self) -> Any:
        """The scheduler's config (``num_train_timesteps``: the range of the uniform draws)."""
        return self.scheduler.config

    def sigmas_and_timesteps(self, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniform integer draws in [0, N) -> (sigmas, model timesteps) through the density."""
        n = self.scheduler.config.num_train_timesteps
        v = (draws.float().cpu() + 0.5) / n
        u = density_from_uniform(v, self.weighting_scheme, self.logit_mean, self.logit_std, self.mode_scale)
        index = (u * n).long().clamp(0, n - 1)
        return self.scheduler.sigmas[index].float(), self.scheduler.timesteps[index].float()

    def loss(self, transformer, enc, noise: torch.Tensor, draws: torch.Tensor,
             reduction: str = "mean") -> torch.Tensor:
        """Weighted flow-matching MSE per image (``enc``: latents, hidden, pooled of one bucket)."""
        sigmas, timesteps = (t.to(enc.latents.device) for t in self.sigmas_and_timesteps(draws))
        return self.loss_at(transformer, enc, noise, sigmas, timesteps, reduction)

    def loss_at(self, transformer, enc, noise: torch.Tensor, sigmas: torch.Tensor, timesteps: torch.Tensor,
                reduction: str = "mean") -> torch.Tensor:
        """The loss at given sigmas (B,) and model timesteps (B,) (the memory trace calls this)."""
        x0 = enc.latents
        sig = sigmas.view(-1, *[1] * (x0.dim() - 1))  # (B, 1, 1, 1), or (B, 1, 1, 1, 1) for video
        noisy = (1.0 - sig) * x0 + sig * noise
        dtype = enc.hidden.dtype
        if self.kind == "wan":  # video latents (B, C, T, h, w): Wan patchifies and ropes them itself
            pred = transformer(hidden_states=noisy.to(dtype), timestep=timesteps,
                               encoder_hidden_states=enc.hidden, return_dict=False)[0]
            return self._weighted(pred, noise - x0, sig, x0.shape[0], reduction)
        if self.kind == "ltx":  # video latents packed into tokens, the prompt's mask, scaled rotary positions
            from lora_gui.models.ltx import predict_velocity

            mask = getattr(enc, "text_mask", None)
            pred = predict_velocity(transformer, noisy, timesteps, enc.hidden, mask, self.rope_scale)
            return self._weighted(pred, noise - x0, sig, x0.shape[0], reduction)
        with image_grid(*token_grid(transformer, self.kind, x0.shape[-2:])):  # for windowed attention
            if self.kind == "flux":
                pred = self._flux_forward(transformer, noisy, timesteps, enc, dtype)
            else:
                pred = transformer(hidden_states=noisy.to(dtype), timestep=timesteps,
                                   encoder_hidden_states=enc.hidden, pooled_projections=enc.pooled,
                                   return_dict=False)[0]
        target = noise - x0
        if self.precondition_outputs:
            pred, target = pred.float() * (-sig) + noisy, x0
        return self._weighted(pred, target, sig, x0.shape[0], reduction)

    def _weighted(self, pred: torch.Tensor, target: torch.Tensor, sig: torch.Tensor, batch: int,
                  reduction: str) -> torch.Tensor:
        """The weighting scheme's MSE per picture or clip, summed or averaged over the batch."""
        from diffusers.training_utils import compute_loss_weighting_for_sd3

        weighting = compute_loss_weighting_for_sd3(self.weighting_scheme, sig).float()
        per_image = (weighting * (pred.float() - target.float()) ** 2).reshape(batch, -1).mean(1)
        return per_image.sum() if reduction == "sum" else per_image.mean()

    def _flux_forward(self, transformer, noisy: torch.Tensor, timesteps: torch.Tensor, enc,
                      dtype: torch.dtype) -> torch.Tensor:
        """Flux: packed 2 x 2 latent patches, position ids, timestep / 1000, guidance embedding."""
        from diffusers import FluxPipeline

        b, c, h, w = noisy.shape
        packed = FluxPipeline._pack_latents(noisy, b, c, h, w).to(dtype)
        img_ids = FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, noisy.device, dtype)
        txt_ids = torch.zeros(enc.hidden.shape[1], 3, device=noisy.device, dtype=dtype)
        guidance = None
        if self.guidance is not None:
            guidance = torch.full((b,), float(self.guidance), device=noisy.device)
        pred = transformer(hidden_states=packed, timestep=timesteps / 1000, guidance=guidance,
                           pooled_projections=enc.pooled, encoder_hidden_states=enc.hidden,
                           txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]
        f = self.vae_scale_factor
        return FluxPipeline._unpack_latents(pred, h * f, w * f, f)


def token_grid(transformer, kind: str, latent_hw: tuple[int, int]) -> tuple[int, int]:
    """Image tokens (rows, columns) of latents of ``latent_hw``: Flux packs 2 x 2 latent patches,
    SD3 patchifies by its ``patch_size``."""
    base = transformer.get_base_model() if hasattr(transformer, "get_base_model") else transformer
    patch = 2 if kind == "flux" else int(base.config.patch_size)
    return latent_hw[0] // patch, latent_hw[1] // patch


def weighting_for(kind: str, setting: str) -> str:
    """'auto' -> the script's default weighting scheme for the kind."""
    return DEFAULT_WEIGHTING[kind] if setting == "auto" else setting


def text_length_for(kind: str, setting: int) -> int:
    """0 -> the script's default T5 sequence length for the kind."""
    return setting or DEFAULT_TEXT_LENGTH[kind]


def load_dit_parts(source: str, class_name: str, weights_dtype: torch.dtype, cfg: Any,
                   pipe: Any = None) -> dict[str, Any]:
    """Loads a supported DiT pipeline (or takes ``pipe``, e.g. one built on the meta device);
    returns the parts of a :class:`~lora_gui.models.diffusion.ImageModel`.

    The VAE is kept in float32 (SD3's script does; it encodes once when caching). The pipeline
    object is kept for its ``encode_prompt`` (CLIP + T5 exactly as the pipeline encodes at
    inference) until the encoders are freed.

    Raises:
        ModelError: Flux without ``guidance_embeds``; an unknown weighting scheme.
    """
    import diffusers

    kind = DIT_PIPELINES[class_name]
    transformer_class = getattr(diffusers, DIT_TRANSFORMERS[kind])
    raw = transformer_class.load_config(source, subfolder="transformer")  # as written, no defaults
    if kind == "flux":
        check_flux_guidance(raw, f"{source}/transformer/config.json")
    if pipe is None:
        pipe = getattr(diffusers, class_name).from_pretrained(source, torch_dtype=weights_dtype)
    torch.nn.Module.to(pipe.vae, torch.float32)  # plain cast (diffusers' .to() warns)
    encoders = [e for e in (pipe.text_encoder, pipe.text_encoder_2, getattr(pipe, "text_encoder_3", None))
                if e is not None]
    tokenizers = [t for t in (pipe.tokenizer, pipe.tokenizer_2, getattr(pipe, "tokenizer_3", None))
                  if t is not None]
    for module in (pipe.transformer, pipe.vae, *encoders):
        module.requires_grad_(False)
        module.eval()
    tconf = dict(pipe.transformer.config)
    guidance = None
    if kind == "flux" and tconf["guidance_embeds"]:
        guidance = float(getattr(cfg, "guidance_scale", 3.5))
    scheme = weighting_for(kind, getattr(cfg, "weighting_scheme", "auto"))
    if scheme not in WEIGHTING_SCHEMES:
        raise ModelError(f"weighting_scheme: {scheme!r} is not one of {', '.join(WEIGHTING_SCHEMES)}")
    objective = FlowMatching(
        kind, copy.deepcopy(pipe.scheduler), scheme, float(getattr(cfg, "logit_mean", 0.0)),
        float(getattr(cfg, "logit_std", 1.0)), float(getattr(cfg, "mode_scale", 1.29)), guidance,
        vae_factor(pipe.vae.config.block_out_channels), precondition_outputs=kind == "sd3")
    t5_length = text_length_for(kind, int(getattr(cfg, "text_max_length", 0)))
    clip_length = pipe.tokenizer.model_max_length
    # prompt-embedding tokens: SD3 = CLIP's + T5's (zeros of CLIP's length without T5); Flux = T5's
    tokens = clip_length + (t5_length if getattr(pipe, "text_encoder_3", None) is not None else clip_length) \
        if kind == "sd3" else t5_length
    info = {"patch_factor": patch_factor(kind, tconf, pipe.vae.config.block_out_channels),
            "text_length": t5_length, "text_tokens": tokens}
    return {"kind": kind, "transformer": pipe.transformer, "vae": pipe.vae, "text_encoders": encoders,
            "tokenizers": tokenizers, "objective": objective, "pipe": pipe, "info": info}


@torch.no_grad()
def encode_dit_prompts(pipe, kind: str, captions: list[str], device: torch.device,
                       text_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt embeddings (B, tokens, D) and pooled embeddings (B, P) through the pipeline's own
    ``encode_prompt`` (SD3: CLIP-L + CLIP-G hidden states padded to T5's width, then T5's; Flux:
    T5's hidden states, CLIP's pooled output)."""
    if kind == "sd3":
        embeds, _neg, pooled, _neg_pooled = pipe.encode_prompt(
            prompt=captions, prompt_2=None, prompt_3=None, device=device, do_classifier_free_guidance=False,
            max_sequence_length=text_length)
    else:
        embeds, pooled, _ids = pipe.encode_prompt(prompt=captions, prompt_2=None, device=device,
                                                  max_sequence_length=text_length)
    return embeds, pooled


def set_dit_attention(transformer, backend: str, image_window: int = 0) -> None:
    """sdpa: the model's own processors (torch SDPA: flash / memory-efficient kernels, no S x S
    matrix kept). eager: the same processors run under torch's math SDPA backend, which
    materialises the (tokens x tokens) scores and probabilities per head, as eager attention does.
    ``image_window`` > 0: image tokens attend to their (2 r + 1)^2 neighbourhood of image tokens
    and to every text token (:mod:`lora_gui.attention.image_window`), in the training loss.
    """
    if backend not in ("sdpa", "eager"):
        raise ModelError(f"attn_backend: {backend!r} is not supported by the image engine (eager, sdpa)")
    wrap: list = []
    if backend == "eager":
        wrap.append(MathAttention)
    if image_window:
        from lora_gui.attention.image_window import WindowedImageAttention

        text_first = type(transformer).__name__ == DIT_TRANSFORMERS["flux"]  # Flux: [text, image]
        wrap.append(lambda p: WindowedImageAttention(p, image_window, text_first))
    if not wrap:
        return
    processors = dict(transformer.attn_processors)
    for make in wrap:
        processors = {name: make(p) for name, p in processors.items()}
    transformer.set_attn_processor(processors)


class MathAttention:
    """Wraps an attention processor so its SDPA call runs on torch's math backend (eager cost)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.MATH]):
            return self.inner(*args, **kwargs)


def save_dit_adapter(pipeline_class, folder, transformer) -> None:
    """Writes the transformer's LoRA with the pipeline's ``save_lora_weights`` (diffusers keys,
    adapter metadata with lora_alpha), as the scripts do."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(transformer)
    layers = {k: v.detach().float().cpu().contiguous() for k, v in state.items()}
    pipeline_class.save_lora_weights(folder, transformer_lora_layers=layers,
                                     transformer_lora_adapter_metadata=transformer.peft_config["default"].to_dict())
