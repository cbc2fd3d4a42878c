"""Record readers for instruction and chat data: .jsonl, .json (a list), .csv, .parquet and a
folder written by ``datasets.Dataset.save_to_disk``.

Every record comes back with where it was found (``file:line`` for the text formats, ``file: row
N`` for the columnar ones), so an error about one conversation names the file and the line. The
columnar formats (.parquet, a ``save_to_disk`` folder) are read with the ``datasets`` library;
the text formats are parsed here because their readers must keep line numbers.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lora_gui.data.text import DataError, _read_text

JSON_COLUMNS = ("messages", "conversations", "tools")  # CSV cells that may hold JSON lists


@dataclass(frozen=True)
class Record:
    """One raw record (a JSON object or a table row) and where it came from."""

    values: dict[str, Any]
    where: str  # "data.jsonl:12" or "data.parquet: row 3"


def _jsonl(path: Path) -> list[Record]:
    records = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{number}: malformed JSON ({err.msg})") from None
        records.append(_object(value, f"{path}:{number}"))
    return records


def _object(value: Any, where: str) -> Record:
    if not isinstance(value, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return Record(value, where)


def _json_list(path: Path) -> list[Record]:
    """A JSON array of objects; each object's line is found while decoding it."""
    text = _read_text(path)
    decoder = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())
    if not text.startswith("[", pos):
        raise DataError(f"{path}:1: expected a JSON list of objects ([{{...}}, ...]); "
                        "use .jsonl for one object a line")
    pos += 1
    records: list[Record] = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            raise DataError(f"{path}: the JSON list is not closed with ]")
        if text[pos] == "]":
            return records
        line = text.count("\n", 0, pos) + 1
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{err.lineno}: malformed JSON ({err.msg})") from None
        records.append(_object(value, f"{path}:{line}"))


def _check_cells(values: dict[str, Any], where: str, header: list[str]) -> None:
    """A row shorter than the header (csv fills the missing cells with None) is refused with the
    columns it lacks; an empty cell ("a,,b") is a value, the empty text."""
    missing = [name for name in header if values.get(name) is None]
    if missing and any(isinstance(v, str) and v.strip() for v in values.values()):
        cells = len(header) - len(missing)
        names = ", ".join(f"'{name}'" for name in missing)
        raise DataError(f"{where}: this row has no value for {names}: it has {cells} "
                        f"cell{'s' if cells != 1 else ''} where the header names {len(header)} "
                        f"columns ({', '.join(header)}); give every column a cell (\"\" for none)")


def _csv(path: Path) -> list[Record]:
    reader = csv.DictReader(_read_text(path).splitlines(keepends=True))
    if not reader.fieldnames:
        raise DataError(f"{path}:1: no header row")
    records = []
    start = 2
    for row in reader:
        where = f"{path}:{start}"
        start = reader.line_num + 1  # rows may span lines (quoted newlines)
        values: dict[str, Any] = {k: v for k, v in row.items() if k is not None}
        _check_cells(values, where, reader.fieldnames)
        for key in JSON_COLUMNS:
            if isinstance(values.get(key), str) and values[key].strip():
                try:
                    values[key] = json.loads(values[key])
                except json.JSONDecodeError as err:
                    raise DataError(f"{where}: column '{key}' is not valid JSON ({err.msg})") from None
        if any(isinstance(v, str) and v.strip() for v in values.values()) or any(
                not isinstance(v, str) and v is not None for v in values.values()):
            records.append(Record(values, where))
    return records


def _table(path: Path) -> list[Record]:
    """.parquet or a save_to_disk folder, read with the datasets library."""
    import datasets

    try:
        if path.is_dir():
            table = datasets.load_from_disk(str(path))
            if isinstance(table, datasets.DatasetDict):
                split = "train" if "train" in table else next(iter(table))
                table = table[split]
        else:
            table = datasets.Dataset.from_parquet(str(path))
    except (FileNotFoundError, ValueError, OSError) as err:
        kind = "a datasets save_to_disk folder" if path.is_dir() else "a parquet file"
        raise DataError(f"{path}: cannot read it as {kind} ({err})") from None
    return [Record(dict(row), f"{path}: row {i + 1}") for i, row in enumerate(table)]


READERS = {".jsonl": _jsonl, ".json": _json_list, ".csv": _csv, ".parquet": _table}


def is_record_source(path: Path) -> bool:
    """True for the files and folders this module reads (everything but plain .txt)."""
    return path.is_dir() or path.suffix.lower() in READERS


def read_records(path: str | Path) -> list[Record]:
    """All records of a data file or ``save_to_disk`` folder, each with its file and line.

    Raises:
        DataError: naming the file (and line) when it is missing, empty or malformed.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: data file not found")
    if path.is_dir():
        if not (path / "dataset_info.json").is_file() and not (path / "dataset_dict.json").is_file():
            raise DataError(f"{path}: is a folder but not one written by datasets' save_to_disk "
                            "(no dataset_info.json); use a .jsonl, .json, .csv or .parquet file")
        records = _table(path)
    else:
        reader = READERS.get(path.suffix.lower())
        if reader is None:
            raise DataError(f"{path}: unsupported extension '{path.suffix}'; use .txt, .jsonl, .json, "
                            ".csv, .parquet or a datasets save_to_disk folder")
        records = reader(path)
    if not records:
        raise DataError(f"{path}: no records found")
    return records
