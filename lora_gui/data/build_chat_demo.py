"""Builds the bundled chat demo set assets/chat/demo.jsonl (run once; the output is committed).

Source: the English part of the ChatterBot dialog corpus (PyPI package ``chatterbot-corpus``
1.3.3, BSD 3-Clause licence, (c) Gunther Cox), real hand-written question / answer dialogs on
science, history, trivia, computers, humor and more. Get it without installing it:

    pip download chatterbot-corpus==1.3.3 --no-deps -d /tmp/cc && unzip -o /tmp/cc/*.whl -d /tmp/cc
    python -m lora_gui.data.build_chat_demo --source /tmp/cc/chatterbot_corpus/data/english

Each dialog becomes one ``messages`` record (user and assistant turns alternating, a short
system prompt naming the topic). Nothing is downloaded at run time.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import yaml

from lora_gui.config import ASSETS

log = logging.getLogger(__name__)
OUT = ASSETS / "chat" / "demo.jsonl"
MAX_ANSWER_CHARS = 400  # keeps rows short enough for a 2-core demo (a few long tech answers go)
LICENCE = """The chat demo set (demo.jsonl) is built by `python -m lora_gui.data.build_chat_demo` from the
English dialogs of the ChatterBot Language Training Corpus, PyPI package chatterbot-corpus 1.3.3
(https://github.com/gunthercox/chatterbot-corpus), distributed under the BSD 3-Clause licence:

Copyright (c) 2016, Gunther Cox. All rights reserved.

Redistribution and use in source and binary forms, with or without modification, are permitted
provided that the following conditions are met:
* Redistributions of source code must retain the above copyright notice, this list of
  conditions and the following disclaimer.
* Redistributions in binary form must reproduce the above copyright notice, this list of
  conditions and the following disclaimer in the documentation and/or other materials provided
  with the distribution.
* Neither the name of ChatterBot nor the names of its contributors may be used to endorse or
  promote products derived from this software without specific prior written permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS" AND ANY EXPRESS OR
IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE IMPLIED WARRANTIES OF MERCHANTABILITY AND
FITNESS FOR A PARTICULAR PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR
CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE,
DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY OF LIABILITY,
WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY
WAY OUT OF THE USE OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
"""


def dialog_records(path: Path) -> list[dict]:
    """One ``messages`` record per dialog of a corpus YAML file (odd turns user, even assistant)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    topic = (data.get("categories") or [path.stem])[0]
    records = []
    for dialog in data.get("conversations") or []:
        turns = [str(t).strip() for t in dialog if t is not None and str(t).strip()]
        turns = turns[: len(turns) // 2 * 2]  # end on an answer
        if not turns or any(len(t) > MAX_ANSWER_CHARS for t in turns):
            continue
        messages = [{"role": "system", "content": f"You are a friendly assistant. Topic: {topic}."}]
        messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
                     for i, t in enumerate(turns)]
        records.append({"messages": messages})
    return records


def build(source: Path, out: Path = OUT) -> int:
    """Writes out (jsonl) and LICENSE.md next to it; returns the number of dialogs."""
    records = [r for path in sorted(source.glob("*.yml")) for r in dialog_records(path)]
    if not records:
        raise SystemExit(f"{source}: no corpus .yml files with dialogs found")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    (out.parent / "LICENSE.md").write_text(LICENCE, encoding="utf-8")
    return len(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True,
                        help="chatterbot_corpus/data/english of the unpacked chatterbot-corpus wheel")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    log.info("%d dialogs -> %s", build(args.source, args.out), args.out)


if __name__ == "__main__":
    main()
