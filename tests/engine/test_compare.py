"""compare: real rows through the text engine on a tiny setting (1 step a row), resume, OOM,
predicted rows, the CLI's --json and --html, and the comparison data files."""

import json

import pytest

from lora_gui.cli import main
from lora_gui.config import ConfigError, apply_overrides
from lora_gui.data.text import load_documents
from lora_gui.engine.compare import spec as compare
from lora_gui.engine.compare.data import prepare_data
from lora_gui.engine.compare.results import load_results
from lora_gui.engine.compare.spec import ABLATIONS, CompareSettings, mode_overrides
from lora_gui.engine.compare.text_rows import run_comparison
from lora_gui.engine.text.train import load_text_data
from lora_gui.models.text import load_tokenizer
from lora_gui.presets import load_config

FIELDS = {"question", "data", "mode", "seq_len", "batch_size", "peak_bytes", "memory_source",
          "predicted_peak_bytes", "real_tokens_per_s", "final_loss", "eval_loss", "status"}


def tiny(**kw):
    base = {"batch_size": 2, "precision": "fp32", "lr": 5e-3, "warmup_steps": 0, "lora_rank": 4}
    return load_config("text-demo", {**base, **kw})


def test_mode_profiles_switch_what_they_say():
    cfg = tiny()
    trad = apply_overrides(cfg, mode_overrides("traditional", 512, 8, cfg))
    assert (trad.resolved_batching(), trad.resolved_attn_backend()) == ("fixed", "eager")
    opt = apply_overrides(cfg, mode_overrides("optimized", 512, 8, cfg))
    assert opt.resolved_attn_backend() == "sdpa" and opt.gradient_checkpointing and opt.loss_chunk > 0
    strong = apply_overrides(cfg, mode_overrides("strong_baseline", 512, 8, cfg))
    assert strong.resolved_batching() == "bucketed" and strong.token_budget == 8 * 512
    assert not strong.gradient_checkpointing and not strong.loss_chunk
    win = apply_overrides(cfg, {"max_seq_len": 64, **mode_overrides("ablation:windowed", 64, 8, cfg)})
    assert win.attention == "windowed" and win.window <= 32 and win.resolved_attn_backend() == "eager"
    with pytest.raises(ConfigError, match="unknown ablation"):
        mode_overrides("ablation:nope", 64, 8, cfg)


def test_full_samples_fill_the_length_and_the_engine_holds_out_the_chosen_ones(tmp_path):
    cfg = tiny()
    tok = load_tokenizer(str(cfg.data_path().parent.parent / "base-model"))
    data = prepare_data(cfg, "full", 96, 6, 3, tmp_path, tok)
    run_cfg = apply_overrides(cfg, {"data": str(data.path), "eval_fraction": data.eval_fraction,
                                    "max_seq_len": 96})
    text = load_text_data(run_cfg, tok)
    assert len(text.train) == 6 and len(text.held_out) == 3
    assert all(len(s) == 96 for s in text.train + text.held_out)
    docs = load_documents(data.path)  # the held-out docs are the last ones prepared, not training docs
    assert len(docs) == 9
    with pytest.raises(ConfigError, match="needs 100000"):
        prepare_data(cfg, "corpus", 96, 100000, 3, tmp_path, tok)


def test_rows_are_real_labelled_and_resume_without_recomputing(tmp_path, monkeypatch):
    ablations = {k: ABLATIONS[k] for k in ("windowed", "loss_chunk")}  # two of them: suite time
    monkeypatch.setattr(compare, "ABLATIONS", ablations)
    out = tmp_path / "cmp"
    settings = CompareSettings(seq_lens=[48], steps=1, data_kinds=["full"], eval_samples=1)
    result = run_comparison(tiny(), settings, out)
    rows = result["rows"]
    modes = [r["mode"] for r in rows if r["question"] == "memory"]
    assert modes == ["traditional", "strong_baseline", "optimized", "ablation:windowed",
                     "ablation:loss_chunk"]
    assert [r["mode"] for r in rows if r["question"] == "speed"] == ["traditional", "strong_baseline",
                                                                     "optimized"]
    for r in rows:
        assert FIELDS <= r.keys() and r["status"] == "ok", r
        assert r["data"] == "full" and r["seq_len"] == 48 and r["measure"] == "measured"
        assert r["memory_source"] == "tracker" and r["peak_bytes"] > 0 and r["eval_loss"] > 0
    by = {(r["question"], r["mode"]): r for r in rows}
    trad, opt = by["memory", "traditional"], by["memory", "optimized"]
    assert trad["batch_size"] == opt["batch_size"] == 2 and trad["samples"] == opt["samples"] == 2
    assert opt["peak_bytes"] < trad["peak_bytes"]  # checkpointing + chunked loss + SDPA
    assert by["memory", "ablation:windowed"]["eval_loss_full_attention"] is not None
    speed_budget = by["speed", "traditional"]["budget_bytes"]
    assert speed_budget and all(by["speed", m]["budget_bytes"] == speed_budget
                                for m in ("strong_baseline", "optimized"))
    assert by["speed", "optimized"]["batch_size"] >= by["speed", "traditional"]["batch_size"]
    csv_lines = (out / "compare.csv").read_text().splitlines()
    assert csv_lines[0].startswith("question,data,mode,seq_len") and len(csv_lines) == len(rows) + 1
    # interrupted after 7 rows: the 7 written rows stay, only the last one is trained again
    saved = json.loads((out / "compare.json").read_text())
    saved["rows"] = saved["rows"][:7]
    (out / "compare.json").write_text(json.dumps(saved))
    fresh = []
    resumed = run_comparison(tiny(), settings, out, on_row=fresh.append)["rows"]
    assert len(fresh) == 1 and resumed[:7] == saved["rows"] and len(resumed) == 8
    assert fresh[0]["question"] == "speed" and fresh[0]["mode"] == "optimized"
    with pytest.raises(ConfigError, match="other settings"):
        run_comparison(tiny(lora_rank=8), settings, out)


def test_a_stop_between_rows_keeps_the_rows_done_and_a_rerun_resumes(tmp_path):
    import threading

    from lora_gui.engine.compare.quick import run_quick

    stop = threading.Event()
    first = run_quick(tiny(), [64], tmp_path, steps=1, stop=stop, on_row=lambda _row: stop.set())
    assert [r["mode"] for r in first["rows"]] == ["traditional"]
    assert len(load_results(tmp_path)["rows"]) == 1  # saved, so the page and a rerun see it
    again = run_quick(tiny(), [64], tmp_path, steps=1)
    assert [r["mode"] for r in again["rows"]] == ["traditional", "strong_baseline", "optimized"]
    assert again["rows"][0] == first["rows"][0]  # resumed, not trained again


def test_out_of_budget_row_is_recorded_and_the_comparison_goes_on(tmp_path):
    cfg = tiny(budget_gb=0.045)  # fits the weights and the optimized step, not traditional's batch
    settings = CompareSettings(seq_lens=[192], steps=1, questions=["memory"], data_kinds=["full"],
                               ablations=False, eval_samples=1)
    rows = run_comparison(cfg, settings, tmp_path / "cmp")["rows"]
    by = {r["mode"]: r for r in rows}
    trad = by["traditional"]
    assert trad["status"] == "oom" and trad["message"].startswith("OOM at batch 2")
    assert trad["predicted_peak_bytes"] > trad["budget_bytes"] and trad["peak_bytes"] is None
    assert by["optimized"]["status"] == "ok" and by["optimized"]["peak_bytes"] <= 0.045e9


def test_cli_predicted_json_and_self_contained_html(tmp_path, capsys):
    html = tmp_path / "report.html"
    rc = main(["compare", "--set", "batch_size=8", "--seq-lens", "512,1024", "--measure", "predicted",
               "--device", "cpu", "--out", str(tmp_path / "p"), "--json", "--html", str(html)])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 * (3 + len(ABLATIONS))
    assert all(r["measure"] == "predicted" and r["memory_source"] == "predicted" for r in rows)
    assert all(r["question"] == "memory" and r["data"] == "full" for r in rows)
    peak = {(r["mode"], r["seq_len"]): r["peak_bytes"] for r in rows}
    assert peak["optimized", 1024] < 0.5 * peak["traditional", 1024]
    assert load_results(tmp_path / "p")["rows"] == rows
    page = html.read_text()
    assert "<script src=" not in page and "plotly" in page.lower() and len(page) > 1_000_000  # js inside
    assert "traditional" in page and "ablation" in page


def test_cli_image_comparison_needs_an_image_preset(tmp_path, capsys):
    rc = main(["compare", "--resolutions", "512", "--out", str(tmp_path / "i")])
    err = capsys.readouterr().err
    assert rc == 2 and "image preset" in err
    assert main(["compare", "--out", str(tmp_path / "x")]) == 2
    assert "--seq-lens" in capsys.readouterr().err


def test_compare_engine_never_imports_gradio():
    import subprocess
    import sys

    code = ("import sys, lora_gui.engine.compare.spec, lora_gui.engine.compare.text_rows, "
            "lora_gui.engine.compare.image_rows, lora_gui.ui.charts; print('gradio' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "False", res.stderr
