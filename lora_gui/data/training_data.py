"""The text run's training data in any supported format: documents (plain text, prompt +
response) or conversations (messages, ShareGPT, Alpaca) through the model's chat template."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from lora_gui.data.chat import CHAT_FORMATS, read_data
from lora_gui.data.chat_template import ensure_chat_template, tokenize_conversations
from lora_gui.data.records import is_record_source
from lora_gui.data.text import DataError, TokenizedSample, load_documents, split_documents, tokenize_documents

log = logging.getLogger(__name__)


@dataclass
class LoadedSamples:
    """Tokenized train and held-out samples, the format read and the tokens the template added."""

    train: list[TokenizedSample]
    held_out: list[TokenizedSample]
    data_format: str
    added_tokens: list[str] = field(default_factory=list)

    @property
    def is_chat(self) -> bool:
        return self.data_format in CHAT_FORMATS


def _read(path: Path, data_format: str) -> tuple[str, list]:
    if path.suffix.lower() == ".txt" and not path.is_dir():
        if data_format not in ("auto", "text"):
            raise DataError(f"data_format: {data_format!r} does not match {path} (a .txt file holds "
                            "plain text documents; use data_format=text or auto)")
        return "text", load_documents(path)
    if not path.exists() or is_record_source(path):
        return read_data(path, data_format)
    return "text", load_documents(path)  # names the unsupported extension


def load_samples(path: str | Path, tokenizer, *, data_format: str, max_seq_len: int, eval_fraction: float,
                 seed: int, chat_template: str = "auto", train_on_prompt: bool = False) -> LoadedSamples:
    """Reads, splits (seeded) and tokenizes the data; chat formats give the tokenizer a template.

    Raises:
        DataError: naming the file (and line) of bad data, or a format that does not match it.
    """
    path = Path(path)
    fmt, items = _read(path, data_format)
    log.info("%s: %d %s records (%s)", path, len(items), fmt,
             "conversations" if fmt in CHAT_FORMATS else "documents")
    train_items, eval_items = split_documents(items, eval_fraction, seed)
    if fmt not in CHAT_FORMATS:
        if train_on_prompt:
            log.warning("train_on_prompt applies to conversations; %s is %s data", path, fmt)
        return LoadedSamples(tokenize_documents(train_items, tokenizer, max_seq_len),
                             tokenize_documents(eval_items, tokenizer, max_seq_len), fmt)
    added = ensure_chat_template(tokenizer, chat_template)
    return LoadedSamples(tokenize_conversations(tokenizer, train_items, max_seq_len, train_on_prompt),
                         tokenize_conversations(tokenizer, eval_items, max_seq_len, train_on_prompt),
                         fmt, added)
