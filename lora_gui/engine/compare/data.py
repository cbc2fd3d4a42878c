"""The data one comparison trains on: the same samples for every mode, written as a .jsonl file.

- ``corpus``: real documents of the run's data file, truncated at the length (what users have);
- ``full``: documents concatenated until every sample fills the length (no padding anywhere), which
  isolates the attention, checkpointing and loss optimizations from padding savings.

Every mode of a comparison trains one epoch over exactly these training samples, and evaluates on
exactly these held-out samples: the file is laid out so that the engine's own seeded train/eval
split (:func:`lora_gui.data.text.split_documents`) puts the chosen held-out documents where it
looks for them, so no engine change is needed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from lora_gui.config import ConfigError, RunConfig
from lora_gui.data.text import Document, load_documents, split_documents, tokenize_documents
from lora_gui.engine.core.checkpoint import write_atomic

DATA_KINDS = ("corpus", "full")


@dataclass(frozen=True)
class CompareData:
    """A prepared data file and the eval_fraction that makes the engine hold out ``n_eval`` of it."""

    path: Path
    n_train: int
    n_eval: int
    eval_fraction: float


def _full_blocks(docs: list[Document], tokenizer, seq_len: int, limit: int) -> list[Document]:
    """Consecutive documents joined until each block tokenizes to at least ``seq_len`` tokens."""
    texts = [f"{d.prompt} {d.text}".strip() for d in docs]
    lengths = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    blocks, current, count = [], [], 0
    for text, ids in zip(texts, lengths):
        current.append(text)
        count += len(ids) + 2  # separators: a little slack, checked below
        if count >= seq_len + 8:
            blocks.append(Document("\n\n".join(current)))
            current, count = [], 0
            if len(blocks) >= limit:
                break
    tokenized = tokenize_documents(blocks, tokenizer, seq_len)
    return [b for b, t in zip(blocks, tokenized) if len(t) == seq_len]


def _layout(train: list[Document], held_out: list[Document], seed: int) -> tuple[list[Document], float]:
    """Orders documents so that ``split_documents(docs, fraction, seed)`` holds out ``held_out``."""
    total = len(train) + len(held_out)
    fraction = len(held_out) / total
    order = list(range(total))
    random.Random(seed).shuffle(order)  # the same permutation split_documents draws
    eval_slots = set(order[: max(1, round(total * fraction))])
    if len(eval_slots) != len(held_out):
        raise AssertionError(f"eval split {len(eval_slots)} != {len(held_out)}")  # arithmetic guard
    train_iter, eval_iter = iter(train), iter(held_out)
    docs = [next(eval_iter) if i in eval_slots else next(train_iter) for i in range(total)]
    return docs, fraction


def _write_jsonl(path: Path, docs: list[Document]) -> None:
    lines = [json.dumps({"prompt": d.prompt, "response": d.text} if d.prompt else {"text": d.text})
             for d in docs]
    write_atomic(path, "\n".join(lines) + "\n")


def prepare_data(cfg: RunConfig, kind: str, seq_len: int, n_train: int, n_eval: int, folder: Path,
                 tokenizer) -> CompareData:
    """Writes ``folder/<kind>-<seq_len>-<n_train>.jsonl`` with n_train training and n_eval held-out samples.

    Raises:
        ConfigError: unknown kind, or the data file holds too few documents / tokens (the message
            says how many are needed).
    """
    if kind not in DATA_KINDS:
        raise ConfigError(f"data kind {kind!r} is not one of {', '.join(DATA_KINDS)}")
    docs = load_documents(cfg.data_path())
    train_docs, eval_docs = split_documents(docs, cfg.eval_fraction, cfg.seed)
    random.Random(cfg.seed).shuffle(train_docs)
    if kind == "full":
        train_docs = _full_blocks(train_docs, tokenizer, seq_len, n_train)
        eval_docs = _full_blocks(eval_docs, tokenizer, seq_len, n_eval)
    if len(train_docs) < n_train:
        what = f"full {seq_len}-token samples" if kind == "full" else "training documents"
        raise ConfigError(f"data: {cfg.data_path()} gives {len(train_docs)} {what}; the comparison "
                          f"needs {n_train} (steps x batch_size): lower --steps or batch_size")
    eval_docs = eval_docs[: max(1, min(n_eval, len(eval_docs), n_train))]
    if not eval_docs:
        raise ConfigError(f"data: {cfg.data_path()} leaves no held-out {kind} sample of {seq_len} "
                          "tokens for eval_loss; raise eval_fraction or use more data")
    docs, fraction = _layout(train_docs[:n_train], eval_docs, cfg.seed)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}-{seq_len}-{n_train}.jsonl"
    _write_jsonl(path, docs)
    return CompareData(path, n_train, len(eval_docs), fraction)


def data_stats(cfg: RunConfig, kind: str, seq_len: int, tokenizer) -> tuple[int, int]:
    """(median training-sample length in tokens, number of training samples available) for this
    kind of data at this length (``full`` samples fill the length)."""
    train_docs, _ = split_documents(load_documents(cfg.data_path()), cfg.eval_fraction, cfg.seed)
    if kind == "full":
        return seq_len, len(_full_blocks(train_docs, tokenizer, seq_len, len(train_docs)))
    lengths = sorted(len(s) for s in tokenize_documents(train_docs, tokenizer, seq_len))
    return (lengths[len(lengths) // 2] if lengths else seq_len), len(lengths)
