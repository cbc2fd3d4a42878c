"""What the Train form checks in the data and model a run would read, on every change of the form
and again at Start: one short message per field, in words a user acts on ("does not exist",
"is empty", "is not UTF-8 (line N)"). No gradio here.

The checks read the file (a text run's data is decoded once per change of its size or
modification time) but never load a model or a tokenizer: the full read the run itself makes
(:func:`lora_gui.engine.check_inputs`) is done at Start, before anything is written.
"""

from __future__ import annotations

import codecs
import threading
from pathlib import Path

from lora_gui.config import BUILTIN_DATA

CHUNK = 1 << 20  # bytes read at a time while looking for the first byte that is not UTF-8
_lock = threading.Lock()
_seen: dict[tuple, str | None] = {}  # (path, size, mtime_ns) -> message; a few entries
_KEEP = 32


def _first_bad_line(path: Path) -> int | None:
    """The line (1-based) of the first byte that is not UTF-8, or None: read in chunks, so a
    large file costs one pass and no more memory than a chunk."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as err:
                return line + chunk[:err.start].count(b"\n")
            line += chunk.count(b"\n")
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:  # the file ends inside a character
            return line
    return None


def _text_file_problem(value: str, path: Path) -> str | None:
    if path.stat().st_size == 0:
        return f"data: {value} is empty"
    bad = _first_bad_line(path)
    if bad is not None:
        return f"data: {value} is not UTF-8 (line {bad})"
    with path.open("rb") as fh:  # only blank lines or spaces: nothing to train on
        if not any(chunk.strip() for chunk in iter(lambda: fh.read(CHUNK), b"")):
            return f"data: {value} is empty (only blank lines)"
    return None


def data_problem(value: str, task: str) -> str | None:
    """Why the data setting ``value`` cannot be read by a ``task`` run, or None. Bundled names
    ('builtin', the bundled sets) are not paths and pass."""
    value = (value or "").strip()
    if not value:
        return "data: empty; use 'builtin' or a file path"
    if value == "builtin" or value in BUILTIN_DATA:
        return None
    path = Path(value).expanduser()
    if not path.exists():
        return f"data: {value} does not exist"
    if task == "video" and path.is_file():  # a .jsonl list of clips and captions, else a folder
        if path.suffix.lower() != ".jsonl":
            return f"data: {value} is a file; a video run reads a folder of clips or a .jsonl list of them"
    elif task in ("image", "video"):
        if not path.is_dir():
            return f"data: {value} is a file; an image run reads a folder of pictures"
        try:
            if next(path.iterdir(), None) is None:
                return f"data: {value} is empty"
        except OSError as err:
            return f"data: {value} cannot be read ({err.strerror})"
        return None
    if path.is_dir():
        return f"data: {value} is a folder; a text run reads one file (.txt, .jsonl or .csv)"
    try:
        info = path.stat()
        key = (str(path.resolve()), info.st_size, info.st_mtime_ns)
        with _lock:
            if key in _seen:
                return _seen[key]
        found = _text_file_problem(value, path)
    except OSError as err:
        return f"data: {value} cannot be read ({err.strerror or err})"
    with _lock:
        _seen[key] = found
        while len(_seen) > _KEEP:
            _seen.pop(next(iter(_seen)))
    return found


def looks_like_path(value: str) -> bool:
    """A model written as a path (absolute, ~, ./ or ../), not a Hub id such as 'org/name'."""
    return value.startswith(("/", "~", "./", "../", ".\\")) or value in (".", "..")


def model_problem(value: str) -> str | None:
    """Why the model setting cannot be a model, or None: a path that does not exist (a Hub id
    is not looked up here: no network)."""
    value = (value or "").strip()
    if not value:
        return "model: empty; use 'builtin', a model folder or a Hub id"
    if value == "builtin" or value.startswith("builtin:") or not looks_like_path(value):
        return None
    path = Path(value).expanduser()
    if not path.exists():
        return f"model: {value} does not exist"
    if path.is_dir():
        try:
            if next(path.iterdir(), None) is None:
                return f"model: {value} is empty"
        except OSError as err:
            return f"model: {value} cannot be read ({err.strerror})"
    elif path.stat().st_size == 0:
        return f"model: {value} is empty"
    return None


# the bundled models and the tasks each trains (lora_gui.models.diffusion, lora_gui.models.text)
BUNDLED_MODELS = {"builtin": ("text", "image"), "builtin:drawing": ("image",), "builtin:video": ("video",),
                  "builtin:ltx": ("video",)}
TASK_MODEL = {"text": "builtin", "image": "builtin", "video": "builtin:video"}  # each task's first


def model_task_problem(value: str, task: str) -> str | None:
    """Why a bundled model cannot train ``task``, naming the bundled ones that can, or None (a
    folder or Hub id is read at Start)."""
    value = (value or "").strip()
    if value not in BUNDLED_MODELS or task in BUNDLED_MODELS[value]:
        return None
    fits = [name for name, tasks in BUNDLED_MODELS.items() if task in tasks]
    what = {"video": "a video run trains a Wan or LTX-Video pipeline"}.get(task, f"a {task} run")
    return f"model: {value} is not a {task} model; {what}: use {' or '.join(fits)}"


def model_for_task(task: str, model: str) -> str | None:
    """The model field when the task changes to ``task``: a bundled model that cannot train it
    becomes the task's first bundled one (the video task: the Wan-shaped builtin:video); None
    leaves any other value as it is."""
    if model_task_problem(model, task) and task in TASK_MODEL:
        return TASK_MODEL[task]
    return None


def one_line(message: str, most: int = 200) -> str:
    """A message as one line (the first), without a leading "error:" (the page adds its own),
    cut at ``most`` characters."""
    line = next((part.strip() for part in str(message).splitlines() if part.strip()), "")
    while line.lower().startswith("error:"):
        line = line[len("error:"):].strip()
    return line if len(line) <= most else line[:most - 1] + "…"

