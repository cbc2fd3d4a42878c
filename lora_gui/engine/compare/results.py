"""A comparison's results on disk (compare.json and compare.csv, replaced atomically after every
row, so an interrupted comparison resumes) and its running state."""

from __future__ import annotations

import csv
import io
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lora_gui.config import ConfigError, RunConfig
from lora_gui.engine.compare.spec import CSV_FIELDS, CompareSettings, row_key
from lora_gui.engine.core.checkpoint import write_atomic


# -- files ------------------------------------------------------------------------------------
def _csv_text(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in row.items()})
    return buf.getvalue()


def write_results(out: Path, settings: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """compare.json (settings + rows) and compare.csv, each replaced atomically."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "compare.json", json.dumps({"settings": settings, "rows": rows}, indent=1))
    write_atomic(out / "compare.csv", _csv_text(rows))


def load_results(path: Path) -> dict[str, Any]:
    """Reads a compare.json (or the compare.json in a folder); errors name the file."""
    path = Path(path)
    if path.is_dir():
        path = path / "compare.json"
    if not path.is_file():
        raise ConfigError(f"{path}: no compare.json here (run `python -m lora_gui compare`)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not a compare.json ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ConfigError(f"{path}: expected an object with a 'rows' list")
    return data


def resume_rows(out: Path, settings: dict[str, Any], overwrite: bool) -> list[dict[str, Any]]:
    """The rows already in out/compare.json when it holds the same comparison (none to start over)."""
    path = out / "compare.json"
    if overwrite or not path.is_file():
        return []
    saved = load_results(path)
    if saved.get("settings") != settings:
        raise ConfigError(f"{path}: holds a comparison with other settings; pass --overwrite to "
                          "replace it or choose another --out")
    return saved["rows"]


# -- the runner ---------------------------------------------------------------------------------
@dataclass
class Comparison:
    """State of one comparison while it runs: settings, rows so far, where they go."""

    base: RunConfig
    settings: CompareSettings
    out: Path
    stop: threading.Event = field(default_factory=threading.Event)
    on_row: Callable[[dict[str, Any]], None] | None = None
    progress: bool = False
    rows: list[dict[str, Any]] = field(default_factory=list)

    def saved_settings(self) -> dict[str, Any]:
        return {**self.settings.__dict__, "config": self.base.to_dict()}

    def add(self, row: dict[str, Any]) -> None:
        self.rows = [r for r in self.rows if row_key(r) != row_key(row)] + [row]
        write_results(self.out, self.saved_settings(), self.rows)
        if self.on_row:
            self.on_row(row)

    def done(self) -> set[str]:
        return {row_key(r) for r in self.rows}
