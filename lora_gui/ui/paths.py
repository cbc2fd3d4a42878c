"""Which folders a path typed in the dashboard may reach.

The dashboard may be shared (``--host`` with ``--auth``): a data file, a model folder, a tracker
folder, a run folder or an export folder typed in the page must lie inside the folders the server
was started with: the working directory, the runs folder, the bundled assets and presets, and
every folder given with ``--allow-path DIR``. ``--allow-any-path`` lifts the limit. The command
line is not limited: it already runs as the user. No gradio here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

from lora_gui.config import ASSETS
from lora_gui.errors import UserError
from lora_gui.presets import PRESET_DIR

_lock = threading.Lock()
_extra: tuple[Path, ...] = ()  # folders added with --allow-path, resolved
_any_path = False  # --allow-any-path


class PathNotAllowedError(UserError, ValueError):
    """A path typed in the page lies outside the folders the dashboard may use; the message names
    the field, the path and how to allow it."""


def configure(allow: Iterable[str | Path] = (), any_path: bool = False) -> None:
    """Sets the folders the page may reach besides the defaults (the server's start flags)."""
    global _extra, _any_path
    folders = tuple(Path(p).expanduser().resolve() for p in allow)
    with _lock:
        _extra, _any_path = folders, bool(any_path)


def allowed_roots() -> list[Path]:
    """The folders a typed path may lie in (resolved): working directory, runs, assets, presets
    and the --allow-path folders."""
    from lora_gui.ui.common import runs_root

    with _lock:
        extra = _extra
    roots = [Path.cwd(), Path(runs_root()).resolve(), ASSETS.resolve(), PRESET_DIR.resolve(), *extra]
    return list(dict.fromkeys(roots))


def is_allowed(value: str | Path) -> bool:
    """Whether ``value`` (relative paths from the working directory; '~', '..' and symbolic links
    followed) lies inside an allowed folder."""
    with _lock:
        if _any_path:
            return True
    resolved = Path(value).expanduser().resolve()
    return any(resolved.is_relative_to(root) for root in allowed_roots())


def check(field: str, value: str | Path) -> Path:
    """``value`` as a Path when it is allowed.

    Raises:
        PathNotAllowedError: naming ``field``, the path, the allowed folders and the flags.
    """
    if is_allowed(value):
        return Path(value).expanduser()
    roots = ", ".join(str(r) for r in allowed_roots())
    raise PathNotAllowedError(
        f"{field}: {value} is outside the folders this dashboard may use ({roots}). Start the "
        "dashboard with --allow-path DIR to add a folder, or --allow-any-path to lift the limit")
