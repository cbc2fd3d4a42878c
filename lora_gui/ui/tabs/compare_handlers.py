"""Compare tab handlers: the instant predicted comparison for a preset and model, measured rows
as a background job (the one JobManager job), saved comparisons under runs/ reloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lora_gui.config import ConfigError
from lora_gui.engine.compare.results import load_results
from lora_gui.errors import clip
from lora_gui.ui import charts, common
from lora_gui.units import GB, gb, gb_value

TABLE_COLUMNS = ("mode", "size", "status", "batch", "predicted GB", "run's plan GB", "measured GB",
                 "source", "tokens or images /s", "eval loss", "message")
PRESET_MODEL = "the preset's model"


def model_choices() -> list[str]:
    from lora_gui.memory.predict.model_configs import bundled_models

    return [PRESET_MODEL, "builtin", *bundled_models()]


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in str(text or "").split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"sizes: {clip(text)} is not a comma-separated list of whole numbers") from None
    return sizes


def predicted_rows(preset: str, model: str, sizes: str = "") -> list[dict[str, Any]]:
    from lora_gui.engine.compare.instant import instant_rows

    chosen = None if model in (None, "", PRESET_MODEL) else model
    return instant_rows(common.preset_config(preset), chosen, tuple(_sizes(sizes)) or None)


def _gb(value: Any) -> float | None:
    return gb_value(value) if value else None


def table(predicted: list[dict[str, Any]], measured: list[dict[str, Any]]) -> list[list[Any]]:
    """One line per mode and size: the prediction next to the measured row when there is one.

    "predicted GB" stays the figure shown before Measure (the planner for a CUDA GPU in bf16); a
    measured row's own plan (the planner for this machine and precision, which its run made) is
    a column of its own, so no predicted value changes under the user's eyes.

    Measured lines come first, in the order they were measured: the table scrolls (the page
    draws only its first rows), and a measurement below 36 predicted lines would be missed."""
    def size(r: dict[str, Any]) -> int:
        return r.get("seq_len") or r.get("resolution")

    shown = ("memory", "variants")  # the variants' rows: mode = the adapter
    done = {(r["mode"], size(r)): r for r in measured if r.get("question", "memory") in shown}
    beside = {(p["mode"], size(p)): p for p in predicted}
    lines = []
    for key, m in done.items():
        p = beside.pop(key, None) or {}
        speed = m.get("real_tokens_per_s") or m.get("images_per_s")
        lines.append([m["mode"], size(m), m.get("status"), m.get("batch_size") or p.get("batch_size"),
                      _gb(p.get("peak_bytes")), _gb(m.get("predicted_peak_bytes")),
                      _gb(m.get("peak_bytes")), m.get("memory_source"), round(speed, 2) if speed else None,
                      _loss(m.get("eval_loss")), m.get("message") or p.get("message")])
    for p in beside.values():  # sizes and modes nothing measured yet
        lines.append([p["mode"], size(p), "predicted", p["batch_size"], _gb(p.get("peak_bytes")), None, None,
                      "predicted", None, None, p.get("message")])
    return lines


def _loss(value: Any) -> Any:
    """A loss as the table shows it: four decimals (the runs differ in the second or third)."""
    return round(value, 4) if isinstance(value, float) else value


def with_card(fig: Any, card: str | None) -> Any:
    """Draws the picked card's memory (GB, as the driver reports it) as a line on a peak-GB
    chart; the chart is returned as it was without a card."""
    from lora_gui.cards import card_by_name

    if fig is None or not card or card == common.CUSTOM_CARD:
        return fig
    try:
        picked = card_by_name(card)
    except ValueError:
        return fig
    from lora_gui.ui import chart_style

    card_gb = picked.total_bytes / GB
    top = chart_style.finite_max(*[[y for y in (trace.y or ()) if y is not None] for trace in fig.data])
    if chart_style.is_far_above(card_gb, top):  # a line there would flatten every bar
        fig.add_annotation(**chart_style.off_scale_note(picked.name, picked.total_bytes))
        return fig
    fig.add_hline(y=card_gb, line_dash="dot", line_color="black",
                  annotation_text=f"{picked.name}: {gb(picked.total_bytes)}")
    return fig


def instant(preset: str, model: str, sizes: str = "", card: str | None = None,
            ) -> tuple[str, Any, Any, list[list[Any]]]:
    """(message, grouped bars, lines per mode, table) of the predicted comparison, with the
    picked card's memory drawn on both charts."""
    try:
        rows = predicted_rows(preset, model, sizes)
    except (ValueError, *common.USER_ERRORS) as err:
        return f"Error: {err}", None, None, []
    ok = [r for r in rows if r["status"] == "ok"]
    what = "resolution" if rows and rows[0].get("seq_len") is None else "sequence length"
    message = (f"**Predicted** (source: predicted; planner estimates for a CUDA GPU in bf16, nothing "
               f"was trained): {len(ok)} of {len(rows)} rows, per {what}. Press Measure to train "
               "real rows on this machine.")
    return (message, with_card(charts.compare_bars(rows, "memory", "full"), card),
            with_card(charts.mode_lines(rows), card), table(rows, []))


def default_out(preset: str) -> str:
    return f"compare-{preset}"


def measure(preset: str, sizes: str, steps: Any, out_name: str, variants: list[str] | None = None) -> str:
    """Starts the quick measured comparison (or, with ``variants``, the adapter variants side by
    side at the first length) as the one background job (refused while a training job runs,
    naming it)."""
    from lora_gui.config import apply_overrides
    from lora_gui.engine.compare import quick

    try:
        lengths = _sizes(sizes)
        if not lengths:
            raise ConfigError("sizes: give at least one length (text) or resolution (image)")
        base = common.preset_config(preset)
        n_steps = int(steps or quick.QUICK_STEPS)
        if base.task == "image":  # refused here, before a job starts, naming the bad value
            for res in lengths:
                apply_overrides(base, {"resolution": res}, where="resolutions")
        else:
            quick.quick_settings(lengths, n_steps)
        out = common.runs_root() / common.check_run_name(out_name or default_out(preset))
        if variants:
            return _measure_variants(base, variants, lengths[0], n_steps, out)

        def work(job) -> dict[str, Any]:
            return quick.run_quick(base, lengths, out, steps=n_steps, stop=job.control.stop,
                                   on_row=job.add_record)

        job = common.MANAGER.start_work(out.name, out, base, "compare", work)
        job.total_steps = quick.expected_rows(base, lengths)  # the progress bar's total (rows)
    except (ValueError, *common.USER_ERRORS) as err:
        return f"Error: {err}"
    return f"Measuring **{job.name}** into `{out}` (rows appear below as they finish)"


def _measure_variants(base: Any, variants: list[str], seq_len: int, steps: int, out: Path) -> str:
    from lora_gui.engine.compare.variants import parse_variants, run_variants

    chosen = parse_variants(",".join(variants))
    if base.task != "text":
        raise ConfigError(f"variants: compared on text runs; the preset is a {base.task} run")

    def work(job) -> dict[str, Any]:
        return run_variants(base, chosen, out, seq_len=seq_len, steps=steps, stop=job.control.stop,
                            on_row=job.add_record)

    job = common.MANAGER.start_work(out.name, out, base, "compare", work)
    job.total_steps = len(chosen)
    return (f"Measuring **{job.name}**: {', '.join(chosen)} at length {seq_len}, {steps} steps each, "
            f"into `{out}` (rows appear below as they finish)")


def stop() -> tuple[str, None]:
    """The Compare tab's Stop: stops a comparison being measured, never a training run started
    from the Train tab. It also clears the page's record of what it last drew, so the next tick
    writes the job's status line again over this message (a comparison that had already finished
    shows "completed" again, not "nothing to stop")."""
    job = common.MANAGER.job
    if job is None or job.kind != "compare" or not job.running:
        return "No comparison is being measured.", None
    return common.MANAGER.stop(), None


def saved_comparisons() -> list[str]:
    root = common.runs_root()
    return sorted(p.parent.name for p in root.glob("*/compare.json")) if root.is_dir() else []


def measured_rows(out_name: str) -> list[dict[str, Any]]:
    if not out_name:
        return []
    try:
        return load_results(common.runs_root() / common.check_run_name(out_name))["rows"]
    except common.USER_ERRORS:
        return []


def progress(preset: str, model: str, sizes: str, out_name: str, seen: Any = None,
             card: str | None = None) -> tuple[str, Any, Any, list[list[Any]], Any]:
    """The timer's tick: the measuring job's progress, and the measured rows beside the predicted.

    ``seen`` is this page's own record of what it last drew (a gr.State: every open page, and a
    reloaded one, gets the rows even when another page has already drawn them); charts are
    rebuilt only when it changes, so a loaded comparison is left alone meanwhile."""
    import gradio as gr

    job = common.MANAGER.job
    keep = (gr.update(),) * 4
    if job is None or job.kind != "compare":
        return (*keep, seen)
    measured = measured_rows(job.name)
    now = [job.name, job.status, len(measured), preset, model, sizes, out_name, card]
    if seen == now:
        return (*keep, seen)
    total = job.total_steps or 0
    filled = round(20 * min(len(measured), total) / max(total, 1))
    status = (f"**{job.name}**: {job.status} · `{'█' * filled}{'░' * (20 - filled)}` "
              f"{min(len(measured), total)}/{total} rows")
    if job.error:
        status += f"\n\nError: {job.error}"
    try:
        predicted = predicted_rows(preset, model, sizes)
    except (ValueError, *common.USER_ERRORS):
        predicted = []
    both = predicted + [{**r, "mode": f"{r['mode']} (measured)"} for r in measured if r.get("peak_bytes")]
    # once rows are measured, the bars are theirs (their data and lengths: the predicted bars are
    # of other lengths and would leave the measured ones out); the lines keep both
    done = [r for r in measured if r.get("question", "memory") == "memory" and r.get("peak_bytes")]
    bars = charts.compare_bars(done, "memory", done[0]["data"]) if done else \
        charts.compare_bars(predicted, "memory", "full")
    return (status, with_card(bars, card),
            with_card(charts.mode_lines(both), card), table(predicted, measured), now)


def measured_header(measured: list[dict[str, Any]]) -> str | None:
    """The header once rows were measured (None before): predicted rows beside measured ones,
    the measured rows' sources named."""
    done = [r for r in measured if r.get("peak_bytes")]
    if not done:
        return None
    sources = ", ".join(sorted({str(r.get("memory_source")) for r in done}))
    return (f"**Predicted and measured**: {len(done)} row(s) trained on this machine (source: "
            f"{sources}) beside the planner's predictions (source: predicted). "
            "\"predicted GB\" is the estimate for a CUDA GPU in bf16 shown before Measure; \"run's plan "
            "GB\" is the plan each measured run made for this machine and precision.")


def progress_and_header(preset: str, model: str, sizes: str, out_name: str, seen: Any = None,
                        card: str | None = None) -> tuple:
    """The timer's tick (:func:`progress`) plus the header, which says "measured" once rows are."""
    import gradio as gr

    out = progress(preset, model, sizes, out_name, seen, card)
    job = common.MANAGER.job
    header = measured_header(measured_rows(job.name)) if job is not None and job.kind == "compare" else None
    return (*out, gr.update() if header is None or out[-1] == seen else header)


def load_saved(name: str) -> tuple[str, Any, Any, list[list[Any]]]:
    """A saved comparison (runs/NAME/compare.json): bars, lines and table of its rows."""
    try:
        rows = load_results(common.runs_root() / common.check_run_name(name))["rows"]
    except common.USER_ERRORS as err:
        return f"Error: {err}", None, None, []
    data = rows[0]["data"] if rows else "corpus"
    memory = [r for r in rows if r["question"] == "memory" and r["data"] == data]
    sources = ", ".join(sorted({str(r.get("memory_source")) for r in rows}))
    return (f"{len(rows)} rows from `{Path(name) / 'compare.json'}` (sources: {sources})",
            charts.compare_bars(rows, "memory", data), charts.mode_lines(memory), table([], memory))
