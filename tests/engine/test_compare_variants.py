"""compare --variants: every adapter variant trained on the same samples and steps (real runs on
the bundled text demo, 2 steps a row at a short length), the table, resume, bad input, and the
Compare tab starting the same comparison as a background job."""

import json

import pytest

from lora_gui.cli import main
from lora_gui.config import ConfigError
from lora_gui.engine.compare.results import load_results
from lora_gui.engine.compare.variants import format_variants_table, parse_variants, run_variants
from lora_gui.presets import load_config

VARIANTS = ["lora", "dora", "loha", "lokr", "oft"]


def tiny(**kw):
    base = {"batch_size": 2, "precision": "fp32", "lr": 5e-3, "warmup_steps": 0, "lora_rank": 4}
    return load_config("text-demo", {**base, **kw})


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("variants") / "cmp"
    return out, run_variants(tiny(), VARIANTS, out, seq_len=64, steps=2, eval_samples=2)


def test_every_variant_trains_the_same_samples_and_reports_memory_speed_and_loss(compared):
    out, result = compared
    rows = result["rows"]
    assert [r["mode"] for r in rows] == VARIANTS and {r["question"] for r in rows} == {"variants"}
    for r in rows:
        assert r["status"] == "ok", r
        assert r["memory_source"] == "tracker" and r["peak_bytes"] > 0 and r["predicted_peak_bytes"] > 0
        assert r["real_tokens_per_s"] > 0 and r["eval_loss"] > 0 and r["adapter_params"] > 0
        run = json.loads((out / "runs" / f"variants-corpus-{r['mode']}-64" / "config.json").read_text())
        assert run["adapter"] == r["mode"] and run["lora_dropout"] == 0.0
    # the same work: same samples, steps and real tokens in every row
    assert len({(r["samples"], r["steps"], r["real_tokens"]) for r in rows}) == 1
    # the variants differ in what they train: LoHa has twice LoRA's numbers at the same rank
    params = {r["mode"]: r["adapter_params"] for r in rows}
    assert params["loha"] == 2 * params["lora"] and params["dora"] > params["lora"]
    saved = load_results(out)
    assert saved["settings"]["variants"] == VARIANTS
    table = format_variants_table(rows)
    assert table.splitlines()[1].startswith("lora") and "tracker" in table and "vs lora" in table


def test_a_second_call_resumes_the_rows_already_measured(compared, monkeypatch):
    from lora_gui.engine.compare import text_rows

    out, first = compared
    monkeypatch.setattr(text_rows, "_run_row", lambda *a, **k: pytest.fail("a measured row was run again"))
    again = run_variants(tiny(), VARIANTS, out, seq_len=64, steps=2, eval_samples=2)
    assert again["rows"] == first["rows"]


def test_bad_variants_name_the_valid_ones(tmp_path, capsys):
    with pytest.raises(ConfigError, match="--variants: boft: choose from lora, dora, loha, lokr, oft"):
        parse_variants("lora,boft")
    with pytest.raises(ConfigError, match="twice"):
        parse_variants("lora,lora")
    assert main(["compare", "--preset", "text-demo", "--variants", "lora,dora", "--seq-lens", "64,128",
                 "--out", str(tmp_path / "x")]) == 2
    assert "one length" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="compares text runs"):
        run_variants(load_config("image-demo"), ["lora"], tmp_path / "y")


def test_compare_tab_starts_the_variants_as_its_background_job(tmp_path, monkeypatch):
    from lora_gui.engine.compare import variants
    from lora_gui.ui import common
    from lora_gui.ui.tabs import compare_handlers as handle

    monkeypatch.setattr(common, "runs_root", lambda: tmp_path)
    calls = []

    class Manager:
        def start_work(self, name, out, base, kind, work):
            calls.append((name, kind, out))
            job = type("Job", (), {"name": name, "control": type("C", (), {"stop": None})(),
                                   "add_record": None, "total_steps": 0})()
            work(job)
            return job

    monkeypatch.setattr(common, "MANAGER", Manager())
    monkeypatch.setattr(variants, "run_variants", lambda base, chosen, out, **kw: calls.append((chosen, kw)))
    message = handle.measure("text-demo", "64", 2, "cmp", ["lora", "oft"])
    assert "Measuring **cmp**: lora, oft at length 64, 2 steps each" in message, message
    assert calls[1][0] == ["lora", "oft"] and calls[1][1]["seq_len"] == 64 and calls[1][1]["steps"] == 2
    assert handle.measure("image-demo", "512", 2, "cmp", ["lora"]).startswith("Error: variants")
    assert handle.measure("text-demo", "64", 2, "cmp", ["nope"]).startswith("Error: --variants")
