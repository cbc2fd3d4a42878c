"""bench/ui/tour.py's parts that need no browser: README's tour read step by step, and the
results table (each action's seconds, a step's mismatches on its last action)."""

from __future__ import annotations

import pytest

from bench.ui import tour


def test_readme_steps_are_the_three_numbered_steps_of_the_tour_section(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## A three-minute tour\n\nIntro.\n\n1. **Train.** Press\n   Start.\n"
                      "2. **Plan.** Press Plan.\n3. **Compare.** Open it.\n\nAfter the list.\n\n"
                      "## Next\n\n1. not the tour\n", encoding="utf-8")
    assert tour.readme_steps(readme) == ["1. **Train.** Press Start.", "2. **Plan.** Press Plan.",
                                         "3. **Compare.** Open it."]


def test_a_readme_whose_tour_has_other_than_three_steps_is_refused(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("## A three-minute tour\n\n1. One.\n2. Two.\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="2 numbered steps"):
        tour.readme_steps(readme)


def test_the_committed_readme_has_the_tour_this_script_follows():
    steps = tour.readme_steps()
    titles = [s.split("**")[1] for s in steps]
    assert titles == ["Train the demo.", "Plan a real model on your card.", "Compare."]


def test_rows_put_each_steps_mismatches_on_its_last_action():
    body = {"actions": [{"step": 1, "did": "open", "answered_s": 1.24},
                        {"step": 2, "did": "plan", "answered_s": None},
                        {"step": 1, "did": "try", "answered_s": 3.0}],
            "mismatches": {"1": ["a field is named otherwise"], "2": [], "3": []}}
    assert tour.rows_of(body) == [["1", "open", "1.2", "—"], ["2", "plan", "no answer", "—"],
                                  ["1", "try", "3.0", "a field is named otherwise"]]


@pytest.mark.parametrize(("message", "final"), [
    ("", False), ("0.2s", False), ("1.3/9.0s", False), ("Base model generating… (plain text prompt)", False),
    ("Done: seed 0, temperature 0.7, plain text prompt.", True), ("Error: runs/x: no adapter", True)])
def test_the_try_message_counts_as_answered_only_once_generation_ended(message, final):
    assert tour.answered(message) is final
