"""The committed video plan table (bench/results/tables/video_plans.json, shown in
docs/results/video.md) holds every row its command promises, and each "smallest card" is the one
its peak picks."""

from __future__ import annotations

import json

from bench.memory import video_plans
from lora_gui.cards import card_by_name


def _table() -> dict:
    return json.loads(video_plans.OUT.read_text(encoding="utf-8"))


def test_the_table_has_every_promised_row() -> None:
    table = _table()
    quick = table["meta"]["command"].endswith("--quick")
    shapes = [(row[0], row[1], row[2]) for row in table["rows"]]
    grid = [(model, f"{sizes[model]}x{frames}", "1") for model in video_plans.MODELS
            for name, sizes in video_plans.SIZES.items() if not (quick and name != "480p")
            for frames in video_plans.FRAMES]
    peers = [(p.model, f"{p.size}x{p.frames}", str(p.batch)) for p in video_plans.PEERS]
    assert shapes == grid + peers
    assert all(row[-1] == "-" for row in table["rows"][:len(grid)])
    assert [row[-1] for row in table["rows"][len(grid):]] == [p.figure for p in video_plans.PEERS]


def test_each_smallest_card_is_the_first_that_holds_the_peak() -> None:
    columns = _table()["columns"]
    for row in _table()["rows"]:
        for peak_at, card_at in ((3, 4), (5, 6), (7, 8)):
            assert columns[peak_at].startswith("peak GB") and columns[card_at].startswith("smallest card")
            peak = float(row[peak_at].replace(",", "")) * 1e9  # printed to 0.01 GB: within 5 MB
            near = [card_by_name(c).total_bytes for c in video_plans.CARDS]
            if any(abs(peak - total) < 5e6 for total in near):
                continue  # too close to a card's memory to tell from the printed figure
            assert row[card_at] == video_plans.smallest_card(int(peak)), row


def test_smallest_card_names_none_above_the_largest() -> None:
    largest = card_by_name(video_plans.CARDS[-1]).total_bytes
    assert video_plans.smallest_card(largest + 1) == "none of them"
    assert video_plans.smallest_card(largest) == video_plans.CARDS[-1]
    assert video_plans.smallest_card(1) == video_plans.CARDS[0]
