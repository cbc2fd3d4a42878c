"""Presets: YAML files under presets/ that hold only the settings that differ from the defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lora_gui.config import ConfigError, RunConfig, apply_overrides, load_yaml_overrides

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"


def list_presets(directory: Path = PRESET_DIR) -> list[Path]:
    """The run presets (presets/*.yaml), sorted by name."""
    return sorted(directory.glob("*.yaml"))


def resolve_preset(name_or_path: str | Path) -> Path:
    """Accepts a path, or a bare name such as 'text-demo' looked up in presets/."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    candidate = PRESET_DIR / f"{path.stem}.yaml"
    if candidate.is_file():
        return candidate
    known = ", ".join(p.stem for p in list_presets()) or "none"
    raise ConfigError(f"{name_or_path}: preset not found (known presets: {known})")


def load_config(preset: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Defaults, then the preset's overrides, then command-line overrides; validated."""
    cfg = RunConfig()
    if preset is not None:
        path = resolve_preset(preset)
        cfg = apply_overrides(cfg, load_yaml_overrides(path), where=str(path))
    if overrides:
        cfg = apply_overrides(cfg, overrides, where="--set")
    return cfg
