"""Presets: YAML files that hold only the settings that differ from the defaults: the bundled
ones under presets/ (read-only from the dashboard) and the user's own, saved from the dashboard
under runs/presets/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lora_gui.config import ConfigError, RunConfig, apply_overrides, load_yaml_overrides
from lora_gui.errors import cut

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"
# presets saved from the dashboard: beside the runs (relative to the working directory, as runs/)
USER_PRESET_DIR = Path("runs") / "presets"


def list_presets(directory: Path | None = None, user_dir: Path | None = None) -> list[Path]:
    """The run presets: the bundled ones (``directory``, default presets/*.yaml) sorted by name,
    then the user's own in ``user_dir`` (None: none) whose names no bundled preset has."""
    bundled = sorted((PRESET_DIR if directory is None else Path(directory)).glob("*.yaml"))
    if user_dir is None:
        return bundled
    taken = {p.stem for p in bundled}
    return bundled + sorted(p for p in Path(user_dir).glob("*.yaml") if p.stem not in taken)


def resolve_preset(name_or_path: str | Path, user_dir: Path | None = USER_PRESET_DIR) -> Path:
    """Accepts a path, or a bare name such as 'text-demo' looked up in presets/, then in the
    user's presets folder."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    for folder in (PRESET_DIR, user_dir):
        candidate = Path(folder) / f"{path.stem}.yaml" if folder is not None else None
        if candidate is not None and candidate.is_file():
            return candidate
    known = ", ".join(p.stem for p in list_presets(user_dir=user_dir)) or "none"
    raise ConfigError(f"{cut(name_or_path)}: preset not found (known presets: {known})")


def load_config(preset: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Defaults, then the preset's overrides, then command-line overrides; validated."""
    cfg = RunConfig()
    if preset is not None:
        path = resolve_preset(preset)
        cfg = apply_overrides(cfg, load_yaml_overrides(path), where=str(path))
    if overrides:
        cfg = apply_overrides(cfg, overrides, where="--set")
    return cfg
