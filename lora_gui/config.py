"""Settings of one run: a single source of truth for defaults, help, ranges and validation.

Every setting is a field of :class:`RunConfig` declared with :func:`option`, which carries its
default, help text, group, range and choices. CLI ``--set key=value``, preset YAML files and UI
widgets are all derived from these fields, so a setting is declared once. The keys are flat
(``lora_rank``, ``max_seq_len``...) because users type them; ``group`` orders them in the UI.
The fields are declared by group in sibling modules (task, memory, training, image, adapter,
objective) that RunConfig composes; this module checks them together and reads them from the
command line and preset files.

A bad value raises :class:`ConfigError` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lora_gui.adapter_settings import (
    ADAPTERS,
    DATA_INITS,
    IMAGE_ADAPTERS,
    LORA_INITS,
    LoraSettings,
    QuantizationSettings,
    bitsandbytes_present,
)
from lora_gui.errors import clip
from lora_gui.image_settings import (
    DIT,
    IMAGE_GRID,
    UNET,
    DiTSettings,
    ImageSettings,
    VideoSettings,
    video_side,
)
from lora_gui.memory_settings import AUTO_LOSS_CHUNK, MemorySettings
from lora_gui.objective import PreferenceSettings
from lora_gui.options import READS, TEXT, WRITES, ConfigError, option
from lora_gui.task_settings import (
    ASSETS,
    BUILTIN_CLIPS,
    BUILTIN_DATA,
    BUILTIN_IMAGES,
    BUILTIN_MODEL_DIR,
    TaskSettings,
)
from lora_gui.training_settings import MIN_SEQ_LEN, TRACKERS, TrainingSettings

# the names other modules read from here, wherever they are declared
__all__ = ["ADAPTERS", "ASSETS", "AUTO_LOSS_CHUNK", "BUILTIN_CLIPS", "BUILTIN_DATA", "BUILTIN_IMAGES",
           "BUILTIN_MODEL_DIR", "DATA_INITS", "DIT", "IMAGE_ADAPTERS", "IMAGE_GRID", "LORA_INITS",
           "MIN_SEQ_LEN", "READS", "TEXT", "TRACKERS", "UNET", "WRITES", "ConfigError", "RunConfig",
           "apply_overrides", "bitsandbytes_present", "choices_of", "diff_from_defaults", "field_names",
           "load_yaml_overrides", "option", "parse_set_args", "parse_value", "unknown_key_message",
           "video_side"]


# A dataclass lists its bases' fields from the last base to the first, so the groups are named
# here last-first: the settings keep the order they have always had (the objective's group,
# then task, memory, training, image, video, quantization, DiT, LoRA), which the form, the CLI's
# listing and saved presets show.
@dataclass
class RunConfig(LoraSettings, DiTSettings, QuantizationSettings, VideoSettings, ImageSettings,
                TrainingSettings, MemorySettings, TaskSettings, PreferenceSettings):
    """All settings of a training run; each group's fields are declared in its own module."""

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
        self._check_quantization()
        if self.task in ("image", "video") and self.attention == "windowed":
            raise ConfigError("attention: windowed is for text runs; image runs use attn_backend")
        if self.attention == "windowed":
            for key in ("window", "global_tokens"):
                if getattr(self, key) > self.max_seq_len:
                    raise ConfigError(f"{key}: {getattr(self, key)} is above max_seq_len "
                                      f"{self.max_seq_len}; windowed attention needs it shorter")
        if self.task == "video":
            self.resolved_video_window()  # names a bad value
        self._check_adapter()
        if problem := self.preference_problem():
            raise ConfigError(problem)
        if self.checkpoint_layers and self.task == "image":
            raise ConfigError("checkpoint_layers: applies to text runs (a decoder's layers) and video "
                              "runs (a video transformer's blocks); image runs checkpoint every block, "
                              "leave it at 0")
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
