"""A diffusion run's adapter on disk: saved in diffusers' own format
(``pytorch_lora_weights.safetensors``, loadable with ``pipe.load_lora_weights``) and, on request,
in the kohya / A1111 / ComfyUI key format; and the full pipeline loaded back with it (samples,
generation, tests). The model these save is built by :mod:`lora_gui.models.diffusion`.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from peft import get_peft_model_state_dict

from lora_gui.models import dit, video
from lora_gui.models.diffusion import PIPELINE_CLASSES, ImageModel, pipeline_kind

log = logging.getLogger(__name__)
ADAPTER_FILE = "pytorch_lora_weights.safetensors"
KOHYA_FILE = "kohya_lora.safetensors"


def save_adapter(model: ImageModel, out: Path, export_kohya: bool = False) -> Path:
    """Writes out/adapter/ atomically: LoRA / DoRA in diffusers' format
    (pytorch_lora_weights.safetensors), LoHa / LoKr as a peft folder (``peft/``: diffusers cannot
    load them), kohya_lora.safetensors (kohya / LyCORIS keys; for SD3 / Flux.1 the layout their
    readers map; for Wan ComfyUI's Wan names, :mod:`lora_gui.models.wan_comfy`; for LTX-Video
    ComfyUI's LTX-Video names, :mod:`lora_gui.models.ltx_comfy`) when asked, and
    adapter_info.json naming which tools read which file (:mod:`lora_gui.models.image_adapter`)."""
    from diffusers.utils import convert_state_dict_to_diffusers

    from lora_gui.models import image_adapter

    config = model.unet.peft_config["default"]
    kind = adapter_kind(config)
    rank, alpha = adapter_rank_alpha(config)
    peft_sd = {k: v.detach().float().cpu().contiguous()
               for k, v in get_peft_model_state_dict(model.unet).items()}
    final = out / "adapter"
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".adapter-"))
    files = {}
    if not image_adapter.diffusers_loads(kind):
        image_adapter.save_peft_folder(tmp, model.unet, peft_sd)
        files[image_adapter.PEFT_FOLDER] = image_adapter.READERS[image_adapter.PEFT_FOLDER]
    elif dit.is_dit_kind(model.kind) or video.is_video_kind(model.kind):
        dit.save_dit_adapter(model.pipeline_class, tmp, model.unet)
    else:  # the adapter metadata carries lora_alpha: without it a loader assumes alpha = rank
        from lora_gui.models import text_encoder_lora

        model.pipeline_class.save_lora_weights(
            tmp, unet_lora_layers=convert_state_dict_to_diffusers(peft_sd),
            unet_lora_adapter_metadata=config.to_dict(), **text_encoder_lora.save_kwargs(model))
    is_dit = dit.is_dit_kind(model.kind) or video.is_video_kind(model.kind)
    if image_adapter.diffusers_loads(kind):
        files[ADAPTER_FILE] = (image_adapter.DIT_DIFFUSERS_READERS if is_dit
                               else image_adapter.READERS[ADAPTER_FILE])
    if export_kohya:
        from safetensors.torch import save_file

        if model.kind == "wan":  # ComfyUI's Wan names (lora_gui.models.wan_comfy)
            from lora_gui.models import wan_comfy

            # the file's alpha / rank is the scale: rank-stabilised LoRA scales by alpha / sqrt(rank)
            scale_alpha = alpha * rank ** 0.5 if getattr(config, "use_rslora", False) else alpha
            tensors, readers = wan_comfy.comfy_wan_state_dict(peft_sd, scale_alpha), wan_comfy.READERS
            meta = image_adapter.kohya_metadata(kind, rank, alpha)
        elif model.kind == "ltx":  # ComfyUI's LTX-Video names, scale folded in (lora_gui.models.ltx_comfy)
            from lora_gui.models import ltx_comfy

            scale = ltx_comfy.lora_scale(config)
            tensors, readers = ltx_comfy.comfy_ltx_state_dict(peft_sd, scale), ltx_comfy.READERS
            meta = {"format": "ComfyUI LTX-Video LoRA", "lora_rank": str(rank), "lora_alpha": str(alpha),
                    "scale_folded_into_lora_B": str(scale)}
        elif is_dit:  # the layout SD3 / Flux.1 readers map (lora_gui.models.dit_kohya)
            tensors, meta, readers = image_adapter.dit_kohya_file(model.kind, kind, peft_sd, rank, alpha,
                                                                  model.unet)
        else:
            tensors, meta = image_adapter.kohya_state_dict(peft_sd, kind, rank, alpha), \
                image_adapter.kohya_metadata(kind, rank, alpha)
            readers = image_adapter.READERS[KOHYA_FILE]
        save_file(tensors, tmp / KOHYA_FILE, metadata=meta)
        files[KOHYA_FILE] = readers
    (tmp / "adapter_info.json").write_text(json.dumps(
        {"base_model": model.source, "kind": model.kind, "adapter": kind, "lora_rank": rank,
         "lora_alpha": alpha, "target_modules": sorted(config.target_modules), "files": files}, indent=1))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    log.info("adapter saved in %s: %s", final, "; ".join(f"{name}: {who}" for name, who in files.items()))
    return final


def adapter_kind(config: Any) -> str:
    """lora, dora, loha or lokr from a peft config."""
    name = type(config).__name__
    if name == "LoraConfig":
        return "dora" if config.use_dora else "lora"
    return {"LoHaConfig": "loha", "LoKrConfig": "lokr"}.get(name, name)


def adapter_rank_alpha(config: Any) -> tuple[int, float]:
    """The rank and alpha of a peft LoRA / DoRA / LoHa / LoKr config."""
    alpha = config.lora_alpha if hasattr(config, "lora_alpha") else config.alpha
    return int(config.r), float(alpha)


def load_pipeline(source: str, adapter: str | Path | None = None, device: str = "cpu"):
    """The full diffusers pipeline of ``source`` with the adapter loaded (for samples and tests)."""
    import diffusers

    kind = pipeline_kind(source)
    cls = getattr(diffusers, PIPELINE_CLASSES[kind])
    extra = {"safety_checker": None, "requires_safety_checker": False} if kind == "sd" else {}
    # half precision on GPUs (the VAE upcasts itself where its config asks); fp32 on CPU
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    pipe = cls.from_pretrained(source, torch_dtype=dtype, **extra)
    if adapter is not None:
        from lora_gui.models.image_adapter import load_into_pipeline

        load_into_pipeline(pipe, Path(adapter))
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)
