"""An image run's adapter on disk: which files each variant writes, which tools read them, and
the kohya / LyCORIS key layout that ComfyUI and Automatic1111 load.

Files in ``run/adapter/`` (named in ``adapter_info.json``'s ``files``, with the tools that read each):

- LoRA and DoRA: ``pytorch_lora_weights.safetensors`` in diffusers' format (``pipe.load_lora_weights``;
  DoRA's magnitudes as ``lora_magnitude_vector``, which diffusers loads as DoRA).
- LoHa and LoKr: diffusers' ``load_lora_weights`` has no loader for them on SD 1.x / SDXL / SD3 /
  Flux.1, so the adapter is written as a peft adapter folder, ``peft/`` (``adapter_config.json`` +
  ``adapter_model.safetensors``), loaded onto ``pipe.unet`` / ``pipe.transformer`` with peft
  (:func:`load_into_pipeline`; this package's Try tab and samples do that).
- ``kohya_lora.safetensors`` (``export_kohya``, UNet pipelines): one module name per adapted layer,
  ``lora_unet_`` + the diffusers module path with ``_`` for ``.`` (as kohya's sd-scripts and
  LyCORIS name SD 1.x UNet layers; ComfyUI maps these names for SD 1.x and SDXL), then:

  * LoRA: ``.lora_down.weight`` (r, in), ``.lora_up.weight`` (out, r), ``.alpha`` (scale alpha / r);
  * DoRA: the same plus ``.dora_scale`` (out, 1): peft's magnitude per output row;
  * LoHa (LyCORIS ``hada``): ``.hada_w1_a`` (out, r), ``.hada_w1_b`` (r, in), ``.hada_w2_a``,
    ``.hada_w2_b``, ``.alpha``: delta = (w1_a w1_b) * (w2_a w2_b) * alpha / r;
  * LoKr (LyCORIS ``kron``): ``.lokr_w1`` (a, c) or ``.lokr_w1_a`` / ``.lokr_w1_b``, and ``.lokr_w2``
    (b, d) or ``.lokr_w2_a`` (b, r) / ``.lokr_w2_b`` (r, d): delta = kron(w1, w2) x scale. LyCORIS
    and ComfyUI scale by alpha / r only when a factor is low-rank; with both factors full they
    apply no scale, so peft's alpha / r is folded into ``lokr_w2`` and no alpha is written.

  DiT runs (SD3, Flux.1) write the same file name in the layout their readers map
  (:mod:`lora_gui.models.dit_kohya`): kohya sd-scripts' Flux.1 layout for plain LoRA on Flux.1
  (``lora_unet_double_blocks_N_img_attn_qkv``...), OneTrainer's ``lora_transformer_`` layout for
  SD3 and for DoRA / LoHa / LoKr on Flux.1.

ComfyUI (SD3, Flux.1) and Forge (Flux.1) also map a DiT run's
``pytorch_lora_weights.safetensors`` (its ``transformer.`` keys) but take no alpha from it:
diffusers keeps lora_alpha in the file's metadata, which they do not read, so they apply scale 1
instead of lora_alpha / lora_rank. ``kohya_lora.safetensors`` carries an ``.alpha`` per layer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

PEFT_FOLDER = "peft"  # LoHa / LoKr: the peft adapter folder inside run/adapter
DIFFUSERS_FILE = "pytorch_lora_weights.safetensors"
KOHYA_FILE = "kohya_lora.safetensors"
# which tools read which file (adapter_info.json and the export's message)
READERS = {
    DIFFUSERS_FILE: "diffusers pipe.load_lora_weights (LoRA / DoRA), this app's Try tab",
    PEFT_FOLDER: "peft (inject onto pipe.unet / pipe.transformer and set_peft_model_state_dict), this "
                 "app's Try tab; diffusers' load_lora_weights cannot read LoHa / LoKr for this pipeline",
    KOHYA_FILE: "ComfyUI (LoraLoader; LoRA, LoHa, LoKr, DoRA), Automatic1111 / Forge (Lora, LyCORIS "
                "networks), kohya sd-scripts; DoRA there normalises differently than peft (approximate)",
}
# a DiT run's files (SD3, Flux.1), by the kohya file's layout (lora_gui.models.dit_kohya)
DIT_DIFFUSERS_READERS = (
    "diffusers pipe.load_lora_weights (LoRA / DoRA; lora_alpha from the file's metadata), this app's "
    "Try tab; ComfyUI (SD3, Flux.1) and Forge (Flux.1) map its transformer.* keys but read no alpha "
    "from it (scale 1 instead of lora_alpha / lora_rank): use kohya_lora.safetensors there")
DIT_KOHYA_READERS = {
    "sd-scripts": "ComfyUI and Forge (LoRA loader; lora_unet_ + Flux.1's own layer names, q / k / v "
                  "fused as Flux.1 stores them), kohya sd-scripts, diffusers pipe.load_lora_weights "
                  "(Flux.1's real layer widths)",
    "onetrainer": "ComfyUI (LoraLoader; lora_transformer_ names, as OneTrainer writes them; LoRA, DoRA, "
                  "LoHa, LoKr; DoRA there normalises differently than peft, approximate); Forge and "
                  "kohya sd-scripts do not read this layout",
}
_SUFFIX = re.compile(r"\.(lora_A\.weight|lora_B\.weight|lora_magnitude_vector|hada_w[12]_[ab]|"
                     r"lokr_w[12](?:_[ab])?)$")
_KOHYA_NAME = {"lora_A.weight": "lora_down.weight", "lora_B.weight": "lora_up.weight",
               "lora_magnitude_vector": "dora_scale"}


def diffusers_loads(kind: str) -> bool:
    """Whether diffusers' ``load_lora_weights`` reads this adapter kind (LoRA, DoRA)."""
    return kind in ("lora", "dora")


def kohya_name(module: str, prefix: str = "lora_unet") -> str:
    """``down_blocks.0.attentions.0.proj`` -> ``lora_unet_down_blocks_0_attentions_0_proj``."""
    return f"{prefix}_{module.replace('.', '_')}"


def kohya_state_dict(peft_state: dict[str, torch.Tensor], kind: str, rank: int, alpha: float,
                     prefix: str = "lora_unet") -> dict[str, torch.Tensor]:
    """The kohya / LyCORIS layout of a peft adapter state dict (keys as
    ``get_peft_model_state_dict`` gives them, adapter name removed); see the module docstring.

    Raises:
        ValueError: a key of no known adapter tensor (names it).
    """
    modules: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in peft_state.items():
        match = _SUFFIX.search(key)
        if match is None:
            raise ValueError(f"{key}: not a LoRA / DoRA / LoHa / LoKr tensor; cannot write it in the "
                             "kohya layout")
        modules.setdefault(key[:match.start()], {})[match.group(1)] = value.detach().float().cpu()
    out: dict[str, torch.Tensor] = {}
    for module, tensors in modules.items():
        name = kohya_name(module, prefix)
        if kind == "lokr" and "lokr_w2" in tensors and "lokr_w1_a" not in tensors:
            tensors["lokr_w2"] = tensors["lokr_w2"] * (alpha / rank)  # no alpha: LyCORIS scale 1
        else:
            out[f"{name}.alpha"] = torch.tensor(float(alpha))
        for part, value in tensors.items():
            if part == "lora_magnitude_vector":
                value = value.reshape(-1, 1)  # magnitude per output row: (out, 1)
            out[f"{name}.{_KOHYA_NAME.get(part, part)}"] = value.contiguous()
    return out


def kohya_metadata(kind: str, rank: int, alpha: float) -> dict[str, str]:
    """The safetensors metadata kohya's and LyCORIS's own files carry (A1111 / ComfyUI show it)."""
    algo = {"lora": "lora", "dora": "lora", "loha": "loha", "lokr": "lokr"}[kind]
    module = "networks.lora" if kind == "lora" else "lycoris.kohya"
    args = {"algo": algo, **({"dora_wd": "True"} if kind == "dora" else {})}
    return {"ss_network_module": module, "ss_network_dim": str(rank), "ss_network_alpha": str(alpha),
            "ss_network_args": json.dumps(args)}


def dit_kohya_file(kind: str, adapter: str, peft_state: dict[str, torch.Tensor], rank: int,
                   alpha: float, transformer: Any) -> tuple[dict[str, torch.Tensor], dict[str, str], str]:
    """A DiT run's kohya-layout file: (tensors, safetensors metadata, which tools read it)."""
    from lora_gui.models import dit_kohya

    style = dit_kohya.layout(kind, adapter)
    if style == "sd-scripts":
        rows = {name: m.out_features for name, m in transformer.named_modules() if hasattr(m, "out_features")}
        tensors = dit_kohya.flux_kohya_state_dict(peft_state, rank, alpha, rows)
        meta = {**kohya_metadata(adapter, rank, alpha), "ss_network_module": "networks.lora_flux"}
    else:
        tensors = kohya_state_dict(peft_state, adapter, rank, alpha, prefix="lora_transformer")
        meta = kohya_metadata(adapter, rank, alpha)
    return tensors, meta, DIT_KOHYA_READERS[style]


def save_peft_folder(folder: Path, model: Any, peft_state: dict[str, torch.Tensor]) -> None:
    """Writes ``folder/peft`` (adapter_config.json + adapter_model.safetensors) for LoHa / LoKr."""
    from safetensors.torch import save_file

    target = folder / PEFT_FOLDER
    target.mkdir(parents=True, exist_ok=True)
    model.peft_config["default"].save_pretrained(str(target))
    save_file({k: v.detach().float().cpu().contiguous() for k, v in peft_state.items()},
              target / "adapter_model.safetensors")


def load_into_pipeline(pipe: Any, adapter: Path) -> None:
    """Loads ``adapter`` (a run's adapter folder) into ``pipe``: diffusers' ``load_lora_weights``
    for LoRA / DoRA, peft for the ``peft/`` folder of LoHa / LoKr (onto the UNet or transformer)."""
    from peft import PeftConfig, set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = Path(adapter) / PEFT_FOLDER
    if not folder.is_dir():
        pipe.load_lora_weights(str(adapter))
        return
    denoiser = pipe.unet if getattr(pipe, "unet", None) is not None else pipe.transformer
    config = PeftConfig.from_pretrained(str(folder))
    config.inference_mode = True
    denoiser.add_adapter(config)
    state = load_file(folder / "adapter_model.safetensors")
    result = set_peft_model_state_dict(denoiser, {k: v.to(denoiser.dtype) for k, v in state.items()})
    missing = [k for k in getattr(result, "unexpected_keys", []) if "hada_" in k or "lokr_" in k]
    if missing:
        raise ValueError(f"{folder}: {len(missing)} adapter tensors did not match the model "
                         f"(first: {missing[0]})")
