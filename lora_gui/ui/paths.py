"""The one gate for every value of the dashboard that names a file or folder.

The dashboard may be shared (``--host`` with ``--auth``): a data file, a model folder, an adapter
to start from, a run folder or a preset read from the page must lie inside the folders the
server was started with: the working directory, the runs folder, the bundled assets and presets,
and every folder given with ``--allow-path DIR``. A folder the page writes into (a tracker
folder, an export folder) must lie there too and never inside the app's own files: its code,
bundled assets and presets, or the queue's and uploads' folders beside the runs.
``--allow-any-path`` lifts the limit. The command line is not limited: it already runs as the
user. No gradio here.

Which settings name a path is declared on the setting itself (``option(path=READS | WRITES)``
in :mod:`lora_gui.config`), so :func:`refusals` / :func:`check_config` see a new path setting
without a list to update. Every route calls them: the Train form, Start, Resume and the queue's
runner (through the job manager's gate), Add to queue and sweeps, presets, Plan, Longest that
fits, Compare, Try and export. A refusal is decided on the path's text alone (after following
links that exist inside), so it reads the same whether an outside path exists or not.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from lora_gui.config import ASSETS, RunConfig
from lora_gui.errors import UserError, cut
from lora_gui.options import WRITES, path_settings
from lora_gui.presets import PRESET_DIR

_lock = threading.Lock()
_extra: tuple[Path, ...] = ()  # folders added with --allow-path, resolved
_any_path = False  # --allow-any-path
# the dashboard's runs folder: lora_gui.ui.common hands its runs_root here when imported (this
# module does not import it back)
_runs_root: Callable[[], Path] = lambda: Path("runs")  # noqa: E731


def use_runs_root(getter: Callable[[], Path]) -> None:
    """Where the runs folder is (a function: tests point it elsewhere)."""
    global _runs_root
    _runs_root = getter
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # lora_gui/: the app's code
# beside the run folders: the queue's locks, launch logs, uploads, user presets, the queue file
PATH_CHARS = 240  # a typed path in a message: long enough for real paths, never a whole page
APP_ENTRIES = (".queue", ".launch", "uploads", "presets", "queue.json")


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
    with _lock:
        extra = _extra
    roots = [Path.cwd(), Path(_runs_root()).resolve(), ASSETS.resolve(), PRESET_DIR.resolve(), *extra]
    return list(dict.fromkeys(roots))


def app_folders() -> list[Path]:
    """The app's own files, never written from the page (resolved): its code, bundled assets and
    presets, and the queue's, launches', uploads' and user presets' entries beside the runs."""
    runs = Path(_runs_root()).resolve()
    return [PACKAGE_DIR, ASSETS.resolve(), PRESET_DIR.resolve(), *(runs / name for name in APP_ENTRIES)]


def _resolved(value: str | Path) -> Path:
    return Path(value).expanduser().resolve()


def is_allowed(value: str | Path, writes: bool = False) -> bool:
    """Whether ``value`` (relative paths from the working directory; '~', '..' and symbolic links
    followed) lies inside an allowed folder; with ``writes``, also outside the app's own files."""
    with _lock:
        if _any_path:
            return True
    resolved = _resolved(value)
    if not any(resolved.is_relative_to(root) for root in allowed_roots()):
        return False
    if writes:
        return not any(resolved.is_relative_to(own) or own.is_relative_to(resolved)
                       for own in app_folders())
    return True


def check(field: str, value: str | Path, writes: bool = False) -> Path:
    """``value`` as a Path when it is allowed (``writes``: a folder the page writes into).

    Raises:
        PathNotAllowedError: naming ``field``, the path (cut when long), the allowed folders and
            the flags; the same words whether the path exists or not.
    """
    if is_allowed(value, writes):
        return Path(value).expanduser()
    roots, shown = ", ".join(str(r) for r in allowed_roots()), cut(value, PATH_CHARS)
    if writes and any(_resolved(value).is_relative_to(r) for r in allowed_roots()):
        raise PathNotAllowedError(
            f"{field}: {shown} holds the app's own files (its code, bundled assets and presets, "
            "the queue and uploads); pick a folder of your own, e.g. under the runs folder")
    raise PathNotAllowedError(
        f"{field}: {shown} is outside the folders this dashboard may use ({roots}). Start the "
        "dashboard with --allow-path DIR to add a folder, or --allow-any-path to lift the limit")


def is_path_value(value: Any) -> bool:
    """Whether a path setting's value names a path: not empty and not a bundled name
    ('builtin', 'builtin:...')."""
    return isinstance(value, str) and bool(value.strip()) and value != "builtin" \
        and not value.startswith("builtin:")


def refusals(values: RunConfig | Mapping[str, Any]) -> dict[str, str]:
    """{setting: message} for each path setting (declared with ``option(path=...)``) of
    ``values`` (a RunConfig or a mapping of some settings) that the dashboard may not use."""
    if isinstance(values, RunConfig):
        values = values.to_dict()
    found = {}
    for name, kind in path_settings(RunConfig).items():
        value = values.get(name)
        if not is_path_value(value):
            continue
        try:
            check(name, value, writes=kind == WRITES)
        except PathNotAllowedError as err:
            found[name] = str(err)
    return found


def check_config(values: RunConfig | Mapping[str, Any]) -> None:
    """Refuses settings naming a path the dashboard may not use (the gate every route calls).

    Raises:
        PathNotAllowedError: the first refused setting's message.
    """
    found = refusals(values)
    if found:
        raise PathNotAllowedError(next(iter(found.values())))


def free_upload_name(folder: Path, src: Path) -> tuple[Path, bool]:
    """(where an uploaded file goes in ``folder``, whether that file already holds the same bytes).

    An earlier upload of the same name with other contents is never replaced: the new one gets
    NAME-2.EXT, NAME-3.EXT, ... (the first free name, or the one holding the same bytes)."""
    import filecmp

    stem, suffix = Path(src.name).stem, Path(src.name).suffix
    for n in range(1, 10_000):
        dest = folder / (src.name if n == 1 else f"{stem}-{n}{suffix}")
        if not dest.exists():
            return dest, False
        if dest.is_file() and filecmp.cmp(src, dest, shallow=False):
            return dest, True
    raise PathNotAllowedError(f"uploads: {folder} holds 10,000 files named {cut(src.name)}; "
                              "rename the file before uploading")
