"""Train tab: on one screen, the settings that decide a run, the predicted peak against the card
and Start / Stop / Resume / Longest that fits (left), the run's live charts (right), the other
settings in compact groups below. Handlers: train_handlers.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gradio as gr

from lora_gui.ui import (
    charts,
    common,
    forms,
    gpu_share,
    input_checks,
    live,
    live_charts,
    live_panel,
    run_status,
)
from lora_gui.ui.tabs import longest_handlers
from lora_gui.ui.tabs import queue_handlers as queued
from lora_gui.ui.tabs import train_handlers as handle
from lora_gui.ui.tabs import train_prediction_handlers as prediction

SIDE_MIN_WIDTH = 420  # px: below two of these the columns stack (one column on narrow screens)
SAMPLED_TASKS = ("image", "video")  # runs that write samples: pictures, or mp4 clips


def _plan_details() -> dict[str, Any]:
    with gr.Accordion("Predicted peak by category and micro-batch per bucket", open=False,
                      elem_id="plan-details"):
        chart = gr.Plot(label="Predicted peak by category", elem_id="predicted-chart")
        table = gr.Dataframe(headers=["bucket", "micro-batch"], label="Micro-batch per bucket",
                             interactive=False, elem_id="predicted-buckets")
    return {"chart": chart, "table": table}


def _run_panel() -> dict[str, Any]:
    """The run's status with progress and ETA, its charts (updated in place on the page) and
    events (the finished run's summary shows in the status when it ends)."""
    status = gr.Markdown(value=handle.status_text, elem_id="status")  # at each page load
    chart_panel = live_panel.charts_panel()
    events = gr.Textbox(label="Events", lines=4, max_lines=8, interactive=False, elem_id="events")
    with gr.Accordion("More charts", open=False, elem_id="more-charts") as more:
        live_panel.step_peak_panel()
        smoothing = gr.Slider(0.0, 0.99, value=0.6, step=0.01, label="Loss smoothing (EMA weight)",
                              elem_id="loss-smoothing")
    return {"status": status, "charts": chart_panel, "smoothing": smoothing, "events": events,
            "more": more}


def _sized(chart_id: str, spec: charts.Spec) -> charts.Spec:
    """A chart sized for the run panel (the peak per step, in its own accordion, keeps its size)."""
    traces, layout = spec
    if chart_id == live_panel.STEP_PEAK:
        return spec
    # the chart's own margins: room for its legend below and a right-hand axis's title
    return traces, {**layout, "height": live_panel.CHART_HEIGHT}


def _views(part: str, key: tuple, specs: tuple) -> dict[str, live_charts.ChartView]:
    """The charts of one state (``key``) of the job as every page's tick answers them (made once)."""
    ids = (live_panel.CHART_IDS[0],) if part == "timeline" else live_panel.CHART_IDS[1:]
    return {chart_id: live_charts.ChartView(key, *_sized(chart_id, spec))
            for chart_id, spec in zip(ids, specs)}


PAGES = live_charts.PageCursors()  # what each open page holds of each chart
TEXTS = live.PageMemory()  # the samples each open page was last sent


def poll(smoothing: float = 0.0, seen: str | None = None, request: gr.Request | None = None) -> tuple:
    """The timer's tick for one page, one event: the new points of the run's charts (all of them
    for a page that holds none), status, events and sample pictures of the job every page shows;
    what this page already holds is not sent again."""
    page = request.session_hash if request is not None else None
    (_, timeline), (_, steps) = handle.live_charts(smoothing, finish=_views)
    answer = PAGES.answer(page, seen, {**timeline, **steps})
    status, log = handle.live_status()
    if common.MANAGER.job is None:
        # the page loaded with this status and no job goes back to none: a tick sent before Start
        # and answered after it must not put "No training yet" back beside "Started"
        status = gr.skip()
    pictures = handle.sample_gallery()
    # gradio rebuilds a component for each gr.skip() it is given (1-4 ms of the server's CPU per
    # tick and page, the gallery's the most): what is small is sent as it is instead, and charts
    # with nothing new get back the page's own "seen N" (no change on the page)
    charts_out = str(seen) if answer is None else answer
    unchanged = not TEXTS.changed(page, "gallery", tuple(pictures))
    gallery = (gr.skip() if pictures else []) if unchanged else pictures
    return (charts_out, status, log, gallery)


def _top_bar(default: str, names: list[str], values: dict[str, Any]) -> dict[str, Any]:
    with gr.Row():
        preset = gr.Dropdown(names, value=default, label="Preset", elem_id="preset", min_width=160)
        run_name = gr.Textbox(value=default, label="Run name (a folder under runs/)", elem_id="run-name",
                              min_width=160)
        card = gr.Dropdown(common.card_choices(), value=common.CUSTOM_CARD,
                           label="GPU card (sets the budget)",
                           elem_id="card", min_width=220, scale=2)
        budget = forms.build_fields(forms.BUDGET_FIELDS, values, per_row=0, min_width=120)
        processes = gr.Number(value=max(1, common.gpu_count()), precision=0, elem_id="processes",
                              label="Processes (one per GPU; started with accelerate launch)",
                              visible=common.gpu_count() > 1)
        sharing = gr.Radio(list(gpu_share.CHOICES), value=gpu_share.REPLICATED, label="Several GPUs",
                           info=gpu_share.HELP, elem_id="sharing", visible=common.gpu_count() > 1)
    gr.Markdown(common.budget_note(), elem_id="budget-note")
    return {"preset": preset, "run_name": run_name, "card": card, "processes": processes,
            "sharing": sharing, "budget": budget}


def _buttons() -> dict[str, Any]:
    with gr.Row():
        start = gr.Button("Start", variant="primary", elem_id="start", min_width=100)
        enqueue = gr.Button("Add to queue", elem_id="enqueue", min_width=100)
        stop = gr.Button("Stop", elem_id="stop", min_width=100)
        resume = gr.Button("Resume", elem_id="resume", min_width=100)
        longest = gr.Button("Longest that fits", elem_id="longest", min_width=140)
    message = gr.Markdown(elem_id="message")
    with gr.Row(visible=False) as confirm:
        overwrite = gr.Button("Overwrite that run", variant="stop", elem_id="confirm-overwrite")
        resume_that = gr.Button("Resume that run", elem_id="confirm-resume")
        cancel = gr.Button("Cancel", elem_id="confirm-cancel")
    return {"start": start, "stop": stop, "resume": resume, "longest": longest, "message": message,
            "confirm": confirm, "overwrite": overwrite, "resume_that": resume_that, "cancel": cancel,
            "enqueue": enqueue}


def _lower_section(values: dict[str, Any]) -> dict[str, Any]:
    """Below the settings groups: the data upload, Save as preset, the sample pictures."""
    upload = gr.File(label="Upload a text data file (.txt, .jsonl, .csv)", elem_id="upload",
                     file_types=[".txt", ".jsonl", ".csv"], visible=values["task"] == "text", height=120)
    with gr.Accordion("Save these settings as a preset", open=False):
        with gr.Row():
            preset_name = gr.Textbox(label="Preset name", elem_id="save-preset-name")
            preset_note = gr.Textbox(label="What it is for (first line of the file)")
            save = gr.Button("Save as preset", elem_id="save-preset")
        save_message = gr.Markdown(elem_id="save-preset-message")
    gallery = gr.Gallery(label="Samples (a video run's clips play here)", columns=4, height=260,
                         elem_id="samples", visible=values["task"] in SAMPLED_TASKS)  # a text run draws none
    return {"upload": upload, "preset_name": preset_name, "preset_note": preset_note, "save": save,
            "save_message": save_message, "gallery": gallery}


def _wire_run_buttons(buttons: dict[str, Any], form: forms.Form, inputs: set, run_name: gr.Textbox,
                      processes: gr.Number, sharing: gr.Radio, status: gr.Markdown) -> None:
    """Start / Overwrite / Resume (each refused with the field marked when a setting is bad),
    Cancel and Stop; each updates the run's status line at once (not at the next tick), so
    "Started" never stands beside "No training yet"."""
    message, confirm = buttons["message"], buttons["confirm"]

    def start_as(how: str):
        def go(data: dict) -> dict:
            text, errors, ask = handle.start(data[run_name], data[processes], form.named(data), how,
                                             data[sharing])
            return {message: text, confirm: gr.update(visible=ask), status: handle.status_text(),
                    **forms.error_updates(form, errors)}
        return go

    start_out = [message, confirm, status, *form.errors.values()]
    buttons["start"].click(start_as(handle.START_NEW), {run_name, *inputs}, start_out)
    buttons["overwrite"].click(start_as(handle.START_OVERWRITE), {run_name, *inputs}, start_out)
    for button in (buttons["resume"], buttons["resume_that"]):
        button.click(start_as(handle.START_RESUME), {run_name, *inputs}, start_out)
    buttons["cancel"].click(lambda: ("", gr.update(visible=False)), None, [message, confirm])

    def enqueue(data: dict) -> dict:  # the same form -> settings path and messages as Start
        text, errors = queued.add_from_form(data[run_name], data[processes], form.named(data),
                                            data[sharing])
        return {message: text, confirm: gr.update(visible=False), **forms.error_updates(form, errors)}

    buttons["enqueue"].click(enqueue, {run_name, *inputs}, start_out)
    buttons["stop"].click(lambda: (handle.stop(), handle.status_text()), None, [message, status])


# Seconds between a page's chart updates: each open page costs the server 1.5-2.7 ms of CPU a
# tick, taken from the core the run trains on; every 2 s, as LlamaBoard's monitor and the Compare
# tab refresh, 20 open pages cost the run about half what they did at 1 s (docs/BENCHMARKS.md).
LIVE_TICK_S = 2.0


def tick(smoothing: float = 0.0, seen: str | None = None, message: str | None = None,
         request: gr.Request | None = None) -> tuple:
    """:func:`poll`, and the message under the run buttons cleared once the start or stop it
    speaks of is over (the status line then says how the run ended)."""
    stale = run_status.stale_message(message)
    return (*poll(smoothing, seen, request), gr.skip() if stale is None else stale)


def _wire_timer(plots: dict[str, Any], gallery: gr.Gallery, message: gr.Markdown) -> gr.Timer:
    """Every :data:`LIVE_TICK_S`, one event per page: the run charts' new points, status, events,
    sample pictures and a stale message (a tick of several pages at once runs in parallel: the
    charts are built once for all). The page's charts value says which answer it holds."""
    timer = gr.Timer(LIVE_TICK_S)
    poll_in = [plots["smoothing"], plots["charts"]]
    poll_out = [plots["charts"], plots["status"], plots["events"], gallery]
    # one plain HTTP request per tick, outside the queue (no queue entry and event stream per
    # tick: several times less of the server's CPU for each open page, which shares the run's)
    timer.tick(tick, [*poll_in, message], [*poll_out, message], queue=False, show_progress="hidden")
    plots["smoothing"].release(poll, poll_in, poll_out, queue=False, show_progress="hidden")
    plots["more"].expand(None, js="() => { if (window.loraLive) setTimeout(window.loraLive.draw, 50); }")
    return timer


def build() -> dict[str, Any]:
    names = common.preset_names()
    default = "text-demo" if "text-demo" in names else names[0]
    values = handle.form_values(default)
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=SIDE_MIN_WIDTH):
            top = _top_bar(default, names, values)
            key = forms.build_fields(forms.KEY_FIELDS, values, per_row=5, min_width=140)
            predicted = gr.Markdown(elem_id="predicted")
            buttons = _buttons()
            differs = gr.Markdown(elem_id="differs")
        with gr.Column(scale=2, min_width=SIDE_MIN_WIDTH):
            plots = _run_panel()
            details = _plan_details()
    rest = forms.build_form(values, skip=(*forms.KEY_FIELDS, *forms.BUDGET_FIELDS))
    form = top["budget"].merge(key).merge(rest)
    low = _lower_section(values)
    upload, save, save_message, gallery = low["upload"], low["save"], low["save_message"], low["gallery"]
    preset_name, preset_note = low["preset_name"], low["preset_note"]
    preset, run_name, card, processes = top["preset"], top["run_name"], top["card"], top["processes"]
    message = buttons["message"]
    panel = {"text": predicted, **details}

    sharing = top["sharing"]
    inputs = {processes, sharing, *form.components}
    panel_out = [panel["text"], panel["chart"], panel["table"]]

    def estimate(data: dict, request: gr.Request) -> dict:
        cfg_values = form.named(data)
        prediction.SHOWN_FORMS.mark(request.session_hash, cfg_values, [data[processes], data[sharing]])
        _, errors = handle.config_from_form(cfg_values)
        text, fig, rows = prediction.prediction_view(cfg_values, data[processes], False, data[sharing])
        ready = gr.update(interactive=not errors)  # Start waits while a field is marked
        return {**forms.error_updates(form, errors), panel["text"]: text, panel["chart"]: fig,
                panel["table"]: rows, differs: handle.differs_from_preset(data[preset], cfg_values,
                                                                          data[card]),
                buttons["start"]: ready, buttons["enqueue"]: ready}

    def plan(data: dict, request: gr.Request) -> Iterator[tuple]:
        values = form.named(data)
        shown = [data[processes], data[sharing]]
        for view in prediction.prediction_views(values, *shown):  # the plan, then its hint
            if not prediction.SHOWN_FORMS.is_current(request.session_hash, values, shown):
                yield (gr.update(),) * len(view)  # the page's settings changed while this planned
                return
            yield view

    def fill(name: str, card_name: str, request: gr.Request) -> dict:
        prediction.SHOWN_FORMS.mark(request.session_hash, {"preset": name}, None)  # a plan in flight is stale
        filled = handle.form_values(name)
        budget = common.card_budget_gb(card_name)
        if budget is not None:  # the picked card stays the budget across presets
            filled["budget_gb"] = budget
        kind = handle.image_kind(filled["task"], filled["model"])
        updates = forms.visibility(form, filled["task"], kind)  # one update per widget: value, visible
        for key_name, value in filled.items():
            if key_name in form.widgets:
                updates[form.widgets[key_name]] = {**updates[form.widgets[key_name]], "value": value}
        return {**updates, **forms.error_updates(form, {}),
                run_name: name, upload: gr.update(visible=filled["task"] == "text"),
                gallery: gr.update(visible=filled["task"] in SAMPLED_TASKS),
                panel["text"]: f"Predicting for the preset **{name}**…", panel["chart"]: None,
                panel["table"]: [], differs: ""}  # nothing of the previous preset's plan stays

    def on_task(task: str, model: str) -> dict:
        kind = handle.image_kind(task, model)
        return {**forms.visibility(form, task, kind), upload: gr.update(visible=task == "text"),
                gallery: gr.update(visible=task in SAMPLED_TASKS)}

    def model_for_task(task: str, model: str) -> Any:
        new = input_checks.model_for_task(task, model)
        return gr.update() if new is None else gr.update(value=new)

    def on_card(card_name: str) -> Any:
        budget = common.card_budget_gb(card_name)
        return gr.update() if budget is None else budget

    estimate_in = {preset, card, *inputs}
    estimate_out = [*form.errors.values(), *panel_out, differs, buttons["start"], buttons["enqueue"]]
    fill_out = [*form.components, *form.layout, *form.errors.values(), run_name, upload, gallery,
                *panel_out, differs]
    # in the browser first (no round trip): the previous preset's plan leaves the panel at once,
    # not when the server has loaded the new preset (seconds on a busy machine)
    preset.change(None, preset, panel["text"], js="(name) => `Predicting for the preset **${name}**…`")
    preset.change(fill, [preset, card], fill_out).then(estimate, estimate_in, estimate_out).then(
        plan, inputs, panel_out, concurrency_limit=1, concurrency_id="plan")
    card.change(on_card, card, form.widgets["budget_gb"]).then(
        estimate, estimate_in, estimate_out).then(plan, inputs, panel_out, concurrency_limit=1,
                                                  concurrency_id="plan")
    form.widgets["budget_gb"].input(lambda: common.CUSTOM_CARD, None, card)
    task_model = [form.widgets["task"], form.widgets["model"]]
    # a bundled model of another task becomes the new task's (builtin -> builtin:video for video)
    form.widgets["task"].input(model_for_task, task_model, form.widgets["model"])
    gr.on([form.widgets["task"].change, form.widgets["model"].blur], on_task, task_model,  # model: typed
          [*form.components, *form.layout, upload, gallery])
    # typed values come as input events; a value set at once (pasted, autofilled, a test's fill)
    # raises no input event in a textbox, so a textbox's change counts too
    typed = [w.change for w in form.components if isinstance(w, gr.Textbox)]
    gr.on([*(w.input for w in [*form.components, processes, sharing]), *typed], estimate, estimate_in,
          estimate_out, trigger_mode="always_last").then(plan, inputs, panel_out, concurrency_limit=1,
                                           concurrency_id="plan", trigger_mode="always_last")

    _wire_run_buttons(buttons, form, inputs, run_name, processes, sharing, plots["status"])

    filled = [form.widgets[k] for k in longest_handlers.FILLED if k in form.widgets]

    def fill_longest(data: dict) -> dict:
        values, text = longest_handlers.fill_form(form.named(data))
        return {message: text, **{form.widgets[k]: v for k, v in values.items() if k in form.widgets}}

    buttons["longest"].click(fill_longest, inputs, [message, *filled], concurrency_limit=1,
                             concurrency_id="plan").then(estimate, estimate_in, estimate_out).then(
        plan, inputs, panel_out, concurrency_limit=1, concurrency_id="plan")

    def uploaded(path: str | None) -> tuple:
        value, text = handle.use_upload(path)
        return (gr.update() if value is None else value), text

    upload.upload(uploaded, upload, [form.widgets["data"], message])
    save_event = save.click(lambda d: handle.save_as_preset(d[preset_name], form.named(d), d[preset_note]),
                            {preset_name, preset_note, *form.components}, save_message)
    timer = _wire_timer(plots, low["gallery"], message)
    return {"preset": preset, "form": form, "inputs": inputs, "estimate": estimate, "plan": plan,
            "estimate_in": estimate_in, "estimate_out": estimate_out, "panel_out": panel_out,
            "start": buttons["start"], "status": plots["status"], "message": message,
            "longest": buttons["longest"], "saved": save_event, "save_message": save_message,
            "timer": timer, "card": card}
