"""Model configs for the planner: bundled presets/models/*.json, a config.json path or a model dir.

Text models come back as a transformers ``PretrainedConfig`` (any ``model_type`` that
``AutoModelForCausalLM`` knows); diffusers UNets come back as a plain dict with
``_class_name == "UNet2DConditionModel"``. Only shapes matter: no weights are read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

from transformers import AutoConfig, PretrainedConfig

PRESET_DIR = Path(__file__).resolve().parents[3] / "presets" / "models"
UNET_CLASS = "UNet2DConditionModel"
DIT_CLASSES = ("SD3Transformer2DModel", "FluxTransformer2DModel")  # flow-matching DiT denoisers
VIDEO_CLASSES = ("WanTransformer3DModel", "LTXVideoTransformer3DModel")  # video denoisers (task video)
ModelConfig = Union[PretrainedConfig, dict]  # noqa: UP007 (readable alias)


def bundled_models() -> list[str]:
    """Names of the bundled configs (file stems of presets/models/*.json), sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def supported_text_model_types() -> list[str]:
    """``model_type`` values that transformers can build as a causal LM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _unsupported(what: str) -> ValueError:
    common = ", ".join(t for t in ("llama", "mistral", "qwen2", "gemma2", "gpt2", "gpt_neox", "phi3")
                       if t in supported_text_model_types())
    return ValueError(
        f"unsupported model {what}: supported are the bundled configs {bundled_models()}, any "
        f"transformers causal LM model_type (e.g. {common}; {len(supported_text_model_types())} in all) "
        f"and diffusers {UNET_CLASS} / {' / '.join(DIT_CLASSES)} configs"
    )


def is_unet_config(config: Any) -> bool:
    """True for a diffusers UNet2DConditionModel config (dict with ``_class_name``)."""
    return isinstance(config, dict) and config.get("_class_name") == UNET_CLASS


def is_dit_config(config: Any) -> bool:
    """True for a diffusers SD3 / Flux transformer config (dict with ``_class_name``)."""
    return isinstance(config, dict) and config.get("_class_name") in DIT_CLASSES


def is_video_config(config: Any) -> bool:
    """True for a diffusers Wan / LTX-Video transformer config (dict with ``_class_name``)."""
    return isinstance(config, dict) and config.get("_class_name") in VIDEO_CLASSES


def config_from_dict(data: dict) -> ModelConfig:
    """Turns a parsed config.json into a ``PretrainedConfig`` (text) or a UNet dict.

    Raises:
        ValueError: for an architecture that is neither a causal LM nor a UNet2DConditionModel.
    """
    data = dict(data)
    if data.get("_class_name") == UNET_CLASS or UNET_CLASS in data.get("architectures", []):
        data["_class_name"] = UNET_CLASS
        return data
    if data.get("_class_name") in DIT_CLASSES + VIDEO_CLASSES:
        return data
    model_type = data.get("model_type")
    if model_type not in supported_text_model_types():
        raise _unsupported(f"model_type={model_type!r} (architectures={data.get('architectures')})")
    data.pop("model_type")
    return AutoConfig.for_model(model_type, **data)


def load_model_config(name_or_path: Any) -> ModelConfig:
    """Loads a model config from a bundled name, a config.json path, a model dir or an object.

    Args:
        name_or_path: a ``PretrainedConfig`` (returned as is), a dict (parsed config.json),
            a bundled name such as ``"llama-3.1-8b"`` or ``"sdxl-unet"`` (case-insensitive),
            a path to a config.json, or a local model directory (its ``config.json``, or
            ``unet/config.json`` for a diffusers pipeline folder).

    Returns:
        A ``PretrainedConfig`` for causal LMs, a dict for UNet2DConditionModel.

    Raises:
        ValueError: unknown name or architecture; the message names what is supported.
    """
    if isinstance(name_or_path, PretrainedConfig):
        return name_or_path
    if isinstance(name_or_path, dict):
        return config_from_dict(name_or_path)
    key = str(name_or_path)
    preset = PRESET_DIR / f"{key.lower()}.json"
    if preset.is_file():
        return config_from_dict(json.loads(preset.read_text()))
    path = Path(key).expanduser()
    if path.is_dir():
        for candidate in (path / "config.json", path / "unet" / "config.json",
                          path / "transformer" / "config.json"):
            if candidate.is_file():
                return config_from_dict(json.loads(candidate.read_text()))
        raise ValueError(f"no config.json in model directory {path}")
    if path.is_file():
        return config_from_dict(json.loads(path.read_text()))
    raise _unsupported(f"{key!r} (not a bundled name, config.json or model directory)")


def max_positions(config: ModelConfig) -> int | None:
    """Longest sequence a text model supports (``max_position_embeddings`` / ``n_positions``)."""
    if is_unet_config(config) or is_dit_config(config):
        return None
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
