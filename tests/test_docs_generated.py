"""The figures pages in docs/results/ and the README's figures are what bench/results/ makes
(``python -m bench.docs --check``), and every results file names its commit and planner."""

from __future__ import annotations

import json
import shutil

import pytest

from bench.docs import __main__ as docs
from bench.docs import meta, render


def test_committed_pages_are_what_the_results_make(capsys: pytest.CaptureFixture[str]) -> None:
    assert docs.main(["--check"]) == 0, capsys.readouterr().err


def test_a_changed_result_is_caught(tmp_path, monkeypatch, capsys) -> None:
    """A regenerated gpu_plans.json with another longest length makes the committed long-context
    page stale: the check fails until bench.docs rewrites the page."""
    plans = tmp_path / "gpu_plans.json"
    data = json.loads(render.PLANS.read_text(encoding="utf-8"))
    key = next(k for k in data["plans"] if k.startswith("card:8gb") and k.endswith(":longest"))
    data["plans"][key]["value"]["seq_len"] += 64
    plans.write_text(json.dumps(data), encoding="utf-8")
    monkeypatch.setattr(render, "PLANS", plans)
    out = tmp_path / "results"
    shutil.copytree(docs.OUT, out)
    monkeypatch.setattr(docs, "OUT", out)
    readme = tmp_path / "README.md"
    shutil.copy(docs.README, readme)
    monkeypatch.setattr(docs, "README", readme)
    monkeypatch.setattr(docs, "unstamped", lambda: [])
    assert docs.main(["--check"]) == 1
    assert "long-context.md: differs" in capsys.readouterr().err
    new = f"{data['plans'][key]['value']['seq_len']:,}"
    assert docs.main([]) == 0
    assert new in (out / "long-context.md").read_text(encoding="utf-8")
    assert new in readme.read_text(encoding="utf-8")
    assert docs.main(["--check"]) == 0


def test_a_results_file_without_its_stamp_is_caught(tmp_path, monkeypatch) -> None:
    (tmp_path / "raw.json").write_text("[1, 2]", encoding="utf-8")
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    monkeypatch.setattr(meta, "ROOT", tmp_path)
    monkeypatch.setattr(render, "ROOT", tmp_path)
    assert docs.unstamped() == ["raw.json: no meta.commit and meta.planner"]


def test_fingerprint_at_a_commit_is_the_planners_own_hash() -> None:
    if not meta.has_git() or meta.head_commit().endswith("+dirty"):
        pytest.skip("needs the checkout's history and a clean planner")
    assert meta.fingerprint_at("HEAD") == meta.working_fingerprint()
