"""Chat templates and answer-only loss masks.

A conversation is rendered with the tokenizer's own chat template (``apply_chat_template``); a
tokenizer without one gets the named ChatML default (with a warning; it is saved with the
adapter's tokenizer files). The loss is taken on every assistant turn and its end-of-turn token:

- a template with ``{% generation %}`` blocks: transformers' ``return_assistant_tokens_mask``;
- any other template: the conversation is rendered prefix by prefix (up to each answer with the
  generation prompt, then up to its end), the answer's characters (its content and the
  end-of-turn marker that follows it) are located in the full rendering, and tokens are masked by
  their character offsets.

``train_on_prompt`` trains every token instead.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from lora_gui.data.chat import Conversation
from lora_gui.data.text import IGNORE_INDEX, DataError, TokenizedSample

log = logging.getLogger(__name__)

CHATML_START, CHATML_END = "<|im_start|>", "<|im_end|>"
# ChatML with {% generation %} around each answer and its end of turn (assistant masks).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")


def ensure_chat_template(tokenizer, choice: str = "auto") -> list[str]:
    """Gives the tokenizer a chat template: its own (``auto``), or ChatML when it has none or
    when ``choice`` is ``chatml``. Returns the special tokens added to its vocabulary (the model's
    embeddings must grow by as many rows, and those rows must be trained)."""
    if choice == "auto" and tokenizer.chat_template:
        return []
    if choice == "auto":
        log.warning("the model's tokenizer has no chat template: using ChatML (%s ... %s); it is "
                    "saved with the adapter's tokenizer files", CHATML_START, CHATML_END)
    tokenizer.chat_template = CHATML_TEMPLATE
    vocab = tokenizer.get_vocab()
    new = [t for t in (CHATML_START, CHATML_END) if t not in vocab]
    if new:
        tokenizer.add_special_tokens({"additional_special_tokens": new})
    return new


def end_of_turn_ids(tokenizer) -> list[int]:
    """Token ids that end an answer when generating (eos and the template's end-of-turn tokens)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for token in (CHATML_END, "<|eot_id|>", "<|end|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and token in tokenizer.get_vocab():
            ids.add(tid)
    return sorted(ids)


def _render(tokenizer, messages: list[dict[str, str]], where: str, **kwargs) -> str:
    from jinja2.exceptions import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except TemplateError as err:
        raise DataError(f"{where}: the chat template rejected this conversation: {err}") from None


def _answer_spans(tokenizer, conv: Conversation, full: str) -> list[tuple[int, int]]:
    """Character ranges of each answer's content plus its end-of-turn marker in ``full``."""
    spans = []
    for i, message in enumerate(conv.messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, conv.messages[:i], conv.where, add_generation_prompt=True) if i else ""
        after = _render(tokenizer, conv.messages[: i + 1], conv.where)
        if not (full.startswith(before) and full.startswith(after) and after.startswith(before)):
            raise DataError(f"{conv.where}: the chat template renders this conversation differently "
                            "prefix by prefix, so its answers cannot be located; use a template "
                            "with {% generation %} blocks or train_on_prompt=true")
        turn = after[len(before):]
        offset = turn.find(message["content"])
        if offset < 0:
            raise DataError(f"{conv.where}: the chat template changes the text of answer "
                            f"(message {i + 1}), so it cannot be located")
        start = len(before) + offset
        end = start + len(message["content"])
        end += len(after[end:].rstrip())  # the end-of-turn marker, not the newline after it
        spans.append((start, end))
    return spans


def _mask_by_offsets(tokenizer, conv: Conversation, full: str) -> tuple[list[int], list[bool]]:
    spans = _answer_spans(tokenizer, conv, full)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    trained = [any(s < span_end and e > span_start for span_start, span_end in spans) and e > s
               for s, e in enc["offset_mapping"]]
    return enc["input_ids"], trained


def _mask_by_generation(tokenizer, conv: Conversation) -> tuple[list[int], list[bool]]:
    from jinja2.exceptions import TemplateError

    try:
        enc = tokenizer.apply_chat_template(conv.messages, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
    except TemplateError as err:
        raise DataError(f"{conv.where}: the chat template rejected this conversation: {err}") from None
    return list(enc["input_ids"]), [bool(m) for m in enc["assistant_masks"]]


def tokenize_conversation(tokenizer, conv: Conversation, max_seq_len: int,
                          train_on_prompt: bool = False) -> TokenizedSample | None:
    """Token ids and labels of one conversation (loss on the answers and their end of turn).

    Returns None when truncation to ``max_seq_len`` leaves no trained token.

    Raises:
        DataError: the template rejects the conversation or renders nothing (file and line).
    """
    full = _render(tokenizer, conv.messages, conv.where)
    if not full.strip():
        raise DataError(f"{conv.where}: the chat template renders this conversation as empty text")
    if GENERATION_BLOCK.search(tokenizer.chat_template or ""):
        ids, trained = _mask_by_generation(tokenizer, conv)
    else:
        ids, trained = _mask_by_offsets(tokenizer, conv, full)
    if not any(trained):
        raise DataError(f"{conv.where}: no answer token found after applying the chat template")
    labels = [t if (train_on_prompt or keep) else IGNORE_INDEX for t, keep in zip(ids, trained)]
    ids, labels = ids[:max_seq_len], labels[:max_seq_len]
    if len(ids) < 2 or all(label == IGNORE_INDEX for label in labels[1:]):
        return None
    return TokenizedSample(ids, labels)


def tokenize_conversations(tokenizer, convs: Sequence[Conversation], max_seq_len: int,
                           train_on_prompt: bool = False) -> list[TokenizedSample]:
    """Tokenizes conversations; those whose answers fall past max_seq_len are dropped (logged)."""
    samples = [tokenize_conversation(tokenizer, c, max_seq_len, train_on_prompt) for c in convs]
    kept = [s for s in samples if s is not None]
    if len(kept) < len(samples):
        log.warning("%d of %d conversations dropped: no answer token within max_seq_len=%d",
                    len(samples) - len(kept), len(samples), max_seq_len)
    return kept
