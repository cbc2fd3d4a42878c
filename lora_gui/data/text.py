"""Text data: .txt / .jsonl / .csv files -> documents -> token ids with loss labels.

Formats:
- ``.txt``: one document per blank-line-separated block;
- ``.jsonl``: one JSON object a line with ``text``, or ``prompt`` + ``response`` (the loss is
  taken on the response only);
- ``.csv``: a ``text`` column.
Every error names the file, and the line where there is one.
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path

from lora_gui.errors import UserError

IGNORE_INDEX = -100  # label value that transformers' loss skips


class DataError(UserError, ValueError):
    """A data file is missing, empty, not UTF-8 or malformed; the message says where."""


@dataclass(frozen=True)
class Document:
    """One training document. ``prompt`` is context only (no loss); ``text`` is trained on."""

    text: str
    prompt: str = ""


@dataclass(frozen=True)
class TokenizedSample:
    """Token ids of one document, with labels (IGNORE_INDEX where no loss is taken)."""

    input_ids: list[int]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)

    def targets_within(self, length: int) -> int:
        """Tokens that carry a loss when the sample is cut to ``length`` (labels are shifted by
        one inside the model, so the first label never counts; packing relies on that too)."""
        return sum(1 for label in self.labels[1:length] if label != IGNORE_INDEX)


def _read_text(path: Path) -> str:
    if not path.exists():
        raise DataError(f"{path}: data file not found")
    if path.is_dir():
        raise DataError(f"{path}: is a folder; expected a .txt, .jsonl or .csv file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8 (byte {err.start})") from None
    if not text.strip():
        raise DataError(f"{path}: data file is empty")
    return text


def _read_txt(path: Path, text: str) -> list[Document]:
    blocks = [block.strip() for block in text.replace("\r\n", "\n").split("\n\n")]
    return [Document(text=block) for block in blocks if block]


def _read_jsonl(path: Path, text: str) -> list[Document]:
    docs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{number}: malformed JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        if isinstance(record.get("text"), str):
            docs.append(Document(text=record["text"]))
        elif isinstance(record.get("prompt"), str) and isinstance(record.get("response"), str):
            docs.append(Document(text=record["response"], prompt=record["prompt"]))
        else:
            keys = ", ".join(sorted(record)) or "none"
            raise DataError(
                f"{path}:{number}: expected a string field 'text', or 'prompt' and 'response'; "
                f"found keys: {keys}"
            )
    return docs


def _read_csv(path: Path, text: str) -> list[Document]:
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames or "text" not in reader.fieldnames:
        raise DataError(f"{path}:1: expected a 'text' column; header is {reader.fieldnames}")
    docs = []
    for number, row in enumerate(reader, start=2):
        value = row.get("text")
        if value is None:
            raise DataError(f"{path}:{number}: row has no 'text' value")
        if value.strip():
            docs.append(Document(text=value))
    return docs


READERS = {".txt": _read_txt, ".jsonl": _read_jsonl, ".csv": _read_csv}


def load_documents(path: str | Path) -> list[Document]:
    """Reads documents from a .txt, .jsonl or .csv file.

    Raises:
        DataError: naming the file (and line) when it is missing, empty, not UTF-8 or malformed.
    """
    path = Path(path)
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise DataError(f"{path}: unsupported extension '{path.suffix}'; use .txt, .jsonl or .csv")
    docs = reader(path, _read_text(path))
    if not docs:
        raise DataError(f"{path}: no documents found")
    return docs


def split_documents(
    docs: list[Document], eval_fraction: float, seed: int
) -> tuple[list[Document], list[Document]]:
    """Splits into (train, held-out eval) reproducibly from the seed; eval gets at least 1."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_eval = max(1, round(len(docs) * eval_fraction)) if len(docs) > 1 else 0
    eval_ids = set(order[:n_eval])
    train = [d for i, d in enumerate(docs) if i not in eval_ids]
    held_out = [d for i, d in enumerate(docs) if i in eval_ids]
    return train, held_out


def tokenize_documents(docs: list[Document], tokenizer, max_seq_len: int) -> list[TokenizedSample]:
    """Tokenizes documents (BOS + prompt + text + EOS), truncated to max_seq_len tokens.

    Prompt tokens get IGNORE_INDEX labels so the loss is on the response only.
    """
    if not docs:  # e.g. eval_fraction 0: the fast tokenizer fails on an empty batch
        return []
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    texts = tokenizer([d.text for d in docs], add_special_tokens=False, verbose=False)["input_ids"]
    prompts = tokenizer([d.prompt for d in docs], add_special_tokens=False, verbose=False)["input_ids"]
    samples = []
    for prompt_ids, text_ids in zip(prompts, texts):
        ids = (bos + prompt_ids + text_ids + eos)[:max_seq_len]
        n_context = min(len(bos) + len(prompt_ids), len(ids))
        labels = [IGNORE_INDEX] * n_context + ids[n_context:]
        if len(ids) >= 2:
            samples.append(TokenizedSample(ids, labels))
    return samples
