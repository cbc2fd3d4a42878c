"""The Compare tab's handlers: figures and table from a compare.json, clear errors otherwise."""

import json

from lora_gui.ui import handlers


def test_load_compare_builds_figures_and_table(tmp_path, compare_rows):
    (tmp_path / "compare.json").write_text(json.dumps({"settings": {}, "rows": compare_rows}))
    message, bars, speed, waterfall, table = handlers.load_compare(str(tmp_path), "full", "512")
    assert message.startswith("9 rows") and "tracker" in message
    assert [t.name for t in bars.data] == ["traditional", "strong baseline", "optimized"]
    assert list(speed.data[2].y) == [250.0] and waterfall.data[0].x[0] == "traditional"
    assert len(table) == 9 and table[0][:3] == ["memory", "full", "traditional"] and table[0][6] == 400.0


def test_load_compare_names_a_missing_or_broken_file(tmp_path):
    assert "no compare.json" in handlers.load_compare(str(tmp_path / "none"))[0]
    bad = tmp_path / "compare.json"
    bad.write_text("{not json")
    message = handlers.load_compare(str(bad))[0]
    assert message.startswith("Error:") and "compare.json" in message


def test_start_compare_refuses_bad_lengths():
    assert handlers.start_compare("text-demo", "8", 2, "runs/x").startswith("Error: --seq-lens")
    assert "no comparison" in handlers.stop_compare()
