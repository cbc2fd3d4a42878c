"""What every tab shares: the one job manager, the runs folder, the list of user errors, presets
and the GPU this server sees. No gradio here (the handlers return plain values)."""

from __future__ import annotations

from pathlib import Path

import torch

from lora_gui.engine.jobs.manager import JobManager
from lora_gui.errors import USER_ERRORS  # noqa: F401  (re-exported for the tabs)
from lora_gui.memory.runtime.meter import GB
from lora_gui.presets import list_presets
from lora_gui.ui import paths

RUNS_ROOT = Path("runs")
# one job per server process, shared by every page that attaches; whatever it starts passes the
# dashboard's path check first (Start, Resume, Compare, the queue's runner)
MANAGER = JobManager(gate=paths.check_config)
SIMULATED_BUDGET_GB = 2.0  # default simulated VRAM budget on a machine without a GPU


def runs_root() -> Path:
    """The runs folder (a function so that tests can point it elsewhere)."""
    return RUNS_ROOT


paths.use_runs_root(lambda: runs_root())  # the path gate follows it (and its test stand-ins)


def check_run_name(name: str) -> str:
    """A run name is one folder under runs/: letters, digits, '.', '_', '-'; no '/' or '..'
    (the engine's rule, :func:`lora_gui.engine.core.rundir.run_folder`).

    Raises:
        RunDirError: naming the refused name.
    """
    from lora_gui.engine.core.rundir import run_folder

    return run_folder(runs_root(), name).name


def user_presets_dir() -> Path:
    """Where the dashboard saves presets: runs/presets/ (the bundled ones stay read-only)."""
    return runs_root() / "presets"


def preset_names() -> list[str]:
    """The bundled presets, then the user's own (saved from the dashboard)."""
    return [p.stem for p in list_presets(user_dir=user_presets_dir())]


def preset_file(name: str | None) -> Path:
    """The YAML file of a preset the page names: a bundled or user preset by name only (never a
    path typed in a request).

    Raises:
        ConfigError: for any other name (cut when long).
    """
    from lora_gui.config import ConfigError
    from lora_gui.errors import cut

    for path in list_presets(user_dir=user_presets_dir()):
        if path.stem == name:
            return path
    raise ConfigError(f"preset {cut(name)}: not found (known presets: {', '.join(preset_names())})")


def preset_config(name: str | None, overrides: dict | None = None):
    """Settings of a named preset (``overrides`` applied), through the dashboard's path check
    (a preset file may name a data file or model folder outside the allowed folders)."""
    from lora_gui.presets import load_config

    cfg = load_config(preset_file(name), overrides)
    paths.check_config(cfg)
    return cfg


def gpu_total_gb() -> float | None:
    """Total memory of the first GPU in GB, or None without one."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / GB
    return None


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_budget_gb() -> float:
    """The detected GPU's total memory, or the simulated default without a GPU."""
    total = gpu_total_gb()
    return round(total, 1) if total is not None else SIMULATED_BUDGET_GB


CUSTOM_CARD = "custom"  # the card picker's entry for a budget typed by hand (budget_gb)
CARD_STORAGE_KEY = "lora_gui-card"  # the browser's localStorage key of the picked card


def card_choices() -> list[tuple[str, str]]:
    """The card picker's (label, key) entries: a budget typed by hand, then every known card
    (the list ``plan --card`` uses)."""
    from lora_gui.cards import CARDS

    return [("Budget typed below (GB)", CUSTOM_CARD),
            *((f"{c.label}: {c.total_bytes / GB:,.2f} GB", c.name) for c in CARDS.values())]


def card_budget_gb(name: str | None) -> float | None:
    """The budget (decimal GB, as budget_gb) a card gives: its whole memory as the driver reports
    it (the plan counts the CUDA context inside it). None for a typed budget or an unknown name."""
    from lora_gui.cards import card_by_name

    if not name or name == CUSTOM_CARD:
        return None
    try:
        return card_by_name(name).total_bytes / GB  # exact: the bytes `plan --card` plans with
    except ValueError:
        return None


def budget_note() -> str:
    """One line under the card picker: what the budget means on this machine."""
    total = gpu_total_gb()
    if total is None:
        return ("**No GPU here: runs are simulated on this CPU**; the tracker enforces the budget "
                "(0 = none).")
    return f"This GPU has {total:.1f} GB. 0 = no budget."
