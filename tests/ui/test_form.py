"""The Train tab's form: derived from RunConfig (every field, per-task visibility), values as a
dict by setting name, validation next to the field, Start's folder rules, save as preset."""

import dataclasses

import gradio as gr
import pytest

from lora_gui.config import RunConfig
from lora_gui.ui import common, forms
from lora_gui.ui.tabs import train_handlers as handle


@pytest.fixture()
def runs_root(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RUNS_ROOT", tmp_path)
    monkeypatch.setattr(common, "MANAGER", common.JobManager())
    return tmp_path


@pytest.fixture()
def form():
    with gr.Blocks():
        return forms.build_form(handle.form_values("text-demo"))


def test_form_covers_every_runconfig_field(form):
    names = [f.name for f in dataclasses.fields(RunConfig)]
    assert sorted(form.widgets) == sorted(names) and sorted(form.errors) == sorted(names)
    for f in dataclasses.fields(RunConfig):
        widget, kind = form.widgets[f.name], forms.field_kind(f)
        if f.metadata.get("choices"):
            assert isinstance(widget, gr.Dropdown) and widget.choices
        elif kind is bool:
            assert isinstance(widget, gr.Checkbox)
        elif kind in (int, float):
            assert isinstance(widget, gr.Number) and (kind is float or widget.precision == 0)
        assert widget.label and widget.elem_id == f"field-{f.name}"
    assert {g for g in form.groups} >= {"task", "train", "memory", "lora", "image"}


def test_each_field_shows_for_its_task(form):
    image = forms.visibility(form, "image")
    text = forms.visibility(form, "text")
    for name in ("max_seq_len", "batching", "window", "token_budget"):
        assert image[form.widgets[name]]["visible"] is False and text[form.widgets[name]]["visible"]
    for name in ("resolution", "cache_latents", "aspect_buckets", "batch_table"):
        assert text[form.widgets[name]]["visible"] is False and image[form.widgets[name]]["visible"]
    assert text[form.groups["image"]]["visible"] is False and image[form.groups["image"]]["visible"]
    for name in ("lr", "lora_rank", "batch_size", "epochs", "checkpoint_every", "precision"):
        assert image[form.widgets[name]]["visible"] and text[form.widgets[name]]["visible"]


def values(**kw):
    out = handle.form_values("text-demo")
    out.update(kw)
    return out


@pytest.mark.parametrize("kw, field, words", [
    ({"lr": 5}, "lr", ["5", "1e-07", "1.0"]),
    ({"lora_rank": 0}, "lora_rank", ["0", "1", "1024"]),
    ({"max_seq_len": 8}, "max_seq_len", ["8", "16"]),
    ({"batch_size": None}, "batch_size", ["empty", "1", "4096"]),
    ({"resolution": 700}, "resolution", ["700", "64"]),
    ({"budget_gb": -1}, "budget_gb", ["-1", "0"]),
    ({"data": "/no/such/file.txt"}, "data", ["/no/such/file.txt", "not a readable file"]),
    ({"data": " "}, "data", ["empty"]),
    ({"window": 4096, "attention": "windowed"}, "window", ["4096", "max_seq_len"]),
    ({"batch_table": "512-8"}, "batch_table", ["512-8"]),
])
def test_bad_value_gets_a_message_next_to_its_field(kw, field, words):
    cfg, errors = forms.validate(values(**kw))
    assert cfg is None and list(errors) == [field]
    for word in words:
        assert word in errors[field], errors[field]


def test_several_bad_fields_each_get_their_message():
    _, errors = forms.validate(values(lr=5, lora_rank=0, epochs=0))
    assert set(errors) == {"lr", "lora_rank", "epochs"}


def test_budget_zero_means_no_budget_and_is_accepted():
    cfg, errors = forms.validate(values(budget_gb=0))
    assert errors == {} and cfg.budget_gb == 0.0


def test_preset_fills_every_field():
    image = handle.form_values("image-768")
    assert set(image) == {f.name for f in dataclasses.fields(RunConfig)}
    assert image["task"] == "image" and image["resolution"] == 768 and image["lr"] == 0.0005
    assert handle.form_values("text-demo")["lr"] == 0.005


def test_start_refuses_a_folder_holding_a_run_until_confirmed(runs_root, monkeypatch):
    started = []
    monkeypatch.setattr(common.MANAGER, "start", lambda cfg, out, **kw: started.append((cfg, kw)) or
                        type("J", (), {"name": out.name, "out": out})())
    (runs_root / "old").mkdir()
    (runs_root / "old" / "config.json").write_text("{}")
    message, errors, ask = handle.start("old", 1, values())
    assert ask and "holds another run" in message and not started and not errors
    message, _, ask = handle.start("old", 1, values(), handle.START_OVERWRITE)
    assert "Started" in message and not ask and started[-1][1]["overwrite"] is True
    message, _, _ = handle.start("fresh", 1, values(task="image", resolution=1024))
    assert "Started" in message and started[-1][0].task == "image" and started[-1][0].resolution == 1024
    assert started[-1][1]["processes"] == 1


@pytest.mark.parametrize("name", ["../evil", "a/b", "", "..", "/abs"])
def test_run_names_with_paths_are_refused(runs_root, name):
    message, _, _ = handle.start(name, 1, values())
    assert message.startswith("Error:") and "run name" in message
    assert common.MANAGER.job is None


def test_processes_are_checked_for_image_runs_too(runs_root, monkeypatch):
    monkeypatch.setattr(common, "gpu_count", lambda: 0)
    message, _, _ = handle.start("img", 2, values(task="image"))
    assert message.startswith("Error:") and "processes: 2" in message and common.MANAGER.job is None


def test_bad_settings_start_nothing_and_mark_the_field(runs_root):
    message, errors, _ = handle.start("r", 1, values(lr=5))
    assert message.startswith("Error:") and "lr" in errors and common.MANAGER.job is None


def test_save_as_preset_writes_the_differences_and_is_loadable(tmp_path, monkeypatch):
    from lora_gui import presets

    good, bad = values(lora_rank=4), values(lr=5)
    monkeypatch.setattr(presets, "PRESET_DIR", tmp_path)
    message = handle.save_as_preset("mine", good, "my runs")
    assert message == "Saved presets/mine.yaml"
    text = (tmp_path / "mine.yaml").read_text()
    assert text.startswith("# my runs") and "lora_rank: 4" in text
    assert presets.load_config(tmp_path / "mine.yaml").lora_rank == 4
    assert handle.save_as_preset("bad", bad).startswith("Error: lr")
    assert handle.save_as_preset("../x", good).startswith("Error: name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]


@pytest.mark.slow
def test_prediction_panel_estimate_and_plan_name_their_source():
    text, fig, rows = handle.prediction_view(values(budget_gb=2.0), 1, exact=False)
    assert "source: predicted" in text and "quick estimate" in text and fig.data
    text, fig, rows = handle.prediction_view(values(budget_gb=2.0), 1, exact=True)
    assert "the run's own plan" in text and rows and rows[-1][0] == "1024 tokens"
    text, _, _ = handle.prediction_view(values(mode="traditional", budget_gb=0.05), 1, exact=False)
    assert "does not fit" in text and "gradient_checkpointing" in text
    text, fig, _ = handle.prediction_view(values(lr=5), 1, exact=False)
    assert "waits for valid settings" in text and fig is None


def test_a_plan_for_settings_the_page_has_since_changed_is_dropped():
    from lora_gui.ui.tabs import train

    with gr.Blocks() as blocks:
        train.build()
    fns = {f.name: f for f in blocks.fns.values()}
    estimate, plan = fns["estimate"], fns["plan"]
    first = {c: c.value for c in plan.inputs}
    lr = next(c for c in plan.inputs if getattr(c, "elem_id", None) == "field-lr")
    changed = {**first, lr: 3e-4 if first[lr] != 3e-4 else 2e-4}
    page, other_page = gr.Request(session_hash="page"), gr.Request(session_hash="other")
    estimate.fn(first, page)
    estimate.fn(changed, page)  # the page changed its settings while the first plan ran
    estimate.fn(first, other_page)
    assert all(part == gr.update() for part in plan.fn(first, page))  # dropped: not shown
    assert plan.fn(changed, page)[0].startswith("Predicted peak")  # the page's own settings
    assert plan.fn(first, other_page)[0].startswith("Predicted peak")  # each page on its own


def test_shown_forms_remember_a_bounded_number_of_pages():
    shown = handle.ShownForms(keep=2)
    for page in ("a", "b", "c"):
        shown.mark(page, {"lr": 1.0}, 1)
    assert not shown.is_current("b", {"lr": 2.0}, 1) and shown.is_current("b", {"lr": 1.0}, 1)
    assert shown.is_current("a", {"lr": 2.0}, 1)  # forgotten: its plan is shown, as before
    assert shown.is_current(None, {"lr": 2.0}, 1)  # a call without a page (the API)


def test_engine_never_imports_gradio():
    import subprocess
    import sys

    code = ("import sys, lora_gui.engine.text.train, lora_gui.engine.jobs, lora_gui.memory.predict.run_plan, "
            "lora_gui.memory.predict.run, lora_gui.engine.compare.instant, lora_gui.__main__; "
            "print('gradio' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.stdout.strip() == "False", res.stderr


def test_adapter_settings_are_on_the_form_and_a_combination_peft_cannot_run_marks_its_field(form):
    adapter = form.widgets["adapter"]
    assert isinstance(adapter, gr.Dropdown)
    choices = [c[0] if isinstance(c, tuple) else c for c in adapter.choices]
    assert choices == ["lora", "dora", "loha", "lokr", "oft"]
    assert {"rslora", "lora_init", "lora_plus_ratio", "lora_fa"} <= set(form.widgets)
    cfg, errors = forms.validate({"adapter": "lokr", "quantization": "nf4"})
    assert cfg is None and "adapter: lora or dora" in errors["adapter"]
    cfg, errors = forms.validate({"adapter": "dora", "quantization": "nf4", "rslora": True})
    assert errors == {} and cfg.adapter == "dora"
