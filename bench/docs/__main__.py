"""``python -m bench.docs``: writes every page of figures in docs/results/ (and the README's
figures at a glance) from the results in bench/results/; ``--check`` writes nothing and exits 1
when a committed page differs from what the results make, or when a results file does not record
the commit and the planner fingerprint that made it.

A page is its template in ``bench/docs/pages/`` with each ``{{table NAME}}`` replaced by the
table in ``bench/results/tables/NAME.json``, ``{{longest}}`` by the long-context table made from
``bench/results/gpu_plans.json``. Prose lives in the templates; figures come from the results.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from bench.docs import meta, render

PAGES = Path(__file__).resolve().parent / "pages"
OUT = meta.ROOT / "docs" / "results"
README = meta.ROOT / "README.md"
MAX_LINES = 400  # a page longer than this is split, not grown
_HEAD = ("<!-- Written by `python -m bench.docs` from bench/results/; edit bench/docs/pages/{name} "
         "and the results, not this file. -->\n\n")
_FIGURES = re.compile(r"(<!-- figures:start[^\n]*-->\n).*?(<!-- figures:end -->)", re.S)


def page(template: Path) -> str:
    """One page: the template with its placeholders filled from the results."""
    def fill(match: re.Match[str]) -> str:
        kind, _, arg = match.group(1).partition(" ")
        if kind == "table":
            return render.table(arg.strip())
        if kind == "longest":
            return render.longest_table()
        raise ValueError(f"{template.name}: unknown placeholder {{{{{match.group(1)}}}}}")

    body = re.sub(r"\{\{([^}]+)\}\}", fill, template.read_text(encoding="utf-8"))
    return _HEAD.format(name=template.name) + body


def expected() -> dict[Path, str]:
    """Every file bench.docs writes, with the text the results make."""
    files = {OUT / t.name: page(t) for t in sorted(PAGES.glob("*.md"))}
    readme = README.read_text(encoding="utf-8")
    files[README] = _FIGURES.sub(lambda m: m.group(1) + render.figures() + "\n" + m.group(2), readme)
    return files


def unstamped() -> list[str]:
    """Results files that do not record their commit and planner fingerprint, or whose
    fingerprint is not that commit's (only checked where this checkout has the commit)."""
    problems = []
    git = meta.has_git()
    for path in sorted(render.RESULTS.rglob("*.json")):
        rel = render.relative(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        stamp = data.get("meta") if isinstance(data, dict) else None
        if not isinstance(stamp, dict) or "commit" not in stamp or "planner" not in stamp:
            problems.append(f"{rel}: no meta.commit and meta.planner")
            continue
        commit = str(stamp["commit"])
        if not git or commit.endswith("+dirty") or not stamp["planner"]:
            continue
        try:
            at = meta.fingerprint_at(commit)
        except Exception:  # noqa: BLE001  (a commit this checkout does not have: not checkable)
            continue
        if at != stamp["planner"]:
            problems.append(f"{rel}: planner {stamp['planner']} is not commit {commit[:12]}'s ({at})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a page is not what the results make")
    args = parser.parse_args(argv)
    problems = unstamped()
    files = expected()
    for path, text in files.items():
        rel = render.relative(path)
        lines = text.count("\n")
        if lines > MAX_LINES and path != README:
            problems.append(f"{rel}: {lines} lines, over {MAX_LINES}")
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == text:
            continue
        if args.check:
            problems.append(f"{rel}: differs from what the results make (run python -m bench.docs)")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {rel} ({lines} lines)")
    known = set(files)
    problems += [f"{render.relative(p)}: not made by any template in bench/docs/pages"
                 for p in sorted(OUT.glob("*.md")) if p not in known]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
