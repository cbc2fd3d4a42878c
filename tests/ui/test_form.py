"""The Train tab's form: derived from RunConfig (every field, per-task visibility), values as a
dict by setting name, validation next to the field, Start's folder rules, save as preset."""

import dataclasses

import gradio as gr
import pytest

from lora_gui.config import RunConfig
from lora_gui.ui import common, forms
from lora_gui.ui.tabs import train_handlers as handle
from lora_gui.ui.tabs import train_prediction_handlers as predicted


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
    ({"batch_size": None}, "batch_size", ["empty", "1", "4,096"]),
    ({"resolution": 700}, "resolution", ["700", "64"]),
    ({"budget_gb": -1}, "budget_gb", ["-1", "0"]),
    ({"data": "no/such/file.txt"}, "data", ["no/such/file.txt", "does not exist"]),
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


def test_save_as_preset_writes_the_differences_and_is_loadable(runs_root):
    from lora_gui import presets

    good, bad = values(lora_rank=4), values(lr=5)
    message = handle.save_as_preset("mine", good, "my runs")
    mine = runs_root / "presets" / "mine.yaml"  # the user's presets folder; presets/ stays as shipped
    assert message == f"Saved mine (your presets: {mine})"
    text = mine.read_text()
    assert text.startswith("# my runs") and "lora_rank: 4" in text
    assert presets.load_config(mine).lora_rank == 4 and "mine" in common.preset_names()
    assert handle.save_as_preset("bad", bad).startswith("Error: lr")
    assert handle.save_as_preset("../x", good).startswith("Error: name")
    assert sorted(p.name for p in mine.parent.iterdir()) == ["mine.yaml"]


@pytest.mark.slow
def test_prediction_panel_estimate_and_plan_name_their_source():
    text, fig, rows = predicted.prediction_view(values(budget_gb=2.0), 1, exact=False)
    assert "source: predicted" in text and "quick estimate" in text and fig.data
    assert "Micro-batch " in text and " at 1024 tokens: the " in text  # which choice it shows
    text, fig, rows = predicted.prediction_view(values(budget_gb=2.0), 1, exact=True)
    assert "the run's own plan" in text and rows and rows[-1][0] == "1024 tokens"
    assert "Predicted speed: **" in text and "tokens/s**, MFU " in text  # beside the peak
    text, _, _ = predicted.prediction_view(values(mode="traditional", budget_gb=0.05), 1, exact=False)
    assert "does not fit" in text and "gradient_checkpointing" in text
    text, fig, _ = predicted.prediction_view(values(lr=5), 1, exact=False)
    assert "waits for valid settings" in text and fig is None


@pytest.mark.slow
def test_plan_panel_names_the_fewest_layers_to_checkpoint_within_the_budget():
    # the largest micro-batches: the plan keeps every layer checkpointed rather than choosing
    roomy = values(gradient_checkpointing=True, precision="fp32", budget_gb=0.1, batch_choice="largest")
    text, _, _ = predicted.prediction_view(roomy, 1, exact=True)
    assert "**fits**" in text and "Faster within the budget: **checkpoint_layers 3**" in text
    # on the page the plan comes first, the line after the search's further plans
    (plan_text, _, _), (hinted, _, _) = predicted.prediction_views(roomy, 1)
    assert "**fits**" in plan_text and "checkpoint_layers" not in plan_text
    assert hinted == text and hinted.startswith(plan_text)
    # a budget that needs every layer checkpointed: the plan alone, no second view
    tight = values(gradient_checkpointing=True, precision="fp32", budget_gb=0.055, batch_choice="largest")
    (only,) = predicted.prediction_views(tight, 1)
    assert "**fits**" in only[0] and "checkpoint_layers" not in only[0]
    text, _, _ = predicted.prediction_view(roomy, 1, exact=False)  # the quick estimate: no hint
    assert "checkpoint_layers" not in text


def test_a_plan_for_settings_the_page_has_since_changed_is_dropped():
    from lora_gui.ui.tabs import train

    with gr.Blocks() as blocks:
        train.build()
    fns = {f.name: f for f in blocks.fns.values()}
    estimate, plan = fns["estimate"], fns["plan"]
    first = {c: c.value for c in estimate.inputs}  # the settings, the preset and the card
    lr = next(c for c in estimate.inputs if getattr(c, "elem_id", None) == "field-lr")
    changed = {**first, lr: 3e-4 if first[lr] != 3e-4 else 2e-4}
    page, other_page = gr.Request(session_hash="page"), gr.Request(session_hash="other")
    estimate.fn(first, page)
    estimate.fn(changed, page)  # the page changed its settings while the first plan ran
    estimate.fn(first, other_page)
    dropped = list(plan.fn(first, page))
    assert len(dropped) == 1 and all(part == gr.update() for part in dropped[0])  # not shown
    assert next(plan.fn(changed, page))[0].startswith("Predicted peak")  # the page's own settings
    assert next(plan.fn(first, other_page))[0].startswith("Predicted peak")  # each page on its own


def test_shown_forms_remember_a_bounded_number_of_pages():
    shown = predicted.ShownForms(keep=2)
    for page in ("a", "b", "c"):
        shown.mark(page, {"lr": 1.0}, 1)
    assert not shown.is_current("b", {"lr": 2.0}, 1) and shown.is_current("b", {"lr": 1.0}, 1)
    assert shown.is_current("a", {"lr": 2.0}, 1)  # forgotten: its plan is shown, as before
    assert shown.is_current(None, {"lr": 2.0}, 1)  # a call without a page (the API)


def test_engine_never_imports_gradio():
    import subprocess
    import sys

    code = ("import sys, lora_gui.engine.text.train, lora_gui.engine.jobs.manager, "
            "lora_gui.memory.predict.run_plan, lora_gui.memory.predict.run, "
            "lora_gui.engine.compare.instant, lora_gui.cli; "
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


def test_ranges_read_as_numbers_not_exponents():
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    assert forms.range_text(fields["token_budget"]) == " Range: 16 to 4,194,304."
    window = forms.range_text(fields["window"])
    assert "e+" not in window and "1,048,576" in window
    assert forms.number_text(0.9) == "0.9" and forms.number_text(1e-7) == "0.0000001"


def test_key_settings_sit_in_boxes_that_follow_the_task():
    with gr.Blocks():
        key = forms.build_fields(forms.KEY_FIELDS, handle.form_values("text-demo"), per_row=5)
        rest = forms.build_form(handle.form_values("text-demo"), skip=forms.KEY_FIELDS)
    form = key.merge(rest)
    assert sorted(form.widgets) == sorted(f.name for f in dataclasses.fields(RunConfig))
    assert not set(forms.KEY_FIELDS) & {n for names in rest.members.values() for n in names}
    image = forms.visibility(form, "image")
    assert image[form.boxes["max_seq_len"]]["visible"] is False and image[form.boxes["resolution"]]["visible"]
    text = forms.visibility(form, "text")
    assert text[form.boxes["resolution"]]["visible"] is False and text[form.boxes["lr"]]["visible"]
    assert text[form.groups["image"]]["visible"] is False


def test_differs_from_preset_names_each_changed_setting_and_the_card():
    same = handle.form_values("text-demo")
    assert handle.differs_from_preset("text-demo", same) == "Settings as in the preset **text-demo**."
    line = handle.differs_from_preset("text-demo", {**same, "lr": 0.05, "max_steps": 3.0})
    assert "lr = 0.05" in line and "max_steps = 3" in line and "batch_size" not in line
    from lora_gui.ui import common

    budget = common.card_budget_gb("24gb")
    from lora_gui.cards import card_by_name

    assert budget == card_by_name("24gb").total_bytes / 1e9  # exactly the bytes `plan --card` plans with
    assert "card 24gb" in handle.differs_from_preset("text-demo", {**same, "budget_gb": budget}, "24gb")
    assert common.card_budget_gb(common.CUSTOM_CARD) is None and common.card_budget_gb("nope") is None


def test_gauge_draws_the_peak_against_the_budget():
    half = predicted.gauge(50 * 2**20, 100 * 2**20, cells=10)
    assert half.startswith("`█████░░░░░`") and "50%" in half and "predicted" in half
    over = predicted.gauge(150 * 2**20, 100 * 2**20, cells=10)
    assert "██████████▓▓▓▓▓" in over and "150%" in over


class _Job:
    def __init__(self, status: str, stop: bool, phases: list) -> None:
        import threading

        self.name, self.status, self.phase, self.total_steps = "r", status, "training", 10
        self.started, self.phases = 0.0, phases
        self.control = type("C", (), {"stop": threading.Event()})()
        if stop:
            self.control.stop.set()

    @property
    def running(self) -> bool:
        return self.status in ("starting", "running")


def test_stop_shows_stopping_at_once_and_an_ended_run_has_no_eta():
    running = _Job("running", stop=False, phases=[("training", 100.0)])
    assert "ETA 20 s" in handle.status_line(running, 5, now=120.0)  # 4 s a step
    stopping = _Job("running", stop=True, phases=[("training", 100.0)])
    assert "stopping" in handle.status_line(stopping, 5, now=120.0)
    stopped = _Job("stopped", stop=True, phases=[("training", 100.0), ("done", 130.0)])
    early, late = (handle.status_line(stopped, 5, now=t) for t in (140.0, 900.0))
    assert "ETA" not in late and early == late and "trained 30 s" in late


def test_the_status_never_says_no_training_beside_a_started_job(runs_root, monkeypatch):
    assert handle.status_text() == handle.NO_TRAINING  # nothing started on this server
    compare = _Job("running", stop=False, phases=[])
    compare.kind, compare.name = "compare", "cmp-1"
    monkeypatch.setattr(common.MANAGER, "job", compare)
    assert "cmp-1" in handle.status_text() and "running" in handle.status_text()
    training = _Job("starting", stop=False, phases=[])
    training.kind, training.predicted_bytes, training.error, training.summary = "training", None, None, None
    training.snapshot = lambda: ([], [])
    monkeypatch.setattr(common.MANAGER, "job", training)
    line = handle.status_text()  # what Start shows in the same update as "Started"
    assert "No training" not in line and line.startswith("**r**: starting")


def test_image_runs_hide_the_text_only_settings(form):
    image = forms.visibility(form, "image")
    for name in ("data_format", "chat_template", "train_on_prompt", "quantization", "double_quant"):
        assert image[form.widgets[name]]["visible"] is False, name
    assert image[form.widgets["optimizer"]]["visible"]  # both tasks pick an optimizer


def test_a_missing_data_path_is_flagged_before_start_and_nothing_fits():
    text, fig, _ = predicted.prediction_view(values(data="/no/such/corpus.txt"), 1, exact=False)
    assert "waits for valid settings" in text and "fits" not in text and fig is None
    # the path and what is wrong with it are said once, beside the data field
    assert "/no/such/corpus.txt" not in text
    assert "/no/such/corpus.txt" in forms.validate(values(data="/no/such/corpus.txt"))[1]["data"]


def test_image_settings_follow_the_pipeline(form):
    assert handle.image_kind("image", "builtin") == "sd"  # the bundled SD-style pipeline
    assert handle.image_kind("image", "builtin:drawing") == "sd3"
    assert handle.image_kind("text", "builtin") is None
    assert handle.image_kind("image", "black-forest-labs/FLUX.1-dev") is None  # a Hub id: not looked up
    def shown(kind):
        updates = forms.visibility(form, "image", kind)
        return {n for n in ("guidance_scale", "train_text_encoder", "weighting_scheme")
                if updates[form.widgets[n]]["visible"]}

    assert shown("sd") == {"train_text_encoder"}
    assert shown("sd3") == {"weighting_scheme"}  # guidance_scale is Flux's only
    assert shown("flux") == {"weighting_scheme", "guidance_scale"}
    assert shown(None) == {"guidance_scale", "train_text_encoder", "weighting_scheme"}
