"""Builds the bundled preference demo set assets/pairs/demo.jsonl (run once; the output is
committed): ``python -m lora_gui.data.build_pairs_demo``.

Source: the bundled chat demo (assets/chat/demo.jsonl, from the ChatterBot corpus, BSD 3-Clause;
see :mod:`lora_gui.data.build_chat_demo`). Each dialog's first question becomes a prompt; the
rejected answer is the corpus answer as it is, the chosen one is the same answer in a style the
base model never saw: it opens with "Happy to help!" and ends with "Anything else?". After
preference tuning the model answers in that style (visible in the Try tab), and held-out pairs
measure how often it prefers it. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from lora_gui.config import ASSETS

log = logging.getLogger(__name__)
SOURCE = ASSETS / "chat" / "demo.jsonl"
OUT = ASSETS / "pairs" / "demo.jsonl"
MAX_ANSWER_CHARS = 120  # short rows: a few minutes of training on 2 CPU cores
MAX_PAIRS = 400
OPENING, CLOSING = "Happy to help!", "Anything else?"
LICENCE_HEAD = """The preference demo set (demo.jsonl) is built by `python -m lora_gui.data.build_pairs_demo`
from the bundled chat demo set (../chat/demo.jsonl): each rejected answer is an answer of the
ChatterBot Language Training Corpus as it is, each chosen answer the same text opened with
"{opening}" and closed with "{closing}". The corpus' licence follows.

"""


def pair_records(source: Path = SOURCE, limit: int = MAX_PAIRS) -> list[dict]:
    """One prompt / chosen / rejected record per distinct first question of the chat demo."""
    records, seen = [], set()
    for line in source.read_text(encoding="utf-8").splitlines():
        messages = json.loads(line)["messages"]
        turns = [m for m in messages if m["role"] != "system"]
        if len(turns) < 2 or turns[0]["role"] != "user":
            continue
        question, answer = turns[0]["content"].strip(), turns[1]["content"].strip()
        if question.lower() in seen or len(answer) > MAX_ANSWER_CHARS or not answer:
            continue
        seen.add(question.lower())
        records.append({"prompt": question, "chosen": f"{OPENING} {answer} {CLOSING}",
                        "rejected": answer})
        if len(records) == limit:
            break
    return records


def build(out: Path = OUT) -> int:
    """Writes out (jsonl) and LICENSE.md next to it; returns the number of pairs."""
    records = pair_records()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    licence = (SOURCE.parent / "LICENSE.md").read_text(encoding="utf-8")
    (out.parent / "LICENSE.md").write_text(
        LICENCE_HEAD.format(opening=OPENING, closing=CLOSING) + licence, encoding="utf-8")
    return len(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    log.info("%d pairs -> %s", build(args.out), args.out)


if __name__ == "__main__":
    main()
