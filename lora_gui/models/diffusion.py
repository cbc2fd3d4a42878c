"""Diffusion base models: resolve 'builtin' / a local pipeline folder / a Hugging Face id, load
the parts a LoRA run needs (UNet or DiT transformer, VAE, text encoder(s), tokenizer(s), noise
scheduler or flow-matching objective), attach LoRA with peft and encode prompts and pixels
(SD 1.x, SDXL; SD3 and Flux through :mod:`lora_gui.models.dit`). The adapter's files and the
pipeline loaded back with them: :mod:`lora_gui.models.diffusion_files`.
"""

from __future__ import annotations

import inspect
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lora_gui.config import ASSETS, RunConfig
from lora_gui.models import dit, video
from lora_gui.models.text import ModelError, check_hub_id

log = logging.getLogger(__name__)
BUILTIN_DIFFUSION_DIR = ASSETS / "diffusion-model"
BUILTIN_DRAWING_DIR = ASSETS / "drawing-model"  # model=builtin:drawing (lora_gui.models.build_drawing)
BUILTIN_VIDEO_DIR = ASSETS / "video-model"  # model=builtin:video (lora_gui.models.build_video)
BUILTIN_LTX_DIR = ASSETS / "ltx-model"  # model=builtin:ltx (lora_gui.models.build_ltx)
# pipeline class -> kind; other architectures (Kandinsky, PixArt...) are refused by name
SUPPORTED_PIPELINES = {"StableDiffusionPipeline": "sd", "StableDiffusionXLPipeline": "sdxl",
                       **dit.DIT_PIPELINES, **video.VIDEO_PIPELINES}
PIPELINE_CLASSES = {kind: name for name, kind in SUPPORTED_PIPELINES.items()}
UNET_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]  # diffusers' train_text_to_image_lora


@dataclass
class ImageModel:
    """The parts of a diffusion pipeline a LoRA run uses (VAE/text encoders may be dropped).

    ``unet`` is the denoiser that gets LoRA: a UNet2DConditionModel (sd, sdxl) or a DiT
    transformer (sd3, flux); for DiT kinds ``noise_scheduler`` is the
    :class:`~lora_gui.models.dit.FlowMatching` objective and ``pipe`` the loaded pipeline whose
    ``encode_prompt`` encodes captions until the encoders are freed.
    """

    kind: str  # "sd", "sdxl", "sd3", "flux", or a video kind: "wan", "ltx"
    source: str
    unet: Any
    vae: Any | None
    text_encoders: list[Any]
    tokenizers: list[Any]
    noise_scheduler: Any
    info: dict[str, Any] = field(default_factory=dict)
    pipe: Any | None = None

    @property
    def pipeline_class(self) -> Any:
        import diffusers

        return getattr(diffusers, PIPELINE_CLASSES[self.kind])

    def drop_encoders(self) -> None:
        """Frees the VAE and text encoders (caching made them unnecessary for training)."""
        self.vae = None
        self.text_encoders = []
        self.pipe = None


def _model_index(source: str) -> dict[str, Any]:
    path = Path(source)
    if path.is_dir():
        return json.loads((path / "model_index.json").read_text(encoding="utf-8"))
    from huggingface_hub import hf_hub_download

    return json.loads(Path(hf_hub_download(source, "model_index.json")).read_text(encoding="utf-8"))


def pipeline_kind(source: str) -> str:
    """'sd', 'sdxl', 'sd3', 'flux', 'wan' or 'ltx' from model_index.json; any other architecture raises
    :class:`ModelError` listing the supported pipeline classes."""
    name = _model_index(source).get("_class_name", "?")
    if name not in SUPPORTED_PIPELINES:
        raise ModelError(f"model: {source} is a {name}; supported are "
                         f"{', '.join(SUPPORTED_PIPELINES)}")
    return SUPPORTED_PIPELINES[name]


def resolve_pipeline_source(name: str) -> str:
    """A local pipeline folder or a reachable Hugging Face id; fails fast when offline.

    Raises:
        ModelError: missing folder, no model_index.json, not cached and the Hub unreachable.
    """
    if name == "builtin":
        if not (BUILTIN_DIFFUSION_DIR / "model_index.json").is_file():
            raise ModelError(f"model: the built-in diffusion model is missing in {BUILTIN_DIFFUSION_DIR}; "
                             "build it with `python -m lora_gui.models.build_diffusion`")
        return str(BUILTIN_DIFFUSION_DIR)
    if name == "builtin:drawing":
        if not (BUILTIN_DRAWING_DIR / "model_index.json").is_file():
            raise ModelError(f"model: the built-in drawing model is missing in {BUILTIN_DRAWING_DIR}; "
                             "build it with `python -m lora_gui.models.build_drawing`")
        return str(BUILTIN_DRAWING_DIR)
    if name == "builtin:video":
        if not (BUILTIN_VIDEO_DIR / "model_index.json").is_file():
            raise ModelError(f"model: the built-in video model is missing in {BUILTIN_VIDEO_DIR}; "
                             "build it with `python -m lora_gui.models.build_video`")
        return str(BUILTIN_VIDEO_DIR)
    if name == "builtin:ltx":
        if not (BUILTIN_LTX_DIR / "model_index.json").is_file():
            raise ModelError(f"model: the built-in LTX-Video model is missing in {BUILTIN_LTX_DIR}; "
                             "build it with `python -m lora_gui.models.build_ltx`")
        return str(BUILTIN_LTX_DIR)
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "model_index.json").is_file():
            raise ModelError(f"model: {path} has no model_index.json (save the pipeline with "
                             "save_pretrained; a single .safetensors checkpoint is not supported)")
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelError(f"model: local directory {name} not found")
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download(name, "model_index.json", local_files_only=True)
        return name
    except Exception:  # not cached: ask the Hub below
        pass
    check_hub_id(name, "a local pipeline folder")
    return name


def load_image_model(source: str, weights_dtype: torch.dtype = torch.float32,
                     cfg: RunConfig | None = None, *, weights: bool = True) -> ImageModel:
    """The pipeline's parts (see :func:`_load_parts`); a folder that lacks one of them, or holds
    one that cannot be read, is refused with a message naming the folder.

    Args:
        weights: False builds every module from its config on the meta device (shapes and dtypes,
            no weights read): what the memory plan needs before a run, with the run's own code.

    Raises:
        ModelError: naming the pipeline folder and what is missing.
    """
    try:
        return _load_parts(source, weights_dtype, cfg, weights)
    except (OSError, ValueError) as err:
        if isinstance(err, ModelError):
            raise
        raise ModelError(f"model: {source}: the pipeline cannot be loaded ({err})") from None


def meta_pipeline(source: str, weights_dtype: torch.dtype) -> Any:
    """The diffusers pipeline of ``source`` with every model built from its config on the meta
    device (shapes and dtypes, no weights read; the VAE in float32 as the run keeps it) and its
    tokenizers and scheduler loaded (small files): what the memory plan needs before a run, so
    that it runs the run's own code. A 12B transformer costs its config, not 24 GB."""
    import diffusers
    import transformers
    from accelerate import init_empty_weights

    index = _model_index(source)
    parts: dict[str, Any] = {}
    for name, entry in index.items():
        if name.startswith("_") or not isinstance(entry, list):
            continue
        library, class_name = entry
        if class_name is None or library not in ("diffusers", "transformers"):
            parts[name] = None  # absent, or the SD safety checker (the run never loads it)
            continue
        cls = getattr(diffusers if library == "diffusers" else transformers, class_name)
        if not issubclass(cls, torch.nn.Module):
            parts[name] = cls.from_pretrained(source, subfolder=name)  # tokenizer, scheduler
            continue
        with init_empty_weights():
            if library == "diffusers":
                module = cls.from_config(cls.load_config(source, subfolder=name))
            else:
                module = cls._from_config(transformers.AutoConfig.from_pretrained(source, subfolder=name))
        torch.nn.Module.to(module, torch.float32 if name == "vae" else weights_dtype)
        parts[name] = module.requires_grad_(False).eval()
    pipeline = getattr(diffusers, index["_class_name"])
    needed = inspect.signature(pipeline.__init__).parameters
    if "requires_safety_checker" in needed:
        parts["requires_safety_checker"] = False
    missing = [n for n, p in needed.items() if n != "self" and p.default is inspect.Parameter.empty
               and p.kind is p.POSITIONAL_OR_KEYWORD and n not in parts]
    if missing:  # a folder whose model_index.json does not list every part
        raise ValueError(f"model_index.json lists no {', '.join(missing)}")
    return pipeline(**parts)


def _load_parts(source: str, weights_dtype: torch.dtype, cfg: RunConfig | None,
                weights: bool = True) -> ImageModel:
    """Loads UNet, VAE (fp32: the SD VAEs overflow in fp16), text encoder(s), tokenizer(s) and
    the DDPM training scheduler of a supported pipeline; for SD3 / Flux the transformer and the
    flow-matching objective built from ``cfg``'s timestep settings (see :mod:`lora_gui.models.dit`)."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    kind = pipeline_kind(source)
    if video.is_video_kind(kind):  # Wan, LTX-Video: the same parts, a video VAE and one text encoder
        pipe = None if weights else meta_pipeline(source, weights_dtype)
        parts = video.load_video_parts(source, weights_dtype, cfg or RunConfig(), pipe, kind)
        return ImageModel(kind, source, parts["transformer"], parts["vae"], parts["text_encoders"],
                          parts["tokenizers"], parts["objective"], parts["info"], parts["pipe"])
    if dit.is_dit_kind(kind):
        pipe = None if weights else meta_pipeline(source, weights_dtype)
        parts = dit.load_dit_parts(source, PIPELINE_CLASSES[kind], weights_dtype, cfg or RunConfig(), pipe)
        return ImageModel(kind, source, parts["transformer"], parts["vae"], parts["text_encoders"],
                          parts["tokenizers"], parts["objective"], parts["info"], parts["pipe"])
    if not weights:
        pipe = meta_pipeline(source, weights_dtype)
        encoders = [e for e in (pipe.text_encoder, getattr(pipe, "text_encoder_2", None)) if e is not None]
        tokenizers = [t for t in (pipe.tokenizer, getattr(pipe, "tokenizer_2", None)) if t is not None]
        scheduler = DDPMScheduler.from_pretrained(source, subfolder="scheduler")
        return ImageModel(kind, source, pipe.unet, pipe.vae, encoders, tokenizers, scheduler)
    unet = UNet2DConditionModel.from_pretrained(source, subfolder="unet", torch_dtype=weights_dtype)
    vae = AutoencoderKL.from_pretrained(source, subfolder="vae", torch_dtype=torch.float32)
    encoders = [CLIPTextModel.from_pretrained(source, subfolder="text_encoder", dtype=weights_dtype)]
    tokenizers = [CLIPTokenizer.from_pretrained(source, subfolder="tokenizer")]
    if kind == "sdxl":
        encoders.append(CLIPTextModelWithProjection.from_pretrained(
            source, subfolder="text_encoder_2", dtype=weights_dtype))
        tokenizers.append(CLIPTokenizer.from_pretrained(source, subfolder="tokenizer_2"))
    for module in (unet, vae, *encoders):
        module.requires_grad_(False)
        module.eval()
    scheduler = DDPMScheduler.from_pretrained(source, subfolder="scheduler")
    return ImageModel(kind, source, unet, vae, encoders, tokenizers, scheduler)


def image_model_for_run(cfg: RunConfig, weights_dtype: torch.dtype, *, weights: bool = True) -> ImageModel:
    """The model a run trains: the pipeline's parts with LoRA on the denoiser (and on the text
    encoders with ``train_text_encoder``), the run's attention kernel and checkpointing; with
    ``weights=False`` the same modules on the meta device, for the memory plan before a run.
    Nothing is moved to a device here (the run decides when each part joins it)."""
    from lora_gui.models import text_encoder_lora

    source = resolve_pipeline_source(cfg.model)
    kind = pipeline_kind(source)
    if (cfg.task == "video") != video.is_video_kind(kind):  # before any weights are read
        raise ModelError(f"model: {cfg.model} is a {PIPELINE_CLASSES[kind]}; "
                         + ("a video run trains a WanPipeline or LTXPipeline (builtin:video, builtin:ltx, "
                            "or a folder or Hugging Face id of one)" if cfg.task == "video"
                            else f"set task to video to train it (task is {cfg.task})"))
    model = load_image_model(source, weights_dtype, cfg, weights=weights)
    if weights:
        torch.manual_seed(cfg.seed)  # LoRA init (the plan's meta weights have no values)
    attach_unet_lora(model.unet, cfg)
    text_encoder_lora.attach(model, cfg)  # SD 1.x / SDXL with train_text_encoder
    set_attention_backend(model.unet, cfg.resolved_attn_backend(), cfg.image_window,
                          cfg.resolved_video_window() if cfg.task == "video" else None)
    if cfg.gradient_checkpointing and cfg.task == "video":  # the first checkpoint_layers blocks
        from lora_gui.models.checkpointing import enable_checkpointing

        enable_checkpointing(model.unet, cfg.checkpoint_layers)
    elif cfg.gradient_checkpointing:
        model.unet.enable_gradient_checkpointing()
    if cfg.task == "video":  # fp8 storage after LoRA: the adapter stays in its own dtype
        from lora_gui.models.video_quant import apply_base_storage

        apply_base_storage(model.unet, cfg.quantization, weights_dtype)
    swap_blocks(model, cfg, weights)  # after fp8: the swapped weights are the stored (fp8) ones
    return model


def swap_blocks(model: ImageModel, cfg: RunConfig, weights: bool) -> None:
    """``blocks_to_swap`` on a video transformer (:mod:`lora_gui.models.block_swap`): checked
    against its block count; applied when the weights are real (the plan's meta pipeline is only
    checked: its trace builds and swaps its own transformer).

    Raises:
        ModelError: the value is off the model's block count, or the model is not a video one.
    """
    n = int(getattr(cfg, "blocks_to_swap", 0) or 0)
    if not n:
        return
    from lora_gui.models import block_swap

    if not video.is_video_module(model.unet):
        raise ModelError(f"blocks_to_swap: {n} is for video transformers (Wan, LTX-Video); set 0")
    block_swap.check_blocks_to_swap(n, len(block_swap.transformer_blocks(model.unet)))
    if weights:
        block_swap.enable_block_swap(model.unet, n, pin=torch.cuda.is_available())


def set_attention_backend(unet, backend: str, image_window: int = 0,
                          video_window: tuple[int, int, int] | None = None) -> None:
    """eager: diffusers' AttnProcessor (materialises the S x S score matrix, 4 bytes x heads x S^2
    per image in fp32); sdpa: AttnProcessor2_0 (torch SDPA, flash/memory-efficient kernels)."""
    from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0

    if video.is_video_module(unet):
        if image_window:
            raise ModelError("image_window: windowed attention over image tokens is for SD3 / Flux; "
                             "set it to 0 for a video model")
        video.set_video_attention(unet, backend, video_window)
        return
    if dit.is_dit_module(unet):
        dit.set_dit_attention(unet, backend, image_window)
        return
    if image_window:
        raise ModelError("image_window: windowed attention over image tokens is for DiT models (SD3 / Flux); "
                         "set it to 0 for a UNet")
    if backend not in ("eager", "sdpa"):
        raise ModelError(f"attn_backend: {backend!r} is not supported by the image engine (eager, sdpa)")
    unet.set_attn_processor(AttnProcessor() if backend == "eager" else AttnProcessor2_0())


def lora_targets(cfg: RunConfig, kind: str = "sd") -> list[str]:
    """UNet modules that get LoRA: 'all-linear' means the attention projections (the targets of
    diffusers' and kohya's default UNet LoRA), else the comma list given; DiT kinds: the
    targets of diffusers' SD3 / Flux LoRA scripts."""
    if dit.is_dit_kind(kind):
        return dit.lora_targets(kind, cfg.lora_targets)
    if video.is_video_kind(kind):
        return video.lora_targets(cfg.lora_targets)
    if cfg.lora_targets == "all-linear":
        return list(UNET_LORA_TARGETS)
    return [t.strip() for t in cfg.lora_targets.split(",") if t.strip()]


def attach_unet_lora(unet, cfg: RunConfig) -> None:
    """Adds the run's trainable adapter (LoRA, DoRA, LoHa or LoKr, built by
    :func:`lora_gui.models.adapters.peft_config` as text runs and the memory trace build it;
    diffusers' ``add_adapter``) to the frozen UNet / DiT transformer. LoRA / DoRA start with a
    Gaussian A as diffusers' training scripts do."""
    import dataclasses

    from lora_gui.models.adapters import adapter_spec, peft_config

    kind = {v: k for k, v in {**dit.DIT_TRANSFORMERS, **video.VIDEO_TRANSFORMERS}.items()}.get(
        type(unet).__name__, "sd")
    spec = adapter_spec(cfg)
    if spec.kind in ("lora", "dora"):
        spec = dataclasses.replace(spec, init="gaussian")
    config = peft_config(spec, lora_targets(cfg, kind))
    try:
        unet.add_adapter(config)
    except ValueError as err:
        raise ModelError(f"lora_targets: {err}") from None
    for p in unet.parameters():  # LoRA weights train in fp32 even over bf16/fp16 frozen weights
        if p.requires_grad:
            p.data = p.data.float()
    if cfg.resolved_lean_backward():
        from lora_gui.models.lean_backward import lean_frozen_layers

        lean_frozen_layers(unet)


def encode_prompts_with_grad(model: ImageModel, captions: list[str], device: torch.device,
                             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`encode_prompts` with autograd on (the text encoders' LoRA trains through it)."""
    return encode_prompts.__wrapped__(model, captions, device)


@torch.no_grad()
def encode_prompts(model: ImageModel, captions: list[str], device: torch.device,
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Text-encoder hidden states (B, 77, D) and, for SDXL, the pooled embedding (B, 1280).

    SD 1.x: last hidden state of the CLIP text encoder. SDXL: penultimate hidden states of both
    encoders concatenated, pooled output of the second (as StableDiffusionXLPipeline does).
    """
    if video.is_video_kind(model.kind):
        hidden, _mask = video.encode_video_prompts(model.pipe, model.kind, captions, device,
                                                   model.info["text_length"])
        return hidden, None
    if dit.is_dit_kind(model.kind):
        return dit.encode_dit_prompts(model.pipe, model.kind, captions, device, model.info["text_length"])
    states, pooled = [], None
    for tokenizer, encoder in zip(model.tokenizers, model.text_encoders, strict=True):
        ids = tokenizer(captions, padding="max_length", max_length=tokenizer.model_max_length,
                        truncation=True, return_tensors="pt").input_ids.to(device)
        if model.kind == "sd":
            states.append(encoder(ids)[0])
            continue
        out = encoder(ids, output_hidden_states=True)
        states.append(out.hidden_states[-2])
        if hasattr(out, "text_embeds"):
            pooled = out.text_embeds
    return torch.cat(states, dim=-1), pooled


@dataclass
class Encoded:
    """The UNet's inputs for a batch of images (all in one bucket)."""

    latents: torch.Tensor  # (B, C, H/8, W/8), shifted and scaled by the VAE's factors
    hidden: torch.Tensor  # (B, 77, D) text-encoder hidden states (SD3: 77 + T5 tokens; Flux: T5)
    pooled: torch.Tensor | None  # (B, 1280) SDXL / SD3 / Flux pooled text embedding
    time_ids: torch.Tensor | None  # (B, 6) SDXL micro-conditioning
    text_mask: torch.Tensor | None = None  # (B, L) LTX-Video: 1.0 on the prompt's tokens, 0.0 on padding

    def to(self, device: torch.device) -> Encoded:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Encoded(move(self.latents), move(self.hidden), move(self.pooled), move(self.time_ids),
                       move(self.text_mask))


@torch.no_grad()
def encode_pixels(model: ImageModel, pixels: list[torch.Tensor], captions: list[str], time_ids: list,
                  device: torch.device, *, sample: bool,
                  generator: torch.Generator | list[torch.Generator] | None = None) -> Encoded:
    """Encodes loaded (3, H, W) pixels of one bucket and their captions (the memory plan traces
    this on fake tensors: :mod:`lora_gui.memory.predict.encode_trace`)."""
    latents = encode_latents(model, pixels, device, sample=sample, generator=generator)
    if video.is_video_kind(model.kind):  # T5 states, and LTX-Video's prompt mask
        hidden, mask = video.encode_video_prompts(model.pipe, model.kind, captions, device,
                                                  model.info["text_length"])
        return Encoded(latents, hidden, None, None, mask)
    hidden, pooled = encode_prompts(model, captions, device)
    ids = torch.tensor(time_ids, dtype=hidden.dtype, device=device) if model.kind == "sdxl" else None
    return Encoded(latents, hidden, pooled, ids)


def encode_latents(model: ImageModel, pixels: list[torch.Tensor], device: torch.device, *, sample: bool,
                   generator: torch.Generator | list[torch.Generator] | None = None) -> torch.Tensor:
    """The VAE's latents of loaded pixels of one bucket ((3, H, W) pictures or (3, F, H, W) clips),
    sampled or the mean, shifted and scaled into the denoiser's space."""
    batch = torch.stack(pixels).to(device, model.vae.dtype)
    dist = model.vae.encode(batch).latent_dist
    if sample and isinstance(generator, list):
        draws = torch.stack([torch.randn(dist.mean.shape[1:], generator=g) for g in generator])
        latents = dist.mean + dist.std * draws.to(dist.mean.device, dist.mean.dtype)
    else:
        latents = dist.sample(generator) if sample else dist.mode()
    if video.is_video_kind(model.kind):  # (B, C, T, h, w): per-channel mean and std
        latents = video.normalise_latents(model.kind, model.vae, latents)
    else:  # SD3 / Flux VAEs also shift the latents (shift_factor); SD 1.x / SDXL VAEs have none
        latents = (latents - (model.vae.config.get("shift_factor") or 0.0)) * model.vae.config.scaling_factor
    return latents


def sdxl_time_ids(original_hw: tuple[int, int], crop_tl: tuple[int, int],
                  target_hw: tuple[int, int]) -> list[int]:
    """SDXL micro-conditioning: original size, crop top-left and target size, (h, w) each."""
    return [*original_hw, *crop_tl, *target_hw]
