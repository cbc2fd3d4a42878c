"""The Train form's prediction panel: the instant estimate, then the plan the run itself makes
when it starts (memory/predict: ``predict``, same function, same inputs), the verdict against the
budget and its gauge, what to switch when it does not fit, the fewest layers a checkpointing run
could checkpoint, and which page's settings a plan still belongs to. Figures in GB (``gb``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lora_gui.config import RunConfig
from lora_gui.ui import charts, common, gpu_share, live
from lora_gui.ui.tabs.train_handlers import check_processes, config_from_form
from lora_gui.units import GB, gb


def _verdict(peak: int, budget: int | None, plan: Any) -> str:
    if not budget:
        return "no budget set"
    fits = plan.fits if plan is not None else peak <= budget
    return "**fits** the budget" if fits and peak <= budget else "**does not fit** the budget"


def _switch_hints(cfg: RunConfig, plan: Any) -> list[str]:
    """What to switch when the run does not fit: the planner's suggestions, else the switches
    that are still off."""
    if plan is not None and plan.suggestions:
        return [f"{s.switch}: {gb(s.peak_bytes)}{' (fits)' if s.fits else ''}"
                for s in plan.suggestions]
    hints = []
    if cfg.mode == "traditional":
        hints.append("mode: optimized (adaptive batch under the budget)")
    if not cfg.gradient_checkpointing:
        hints.append("gradient_checkpointing: on")
    hints.append("a smaller batch_size" + (", resolution" if cfg.task == "image" else ", max_seq_len"))
    return hints


PLANS = live.SharedView(keep=16)  # the plans of the last settings asked for, shared by every page


def _inputs_stamp(values: dict[str, Any]) -> tuple:
    """Size and modification time of the data and model the settings name (a plan reads them)."""
    stamp = []
    for name in ("data", "model"):
        try:
            info = Path(str(values.get(name) or "")).expanduser().stat()
            stamp.append((info.st_size, info.st_mtime_ns))
        except (OSError, ValueError):
            stamp.append(None)
    return tuple(stamp)


def prediction_view(values: dict[str, Any], processes: Any, exact: bool,
                    sharing: str = gpu_share.REPLICATED) -> tuple[str, Any, list]:
    """(text, breakdown figure, [bucket, micro-batch] rows) for the form as it stands.

    exact=False: the instant closed-form estimate; exact=True: the plan the run itself makes
    when it starts (same function, same inputs), with the faster-within-the-budget line when
    there is one (:func:`prediction_views` shows the plan before that line is found)."""
    if exact:
        *_, view = prediction_views(values, processes, sharing)
        return view
    return _prediction_view(values, processes, exact, sharing)[0]


def _batch_and_speed(pred: Any) -> str:
    """Which micro-batch the figure is for (the quick estimate says which choice it shows) and
    the speed the run's plan predicts beside its peak (tokens/s, MFU)."""
    step = pred.step
    info = step.info if step is not None else {}
    lines = []
    if pred.how == "estimate" and info.get("batch_choice"):
        lines.append(f"Micro-batch {info.get('batch_size', '?')} at {info.get('seq_len', '?')} tokens: "
                     f"{info['batch_choice']}.")
    figures = pred.figures or {}
    if figures.get("predicted_tokens_per_s"):
        mfu = figures.get("predicted_mfu")
        lines.append(f"Predicted speed: **{figures['predicted_tokens_per_s']:,.0f} tokens/s**"
                     + (f", MFU {mfu:.1%}" if mfu else "")
                     + " (step time measured on this machine; the run records the measured speed beside it).")
    from lora_gui.memory.predict.report import depth_lines

    for line in depth_lines(figures):  # the layers a checkpointing run's plan chose to checkpoint
        lines.append(f"{line.strip()[0].upper()}{line.strip()[1:]}.")
    return "".join("\n\n" + line for line in lines)


def prediction_views(values: dict[str, Any], processes: Any,
                     sharing: str = gpu_share.REPLICATED) -> Iterator[tuple[str, Any, list]]:
    """The run's own plan for the form, then, when a checkpointing run has room in its budget, the
    same with the fewest layers it could checkpoint: that search makes a few more plans (about
    log2(layers)), so the plan is on screen while it runs. Pages that ask with the same settings
    (and the same data and model files) share one of each."""
    key = (json.dumps([values, processes, sharing], sort_keys=True, default=str), _inputs_stamp(values))
    view, hint_args = PLANS.get(key, lambda: _prediction_view(values, processes, True, sharing))
    yield view
    if hint_args is not None:
        hint = PLANS.get((key, "faster"), lambda: _faster_hint(*hint_args))
        if hint:
            yield (view[0] + hint, *view[1:])


def _prediction_view(values: dict[str, Any], processes: Any, exact: bool,
                     sharing: str = gpu_share.REPLICATED) -> tuple[tuple[str, Any, list], tuple | None]:
    """(the view, the faster-within-the-budget search's arguments or None)."""
    from lora_gui.memory.predict import estimate, predict

    cfg, errors = config_from_form(values)
    if cfg is None:
        # the message stands beside its field: said once, there
        return ("Prediction waits for valid settings (the setting marked ⚠).", None, []), None
    budget = int(cfg.budget_gb * GB) or None
    try:
        n = check_processes(processes, cfg.task)
        parallel = gpu_share.parallel_from_form(n, sharing, "processes")
        gpu_share.check_for_run(parallel, cfg.task, cfg.quantization)
        # the quick estimate is one GPU's; the run's own plan is per GPU, as `plan --world-size N`
        pred = predict(cfg, **gpu_share.predict_kwargs(parallel)) if exact else estimate(cfg)
    except (ValueError, NotImplementedError, RuntimeError, *common.USER_ERRORS) as err:
        return (f"No prediction for these settings: {err}", None, []), None
    if not exact and cfg.task == "image":  # the closed form misses pictures' activations by far
        return ("Planning the run on its pictures… (the run's own plan follows in a few seconds; "
                "no quick estimate is shown for pictures: it is too rough to say whether a run fits)",
                None, []), None
    how = ("the run's own plan" if exact else "quick estimate for one GPU; the run's own plan follows "
           "in a moment")
    text = (f"Predicted peak: **{gb(pred.peak_bytes)}** (source: predicted, {how}, "
            f"{pred.device}) — {_verdict(pred.peak_bytes, budget, pred.plan)}")
    if budget:
        text += f" of {gb(budget)}"
        if common.gpu_total_gb() is None:
            text += " (simulated: no GPU here)"
    if budget:
        text += "\n\n" + gauge(pred.peak_bytes, budget)
    text += _batch_and_speed(pred)
    hint_args = None
    if budget and pred.peak_bytes > budget:
        text += "\n\nTo fit, switch:\n" + "\n".join(f"- {h}" for h in _switch_hints(cfg, pred.plan))
    elif budget and exact and cfg.gradient_checkpointing and not parallel.fsdp:  # the search is DDP's
        hint_args = (cfg, budget, n, pred)
    note = gpu_share.parallel_note(parallel, pred.step) if exact and pred.step else ""
    if note:
        text += "\n\n" + note
    step = pred.step
    figure = charts.breakdown_figure(step.breakdown, step.cuda_overheads, budget) if step else None
    rows = [[f"{bucket} tokens" if cfg.task == "text" else f"{bucket} px", batch]
            for bucket, batch in pred.bucket_batches]
    return (text, figure, rows), hint_args


def _faster_hint(cfg: RunConfig, budget: int, processes: int, pred: Any) -> str:
    """The fewest layers a checkpointing run can checkpoint within the budget (the run's own
    plan, the same micro-batches), or nothing."""
    from lora_gui.memory.predict.run import fewest_checkpointed_layers

    try:
        found = fewest_checkpointed_layers(cfg, budget, pred.device, processes, now=pred)
    except (ValueError, NotImplementedError, RuntimeError, *common.USER_ERRORS):
        return ""  # the prediction above stands; the hint is only a hint
    if found is None:
        return ""
    n, faster = found
    unit = "block" if cfg.task == "video" else "layer"
    return (f"\n\nFaster within the budget: **checkpoint_layers {n}** (the first "
            f"{unit if n == 1 else f'{n} {unit}s'} recompute, the others keep their activations): "
            f"{gb(faster.peak_bytes)} predicted, the same micro-batches.")


def gauge(peak: int, budget: int, cells: int = 30) -> str:
    """The predicted peak against the budget as one text bar (█ used, ░ free, ▓ over)."""
    share = peak / budget
    used = min(cells, round(cells * share))
    over = "▓" * min(10, round(cells * (share - 1))) if share > 1 else ""
    return (f"`{'█' * used}{'░' * (cells - used)}{over}` {share:.0%} of the budget "
            f"({gb(peak, unit=False)} / {gb(budget)}, predicted)")


class ShownForms:
    """The settings each open page last asked an estimate for, by page (Gradio's session hash).

    A plan takes seconds; if the page's settings changed meanwhile, its plan belongs to settings
    the page no longer shows. It is then dropped: the newer settings' estimate stays until their
    own plan arrives, so "the run's own plan" never stands beside an older plan's figure."""

    def __init__(self, keep: int = 256) -> None:
        self._latest: dict[str, str] = {}  # page -> settings key, oldest page first
        self._keep = keep  # pages remembered; an older page's plan is simply shown
        self._lock = threading.Lock()  # Gradio runs handlers of several pages on worker threads

    @staticmethod
    def _key(values: dict[str, Any], processes: Any) -> str:
        return json.dumps([values, processes], sort_keys=True, default=str)

    def mark(self, page: str | None, values: dict[str, Any], processes: Any) -> None:
        if page is None:
            return
        key = self._key(values, processes)
        with self._lock:
            self._latest.pop(page, None)
            self._latest[page] = key
            while len(self._latest) > self._keep:
                self._latest.pop(next(iter(self._latest)))

    def is_current(self, page: str | None, values: dict[str, Any], processes: Any) -> bool:
        with self._lock:
            latest = self._latest.get(page) if page is not None else None
        return latest is None or latest == self._key(values, processes)


SHOWN_FORMS = ShownForms()
