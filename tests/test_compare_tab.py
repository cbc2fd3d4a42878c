"""The Compare tab's handlers: figures and table from a compare.json, clear errors otherwise."""

import json

from lora_gui.ui import handlers


def cmp_row(question, data, mode, n, peak, speed=None, status="ok"):
    return {"question": question, "data": data, "mode": mode, "seq_len": n, "peak_bytes": peak,
            "memory_source": "tracker", "real_tokens_per_s": speed, "status": status,
            "eval_loss": 3.0, "batch_size": 8}


COMPARE_ROWS = [cmp_row("memory", "full", "traditional", 512, 400 * 2**20),
                cmp_row("memory", "full", "strong_baseline", 512, 300 * 2**20),
                cmp_row("memory", "full", "optimized", 512, 100 * 2**20),
                cmp_row("memory", "full", "ablation:sdpa", 512, 300 * 2**20),
                cmp_row("memory", "full", "ablation:loss_chunk", 512, 250 * 2**20),
                cmp_row("memory", "full", "traditional", 1024, None, status="oom"),
                cmp_row("memory", "full", "optimized", 1024, 150 * 2**20),
                cmp_row("speed", "full", "traditional", 512, 400 * 2**20, speed=100.0),
                cmp_row("speed", "full", "optimized", 512, 390 * 2**20, speed=250.0)]


def test_load_compare_builds_figures_and_table(tmp_path):
    (tmp_path / "compare.json").write_text(json.dumps({"settings": {}, "rows": COMPARE_ROWS}))
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
