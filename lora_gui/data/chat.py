"""Instruction and chat data: which format a file holds, and its records as conversations.

Formats (``data_format`` forces one; ``auto`` detects it from the first record and logs it):

- ``messages``: ``{"messages": [{"role": "system" | "user" | "assistant", "content": ...}]}``
  (OpenAI style; a ``tools`` field is ignored with a warning);
- ``sharegpt``: ``{"conversations": [{"from": "human" | "gpt" | "system", "value": ...}]}``;
- ``alpaca``: ``instruction``, optional ``input``, ``output``, optional ``system``;
- ``prompt_response`` and ``text``: plain documents, trained as before (no chat template).

The first three are conversations: they go through the model's chat template
(:mod:`lora_gui.data.chat_template`) with the loss on the assistant turns only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lora_gui.data.records import Record, read_records
from lora_gui.data.text import DataError, Document

log = logging.getLogger(__name__)

CHAT_FORMATS = ("messages", "sharegpt", "alpaca")
DATA_FORMATS = ("auto", *CHAT_FORMATS, "prompt_response", "text")
ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant",
                  "bard": "assistant"}
FORMAT_KEYS = {"messages": ("messages",), "sharegpt": ("conversations",),
               "alpaca": ("instruction", "output"), "prompt_response": ("prompt", "response"),
               "text": ("text",)}


@dataclass(frozen=True)
class Conversation:
    """One conversation: ``messages`` as [{"role", "content"}], and its file and line."""

    messages: list[dict[str, str]]
    where: str


def detect_format(record: Record) -> str:
    """The format whose keys the record has (messages, sharegpt, alpaca, prompt_response, text)."""
    for name, keys in FORMAT_KEYS.items():
        if all(key in record.values for key in keys):
            return name
    keys = ", ".join(sorted(record.values)) or "none"
    raise DataError(f"{record.where}: cannot tell the data format from the keys ({keys}); expected "
                    "'messages', 'conversations' (ShareGPT), 'instruction' + 'output' (Alpaca), "
                    "'prompt' + 'response' or 'text'")


def _text(value: Any, where: str, what: str) -> str:
    if value is None:  # a null in a parquet / save_to_disk table
        raise DataError(f"{where}: no value for {what} (it is empty)")
    if not isinstance(value, str):
        raise DataError(f"{where}: {what} must be text, got {type(value).__name__}")
    return value


def _turns(value: Any, where: str, field: str) -> list[Any]:
    if not isinstance(value, list | tuple) or not value:
        raise DataError(f"{where}: '{field}' must be a non-empty list of turns")
    return list(value)


def _messages(record: Record) -> list[dict[str, str]]:
    out = []
    for i, turn in enumerate(_turns(record.values["messages"], record.where, "messages"), start=1):
        if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
            raise DataError(f"{record.where}: message {i} needs 'role' and 'content'")
        role = turn["role"]
        if role not in ROLES:
            raise DataError(f"{record.where}: message {i} has unknown role {role!r}; "
                            f"use {', '.join(ROLES)}")
        out.append({"role": role, "content": _text(turn["content"], record.where, f"message {i} content")})
    return out


def _sharegpt(record: Record) -> list[dict[str, str]]:
    out = []
    for i, turn in enumerate(_turns(record.values["conversations"], record.where, "conversations"), 1):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            raise DataError(f"{record.where}: turn {i} needs 'from' and 'value'")
        role = SHAREGPT_ROLES.get(str(turn["from"]).lower())
        if role is None:
            raise DataError(f"{record.where}: turn {i} has unknown 'from' {turn['from']!r}; "
                            "use system, human or gpt")
        out.append({"role": role, "content": _text(turn["value"], record.where, f"turn {i} value")})
    return out


def _alpaca(record: Record) -> list[dict[str, str]]:
    values, where = record.values, record.where
    prompt = _text(values["instruction"], where, "'instruction'")
    extra = values.get("input") or ""
    if _text(extra, where, "'input'").strip():
        prompt = f"{prompt}\n\n{extra}"
    messages = [{"role": "user", "content": prompt},
                {"role": "assistant", "content": _text(values["output"], where, "'output'")}]
    system = values.get("system")
    if system:
        messages.insert(0, {"role": "system", "content": _text(system, where, "'system'")})
    return messages


def _check_conversation(messages: list[dict[str, str]], where: str) -> None:
    answers = [m for m in messages if m["role"] == "assistant"]
    if not answers:
        raise DataError(f"{where}: the conversation has no assistant turn (nothing to train on)")
    for i, message in enumerate(messages, start=1):
        if message["role"] == "assistant" and not message["content"].strip():
            raise DataError(f"{where}: assistant turn (message {i}) is empty")


def to_conversation(record: Record, data_format: str) -> Conversation:
    """One record of a chat format as a checked Conversation (roles known, answers non-empty)."""
    messages = {"messages": _messages, "sharegpt": _sharegpt, "alpaca": _alpaca}[data_format](record)
    _check_conversation(messages, record.where)
    return Conversation(messages, record.where)


def to_document(record: Record, data_format: str) -> Document:
    """One record of the ``text`` or ``prompt_response`` format as a Document."""
    values, where = record.values, record.where
    if data_format == "text":
        return Document(text=_text(values["text"], where, "'text'"))
    return Document(text=_text(values["response"], where, "'response'"),
                    prompt=_text(values["prompt"], where, "'prompt'"))


def read_data(path: str | Path, data_format: str = "auto") -> tuple[str, list[Conversation] | list[Document]]:
    """Reads a record file as conversations (chat formats) or documents (text formats).

    Args:
        path: a .jsonl, .json, .csv, .parquet file or a datasets ``save_to_disk`` folder.
        data_format: one of DATA_FORMATS; ``auto`` detects it from the first record.

    Returns:
        (the format, its conversations or documents).

    Raises:
        DataError: naming the file and line of the first record that does not fit.
    """
    records = read_records(path)
    detected = detect_format(records[0])
    fmt = detected if data_format == "auto" else data_format
    if data_format == "auto":
        log.info("%s: data format %s (detected from %s)", path, fmt, records[0].where)
    if any(k in records[0].values for k in ("tools",)) and fmt == "messages":
        log.warning("%s: the 'tools' field is ignored (tool calls are not trained)", path)
    for record in records:
        missing = [k for k in FORMAT_KEYS[fmt] if k not in record.values]
        if missing:
            keys = ", ".join(sorted(record.values)) or "none"
            where = f"data_format: {data_format!r} does not match {record.where}" if data_format != "auto" \
                else f"{record.where}: this record is not in the {fmt} format of the first record"
            raise DataError(f"{where} (missing {', '.join(missing)}; found keys: {keys})")
    if fmt in CHAT_FORMATS:
        return fmt, [to_conversation(r, fmt) for r in records]
    docs = [to_document(r, fmt) for r in records]
    return fmt, [d for d in docs if d.text.strip()]
