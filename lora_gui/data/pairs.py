"""Preference pairs: a prompt with a chosen and a rejected answer, tokenized through the model's
chat template with the loss on the final answer's tokens only.

Layouts (any file :mod:`lora_gui.data.records` reads: .jsonl, .json, .csv, .parquet, a
``save_to_disk`` folder):

- ``prompt``, ``chosen``, ``rejected`` as strings (the prompt is one user turn);
- ``chosen`` and ``rejected`` as message lists that share every turn but the last assistant
  answer (UltraFeedback's layout; a ``prompt`` field beside them is ignored), or a ``prompt``
  message list with one-answer ``chosen`` / ``rejected`` lists (TRL's conversational layout).

Bad pairs stop the run before anything is written, naming the file and line: a missing or empty
answer, chosen equal to rejected, two message lists whose prompts differ. A pair longer than
``max_seq_len`` is skipped and counted, or its prompt is cut from the start (``long_pairs``); an
answer is never cut.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lora_gui.data.chat import ROLES, Conversation
from lora_gui.data.chat_template import ensure_chat_template, tokenize_conversation
from lora_gui.data.records import Record, read_records
from lora_gui.data.text import IGNORE_INDEX, DataError, TokenizedSample, split_documents

log = logging.getLogger(__name__)
NO_LIMIT = 1 << 30  # tokenize whole, then apply max_seq_len as long_pairs says


@dataclass(frozen=True)
class Pair:
    """One pair as messages: the shared prompt turns and the two final answers."""

    prompt: list[dict[str, str]]
    chosen: str
    rejected: str
    where: str


@dataclass(frozen=True)
class PairSample:
    """A tokenized pair: two rows that run in the same micro-batch (chosen first).

    ``len()`` is the longer row (what the batch is padded to); ``input_ids`` / ``labels`` are the
    chosen row's, for helpers that look at one sequence (the CPU precision probe). A pair is one
    loss term: ``targets_within`` counts it once (the step's loss is the mean over its pairs).
    """

    chosen: TokenizedSample
    rejected: TokenizedSample
    where: str = ""

    def __len__(self) -> int:
        return max(len(self.chosen), len(self.rejected))

    @property
    def shortest(self) -> int:
        return min(len(self.chosen), len(self.rejected))

    @property
    def input_ids(self) -> list[int]:
        return self.chosen.input_ids

    @property
    def labels(self) -> list[int]:
        return self.chosen.labels

    def targets_within(self, length: int) -> int:  # noqa: ARG002 (the batching API)
        return 1


@dataclass
class LoadedPairs:
    """Tokenized train and held-out pairs, the tokens the template added, the pairs skipped."""

    train: list[PairSample]
    held_out: list[PairSample]
    added_tokens: list[str] = field(default_factory=list)
    skipped: int = 0


def _answer(value: Any, where: str, name: str) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DataError(f"{where}: the {name} answer is missing or empty")
    if not isinstance(value, str):
        raise DataError(f"{where}: the {name} answer must be text or a list of messages, "
                        f"got {type(value).__name__}")
    return value


def _message_list(value: Any, where: str, name: str) -> list[dict[str, str]]:
    if isinstance(value, str) and value.lstrip().startswith("[{"):  # a CSV cell holding JSON
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: '{name}' is not valid JSON ({err.msg})") from None
    if not isinstance(value, list | tuple) or not value:
        raise DataError(f"{where}: '{name}' must be a non-empty list of messages")
    out = []
    for i, turn in enumerate(value, start=1):
        if not isinstance(turn, dict) or turn.get("role") not in ROLES or "content" not in turn:
            raise DataError(f"{where}: '{name}' message {i} needs a role ({', '.join(ROLES)}) and content")
        content = turn["content"]
        if not isinstance(content, str):
            raise DataError(f"{where}: '{name}' message {i} content must be text")
        out.append({"role": turn["role"], "content": content})
    return out


def _is_messages(value: Any) -> bool:
    return isinstance(value, list | tuple) or (isinstance(value, str) and value.lstrip().startswith("[{"))


def to_pair(record: Record) -> Pair:
    """One record as a checked :class:`Pair` (see the module docstring for the layouts)."""
    values, where = record.values, record.where
    for name in ("chosen", "rejected"):
        if name not in values:
            keys = ", ".join(sorted(values)) or "none"
            raise DataError(f"{where}: no '{name}' answer (found keys: {keys}); preference data "
                            "needs prompt, chosen and rejected")
    chosen, rejected = values["chosen"], values["rejected"]
    if _is_messages(chosen) or _is_messages(rejected):
        c, r = _message_list(chosen, where, "chosen"), _message_list(rejected, where, "rejected")
        for name, turns in (("chosen", c), ("rejected", r)):
            if turns[-1]["role"] != "assistant":
                raise DataError(f"{where}: '{name}' must end with the assistant's answer")
        if c[:-1] != r[:-1]:
            turn = next((i for i, (a, b) in enumerate(zip(c, r), 1) if a != b), min(len(c), len(r)))
            raise DataError(f"{where}: the prompt differs between the chosen and rejected message "
                            f"lists (message {turn}); both must share every turn but the last answer")
        prompt = c[:-1]
        if not prompt:
            raw = values.get("prompt")
            prompt = _message_list(raw, where, "prompt") if _is_messages(raw) else \
                [{"role": "user", "content": _answer(raw, where, "prompt")}]
        chosen, rejected = c[-1]["content"], r[-1]["content"]
    else:
        raw = values.get("prompt")
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            raise DataError(f"{where}: the prompt is missing or empty")
        prompt = _message_list(raw, where, "prompt") if _is_messages(raw) else \
            [{"role": "user", "content": _answer(raw, where, "prompt")}]
    chosen, rejected = _answer(chosen, where, "chosen"), _answer(rejected, where, "rejected")
    if chosen.strip() == rejected.strip():
        raise DataError(f"{where}: the chosen and rejected answers are the same; a pair needs two "
                        "different answers")
    return Pair(prompt, chosen, rejected, where)


def _last_answer_only(sample: TokenizedSample) -> tuple[list[int], list[int], int]:
    """(ids, labels with the loss on the final answer only, where that answer starts)."""
    labels = list(sample.labels)
    end = max(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
    start = end
    while start > 0 and labels[start - 1] != IGNORE_INDEX:
        start -= 1
    labels[:start] = [IGNORE_INDEX] * start
    return list(sample.input_ids), labels, start


def tokenize_pair(tokenizer, pair: Pair, max_seq_len: int, long_pairs: str = "skip") -> PairSample | None:
    """Both rows of a pair; None when it is longer than ``max_seq_len`` and cannot be fitted
    (``skip``, or a prompt too short to cut under ``truncate_prompt``)."""
    rows = []
    for answer in (pair.chosen, pair.rejected):
        conv = Conversation([*pair.prompt, {"role": "assistant", "content": answer}], pair.where)
        sample = tokenize_conversation(tokenizer, conv, NO_LIMIT)
        if sample is None:
            raise DataError(f"{pair.where}: no answer token found after applying the chat template")
        rows.append(_last_answer_only(sample))
    longest = max(len(ids) for ids, _, _ in rows)
    if longest > max_seq_len:
        cut = longest - max_seq_len
        if long_pairs != "truncate_prompt" or cut >= min(start for _, _, start in rows):
            return None  # keeps at least one prompt token before each answer
        rows = [(ids[cut:], labels[cut:], start - cut) for ids, labels, start in rows]
    chosen, rejected = (TokenizedSample(ids, labels) for ids, labels, _ in rows)
    return PairSample(chosen, rejected, pair.where)


def read_pairs(path: str | Path) -> list[Pair]:
    """Every record of a pairs file, checked (file and line named on the first bad one)."""
    return [to_pair(r) for r in read_records(path)]


def tokenize_pairs(tokenizer, pairs: list[Pair], max_seq_len: int,
                   long_pairs: str = "skip") -> tuple[list[PairSample], list[str]]:
    """Tokenized pairs and where each skipped one was (longer than ``max_seq_len``)."""
    kept, skipped = [], []
    for pair in pairs:
        sample = tokenize_pair(tokenizer, pair, max_seq_len, long_pairs)
        if sample is None:
            skipped.append(pair.where)
        else:
            kept.append(sample)
    return kept, skipped


def load_pairs(path: str | Path, tokenizer, *, max_seq_len: int, eval_fraction: float, seed: int,
               chat_template: str = "auto", long_pairs: str = "skip") -> LoadedPairs:
    """Reads, checks, splits (seeded) and tokenizes preference pairs.

    Raises:
        DataError: a bad pair (file and line), or no pair left within ``max_seq_len``.
    """
    pairs = read_pairs(path)
    added = ensure_chat_template(tokenizer, chat_template)
    train_pairs, eval_pairs = split_documents(pairs, eval_fraction, seed)
    train, skipped = tokenize_pairs(tokenizer, train_pairs, max_seq_len, long_pairs)
    held_out, skipped_eval = tokenize_pairs(tokenizer, eval_pairs, max_seq_len, long_pairs)
    skipped += skipped_eval
    if skipped:
        log.warning("%s: %d of %d pairs skipped, longer than max_seq_len=%d (first: %s); set "
                    "long_pairs: truncate_prompt to cut their prompts instead", path, len(skipped),
                    len(pairs), max_seq_len, skipped[0])
    if not train:
        raise DataError(f"{path}: no pair fits max_seq_len={max_seq_len} tokens"
                        + (f" ({len(skipped)} skipped, first: {skipped[0]})" if skipped else ""))
    log.info("%s: %d training pairs, %d held out", path, len(train), len(held_out))
    return LoadedPairs(train, held_out, added, len(skipped))
