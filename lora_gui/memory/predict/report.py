"""One report of a plan for both front ends: the budget a plan is judged against, the lines
``python -m lora_gui plan`` prints, the JSON it writes and the rows the dashboard's tables show.
Every figure is the planner's (source: predicted)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from lora_gui.cards import card_by_name
from lora_gui.config import ConfigError, RunConfig
from lora_gui.memory.predict.planner import MAX_BUDGET_BYTES
from lora_gui.memory.predict.run import Prediction
from lora_gui.units import GB, GIB, gb


@dataclass(frozen=True)
class Budget:
    """The memory a plan is judged against: ``bytes`` and where the figure came from."""

    bytes: int
    source: str

    def label(self, per: str = "") -> str:
        """In decimal GB (1e9 bytes), the unit of every figure shown, e.g.
        '4.00 GB per GPU (--budget-gb)'."""
        return f"{gb(self.bytes)}{per} ({self.source})"


def resolve_budget(cfg: RunConfig, budget_gb: float | None = None, card: str | None = None,
                   gpu_total_bytes: int | None = None, budget_from: str = "budget given",
                   budget_gib: float | None = None) -> Budget | None:
    """The budget of a plan, in the order a user expects: a card picked by name, a budget typed
    in GB (or GiB), the run's own ``budget_gb``, this machine's GPU; with none of them, no
    budget (None), as a run without one.

    Raises:
        ConfigError: an unknown card (the message lists the known ones), a budget out of range,
            or more than one budget given.
    """
    given = [name for name, value in (("card", card), ("budget in GB", budget_gb),
                                      ("budget in GiB", budget_gib)) if value is not None]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)}: give one budget, not several")
    if budget_gib is not None:
        budget_gb, budget_from = budget_gib * GIB / GB, budget_from.replace("-gb", "-gib")
    if card:
        try:
            found = card_by_name(card)
        except ValueError as err:
            raise ConfigError(f"card: {err}") from None
        return Budget(found.total_bytes, f"card {found.name}: {found.label}, the memory torch reports for it")
    if budget_gb is not None:
        if not 0 < budget_gb * GB <= MAX_BUDGET_BYTES:  # also catches nan
            raise ConfigError(f"{budget_from} {budget_gb:g}: the budget must be more than 0 and at most "
                              f"{MAX_BUDGET_BYTES / GB:g} GB")
        return Budget(int(budget_gb * GB), budget_from)
    if cfg.budget_gb:
        return Budget(int(cfg.budget_gb * GB), "budget_gb setting")
    if gpu_total_bytes:
        return Budget(gpu_total_bytes, "this GPU")
    return None


@dataclass(frozen=True)
class Question:
    """A plan question resolved as the run resolves it: every entry point (``plan``, the Plan tab,
    the Train form, Compare) predicts ``cfg`` on ``device`` and nothing else.

    Attributes:
        cfg: the run's settings; ``budget_gb`` is the budget the run enforces (a card or a budget
            picked for the plan is written into it, so a run started with these settings plans
            the same micro-batches).
        device: 'cuda' or 'cpu': where the plan's run trains.
        budget: the budget the run enforces (None: the run has none and cuts its micro-batches
            by ``token_budget`` tokens, as a run started without ``budget_gb`` does).
        judged_against: what the verdict compares the peak with: the budget, else this GPU's
            memory (a run with no budget still has to fit the card it runs on); None: no verdict.
        rule: the budget rule in words, for the output.
    """

    cfg: RunConfig
    device: str
    budget: Budget | None
    judged_against: Budget | None
    rule: str

    def settings(self) -> dict[str, Any]:
        """The resolved settings a user passes to ``train`` to run this plan."""
        return {"budget_gb": self.cfg.budget_gb, "device": self.device}


def resolve_question(cfg: RunConfig, *, card: str | None = None, budget_gb: float | None = None,
                     budget_gib: float | None = None, device: str | None = None,
                     gpu_total_bytes: int | None = None, budget_from: str = "budget given") -> Question:
    """The one rule every entry point plans by: a card picked by name or a budget typed in GB
    (GiB) becomes the run's ``budget_gb``; otherwise the run's own ``budget_gb``; with neither,
    no budget, as the run. The device is the one asked for, else a GPU for a card, else where a
    run started here trains.

    Raises:
        ConfigError: an unknown card, a budget out of range, or more than one budget given.
    """
    from lora_gui.memory.predict.run import run_device

    picked = card is not None or budget_gb is not None or budget_gib is not None
    device = device or ("cuda" if card else run_device())
    where = "this CPU (no GPU here: a run started here trains on the CPU)" if device == "cpu" and \
        gpu_total_bytes is None else device
    if picked:
        chosen = resolve_budget(cfg, budget_gb, card, budget_from=budget_from, budget_gib=budget_gib)
        cfg = replace(cfg, budget_gb=chosen.bytes / GB)
        budget = Budget(int(cfg.budget_gb * GB), chosen.source)  # the bytes the run reads from budget_gb
        return Question(cfg, device, budget, budget,
                        f"planned for {where} under {budget.label()}: the run plans the same micro-batches "
                        f"with budget_gb = {cfg.budget_gb}")
    if cfg.budget_gb:
        budget = Budget(int(cfg.budget_gb * GB), "budget_gb setting")
        return Question(cfg, device, budget, budget, f"planned for {where} under the run's budget_gb")
    judged = Budget(gpu_total_bytes, "this GPU") if gpu_total_bytes and device == "cuda" else None
    batches = (f"micro-batches of up to token_budget ({cfg.token_budget:,}) tokens" if cfg.task == "text"
               else "micro-batches from batch_table")
    return Question(cfg, device, None, judged,
                    f"planned for {where} with no budget, as the run (budget_gb = 0): {batches}; pick a "
                    "card or set budget_gb to plan under a budget")


def cuda_rows(cfg: RunConfig, pred: Prediction, budget: Budget | None) -> tuple[list[Any], str | None]:
    """A text plan's CUDA-only memory, one row per kernel (:mod:`lora_gui.memory.predict.cuda_kernels`),
    and why the budget cannot hold even the CUDA context and the frozen weights (None: it can)."""
    step = pred.step
    if step.device != "cuda" or cfg.task != "text":
        return [], None
    from lora_gui.memory.predict import run_plan
    from lora_gui.memory.predict.cuda_kernels import fast_kernel_rows, fixed_shortfall, nccl_rows, step_rows
    from lora_gui.models.fast_kernels import compile_choice, liger_choice

    short = None if budget is None else fixed_shortfall(
        budget.bytes, step.cuda_overheads.get("cuda_context", 0), step.breakdown["frozen_weights"])
    figures = pred.figures or {}
    info = {**step.info, **{k: figures[k] for k in ("batch_size", "seq_len", "mask") if k in figures}}
    rows = step_rows(run_plan.model_config_for(cfg), info, dtype=run_plan.step_kwargs(cfg, "cuda")["dtype"],
                     lora_param_bytes=step.breakdown["lora_params"])
    model_type = getattr(run_plan.model_config_for(cfg), "model_type", None)
    fast = fast_kernel_rows(liger_choice(cfg.liger_kernels, "cuda", model_type).used,
                            compile_choice(cfg.compile_blocks, "cuda").used)
    return rows + nccl_rows(int(step.info.get("world_size", 1))) + fast, short


def plan_json(pred: Prediction, kernels: list[Any] | None = None, short: str | None = None,
              budget: Budget | None = None) -> dict[str, Any]:
    """The `plan --json` object (:func:`lora_gui.memory.predict.run_plan.plan_to_json`) with the
    run's whole peak, its training steps' peak (images) and the prediction's figures; without a
    planner's plan, ``fits`` against ``budget`` (None: no verdict)."""
    from lora_gui.memory.predict.run_plan import plan_to_json

    out = plan_to_json(pred.plan, pred.step, kernels)
    out.update(peak_bytes=pred.peak_bytes, train_peak_bytes=pred.train_peak_bytes,
               prediction=pred.figures or out["prediction"])
    if pred.plan is None:
        out.update(fits=None if budget is None else pred.peak_bytes <= budget.bytes,
                   budget_bytes=None if budget is None else budget.bytes)
    if budget is not None:
        out["budget_source"] = budget.source
    if short:  # the card cannot hold even the context and the weights: say which, by how much
        out.update(fits=False, message=short)
    return out


def text_plan_lines(cfg: RunConfig, pred: Prediction, budget: Budget | None, parallel_label: str,
                    kernels: list[Any] | None = None, short: str | None = None) -> list[str]:
    """What `plan` prints for a text run."""
    step = pred.step
    lines = [f"Predicted peak of one training step on {pred.device}, per GPU with {parallel_label} "
             f"(source: predicted, fake-tensor trace of {cfg.model}): {gb(step.peak_bytes)}"]
    figures = pred.figures
    if figures:
        data = "the run's real data" if figures["from_data"] else "worst case, no data to read"
        rows = f" pairs ({2 * figures['batch_size']} rows)" if cfg.is_preference else ""
        lines.append(f"  peak micro-batch: {figures['batch_size']}{rows} x {figures['seq_len']} tokens, mask "
                     f"{figures['mask']}, attention kernel on {pred.device}: {figures['kernel']} ({data})")
    lines += speed_lines(figures)
    lines += depth_lines(figures)
    lines += [f"  {name:<18} {gb(nbytes):>14}" for name, nbytes in step.breakdown.items()]
    lines += [f"  + {name:<16} {gb(nbytes):>14}  (CUDA-only overhead, not in the trace)"
              for name, nbytes in step.cuda_overheads.items() if nbytes]  # none when planning for a CPU
    if figures and "init_peak_bytes" in figures:  # the lora_init pass before step 1
        above = figures["init_peak_bytes"] > step.peak_bytes
        lines.append(f"lora_init {cfg.lora_init}: its pass before the first step peaks at "
                     f"{gb(figures['init_peak_bytes'])} (source: predicted)"
                     + (": above the steps, the run's predicted peak" if above else ", below the steps")
                     + ("; under FSDP only the main process runs it (it alone holds the whole base)"
                        if step.info.get("fsdp") and step.info.get("world_size", 1) > 1 else ""))
    if step.device == "cuda":
        from lora_gui.memory.predict.cuda_kernels import card_figures, describe_rows

        card = card_figures(step)
        lines.append(f"  on the card: allocated {gb(card['allocated_bytes'])} "
                     f"(max_memory_allocated), reserved {gb(card['reserved_bytes'])} "
                     "(max_memory_reserved), nvidia-smi "
                     f"{gb(card['nvidia_smi_bytes'])} (reserved + CUDA context: checked against "
                     "the budget)")
        kernel = (figures or {}).get("kernel") or step.info.get("kernel")
        workspace = gb(step.info.get("attention_workspace_bytes", 0))
        lines.append(f"CUDA-only memory, one row per kernel (attention kernel: {kernel}; its backward "
                     f"workspace {workspace}, one layer at a time)")
        lines += describe_rows(kernels or [])
    if step.info.get("world_size", 1) > 1:
        lines.append(f"  (noted, not in the peak: LoRA gradient all-reduce bucket "
                     f"{gb(step.info['allreduce_bucket_bytes'])} after backward; DDP-style "
                     "buckets of 25 MB)")
    return lines + _budget_lines(pred, budget, "bucket (tokens)", 15, " per GPU", short)


def speed_lines(figures: dict[str, Any] | None) -> list[str]:
    """The speed the plan predicts beside its peak: the run's tokens/s (text) or images/s (image)
    and MFU (useful FLOPs over the predicted seconds and the measured matmul peak); for text none
    without a step-time model (no budget, or a model this device cannot time for a plan), for an
    image run the reason it is not timed."""
    figures = figures or {}
    image = "predicted_images_per_s" in figures
    speed = figures.get("predicted_images_per_s" if image else "predicted_tokens_per_s")
    if not speed:
        source = figures.get("speed_source")
        return [f"  predicted speed: {source}"] if image and source else []
    mfu, peak = figures.get("predicted_mfu"), figures.get("peak_flops_per_s")
    of_peak = (f", MFU {mfu:.1%} of the measured matmul peak ({peak / 1e9:,.1f} GFLOP/s)"
               if mfu and peak else ", MFU not predicted (no FLOP count, or the matmul peak was measured "
               "while the machine was busy)")
    rate = f"{speed:,.2f} images/s" if image else f"{speed:,.0f} tokens/s"
    return [f"  predicted speed: {rate}{of_peak} (source: step-time model "
            f"{figures.get('speed_source', '?')}; the run records the measured figures beside them)"]


def depth_lines(figures: dict[str, Any] | None) -> list[str]:
    """The checkpointed layers the plan chose for a checkpointing run without a layer count
    (:mod:`lora_gui.memory.predict.checkpoint_choice`), with every layer's predicted speed beside
    it, or for an image run whether it checkpoints at all
    (:mod:`lora_gui.memory.predict.image_checkpoint_choice`); empty when the plan did not choose."""
    if (figures or {}).get("image_checkpointing"):  # an image run: checkpointing on or off
        from lora_gui.memory.predict.image_checkpoint_choice import choice_lines

        return choice_lines(figures["image_checkpointing"])
    depth = (figures or {}).get("checkpointing")
    if not depth:
        return []
    n, of = depth["checkpoint_layers"], depth["decoder_layers"]
    chosen = ("none of the decoder layers (gradient checkpointing off)" if n == 0 else
              f"every decoder layer ({of})" if n == of else f"the first {n} of {of} decoder layers")
    every = depth["every_layer_predicted_tokens_per_s"]
    offload = depth.get("offload_checkpoints")
    versus = (f"; every layer: {every:,.0f} tokens/s" if every and (n != of or offload) else
              "" if every else "; every layer does not fit without offloading" if offload else
              "; every layer does not fit")
    if offload:
        chosen += ", each layer's input kept in host memory until its recompute"
    return [f"  checkpointed: {chosen}, the fastest depth that fits the budget "
            f"({depth['predicted_tokens_per_s']:,.0f} tokens/s predicted over the run's samples{versus}; "
            "set checkpoint_layers to choose yourself)"]


def checkpoint_layers_lines(cfg: RunConfig, budget: Budget, device: str, now: Prediction | None = None
                            ) -> list[str]:
    """With checkpointing on and room in the budget: the fewest layers to checkpoint
    (``checkpoint_layers``) with the same micro-batches, so that the others skip their
    recompute. Empty otherwise, and when the plan chose the depth itself. ``now``: the run's
    plan as it stands, when the caller has it."""
    from lora_gui.memory.predict.run import fewest_checkpointed_layers

    found = fewest_checkpointed_layers(cfg, budget.bytes, device, now=now)
    if found is None:
        return []
    n, pred = found
    unit = "transformer block" if cfg.task == "video" else "decoder layer"
    return [f"Faster within the budget: checkpoint_layers={n} checkpoints only the first "
            f"{unit if n == 1 else f'{n} {unit}s'}; the others keep their activations "
            f"and are not recomputed. Predicted peak {gb(pred.peak_bytes)} (source: "
            f"predicted) of {gb(budget.bytes)}, the same micro-batches."]


def image_plan_lines(cfg: RunConfig, pred: Prediction, budget: Budget | None) -> list[str]:
    """What `plan` prints for an image run."""
    step = pred.step
    lines = [f"Predicted peak of the image run on {pred.device} (source: predicted, the run's own plan of "
             f"{cfg.model} at {cfg.resolution} px): {gb(pred.peak_bytes)}"]
    if pred.train_peak_bytes is not None:
        lines.append(f"  training steps alone: {gb(pred.train_peak_bytes)} (largest micro-batch: "
                     f"{step.info.get('batch_size') or '?'} image(s), traced)")
    if step.info.get("encoding_pass_bytes"):
        lines.append("  (the larger of the training step and the caching pass, which holds the VAE and "
                     "text encoders on the device, and the denoiser too unless latents are cached: "
                     f"{gb(step.info['encoding_pass_bytes'])})")
    lines += speed_lines(pred.figures)
    lines += depth_lines(pred.figures)
    if pred.plan is None:
        lines.append(_no_plan_verdict(pred, budget, " (fixed batch per bucket)"))
        lines += [f"  {bucket:>13}  micro-batch {batch}{_image_speed(pred.figures, bucket)}"
                  for bucket, batch in pred.bucket_batches]
        return lines
    lines += _budget_lines(pred, budget, "bucket (h, w)", 13)
    by_bucket = (pred.figures or {}).get("images_per_s_by_bucket") or {}
    return lines + [f"  {bucket:>13}  predicted{_image_speed(pred.figures, bucket)}" for bucket in by_bucket]


def _image_speed(figures: dict[str, Any] | None, bucket: str) -> str:
    """A bucket's predicted images/s and MFU of a full step (empty when not predicted)."""
    speed = ((figures or {}).get("images_per_s_by_bucket") or {}).get(bucket)
    if not speed:
        return ""
    mfu = ((figures or {}).get("mfu_by_bucket") or {}).get(bucket)
    return f"  ~{speed:,.2f} images/s a step" + (f", MFU {mfu:.1%}" if mfu else "")


def _no_plan_verdict(pred: Prediction, budget: Budget | None, how: str = "", per: str = "",
                     short: str | None = None) -> str:
    """The verdict of a run without a planner's plan: against the budget, or none without one."""
    if budget is None:
        return "\nNo budget to judge against: the peak above is what the run will hold"
    verdict = short or ("fits" if pred.peak_bytes <= budget.bytes else "does not fit")
    return f"\nBudget {budget.label(per)}: {verdict}{how}"


def _budget_lines(pred: Prediction, budget: Budget | None, bucket_title: str, width: int,
                  per: str = "", short: str | None = None) -> list[str]:
    plan = pred.plan
    if plan is None or budget is None:
        return [_no_plan_verdict(pred, budget, "", per, short)]
    speed = any(getattr(b, "tokens_per_s", None) for b in plan.buckets)  # text plans with a step-time model
    lines = [f"\nBudget {budget.label(per)}: {short or plan.message}",
             f"  {bucket_title:>{width}}  micro-batch  grad-accum  predicted peak GB"
             + ("  predicted tokens/s  predicted MFU" if speed else "")]
    lines += [f"  {b.bucket!s:>{width}}  {b.micro_batch:>11}  {b.grad_accum:>10}  "
              f"{gb(b.peak_bytes, unit=False):>17}"
              + (f"  {b.tokens_per_s or 0:>19,.0f}  {_percent(getattr(b, 'mfu', None)):>13}" if speed else "")
              for b in plan.buckets]
    source = (pred.figures or {}).get("speed_source")
    if speed and source:
        lines.append(f"  tokens/s: padded tokens of forward and backward, from the step-time model {source}; "
                     "MFU: useful FLOPs of full rows over those seconds and the measured matmul peak")
    lines += [f"  try {s.switch}: {gb(s.peak_bytes)} (saves "
              f"{gb(s.saving_bytes)}){' -> fits' if s.fits else ''}" for s in plan.suggestions]
    return lines


def _percent(share: float | None) -> str:
    return f"{share:.1%}" if share else "-"


def _bucket_name(bucket: Any, unit: str) -> str:
    return f"{bucket:,} {unit}" if isinstance(bucket, int) else f"{bucket[1]}x{bucket[0]} {unit}"


def _short_of_budget(plan: Any, unit: str) -> str:
    """Why a plan does not fit, in the bucket table's own figures: the largest bucket that needs
    more than the budget at batch 1, and the buckets that do fit (the run's longer samples are
    the ones that cannot train)."""
    over = [b for b in plan.buckets if not b.micro_batch]
    fitting = [b for b in plan.buckets if b.micro_batch]
    worst = over[-1] if over else max(plan.buckets, key=lambda b: b.peak_bytes)
    text = f"the {_bucket_name(worst.bucket, unit)} bucket needs {gb(worst.peak_bytes)} even at batch 1"
    frozen = plan.message.split(" (the frozen weights alone", 1)
    if len(frozen) == 2:
        text += " (the frozen weights alone" + frozen[1]
    if fitting:
        text += (f"; only buckets up to {_bucket_name(fitting[-1].bucket, unit)} fit (bucket table), so "
                 "the run's longer samples cannot train")
    else:
        text += "; no bucket fits, not even the smallest"
    return text + "; see the suggestions"


def verdict_markdown(plan: Any, peak_bytes: int, budget_bytes: int, shape: str, device: str,
                     unit: str = "tokens") -> str:
    """The Plan tab's verdict, judged by one figure: the run's own predicted peak (``peak_bytes``,
    the micro-batches it executes on its data) against the budget. The bucket table's worst case
    (a full-length sample in each bucket) is named apart when it says otherwise, and so are the
    suggested switches; every figure in GB (see :func:`gb`). ``unit``: what a bucket counts."""
    fits = peak_bytes <= budget_bytes
    if plan is None:
        head = "fixed batch per bucket"
    elif fits and plan.fits:
        head = plan.message
    elif fits:
        over = [b for b in plan.buckets if not b.micro_batch] or plan.buckets
        worst = max(over, key=lambda b: b.peak_bytes)
        head = (f"the run's micro-batches fit its data; a full-length sample in the "
                f"{_bucket_name(worst.bucket, unit)} bucket would need {gb(worst.peak_bytes)} at batch 1 "
                "(bucket table), and the data has none that long")
    elif not plan.fits:
        head = _short_of_budget(plan, unit)
    else:
        head = "the run's largest micro-batch is over the budget"
    text = (f"**{'Fits' if fits else 'Does not fit'}** — {head}\n\nPredicted peak at {shape}: "
            f"**{gb(peak_bytes)}** against the {gb(budget_bytes)} budget (source: predicted, {device})")
    buckets = plan.buckets if plan is not None else []
    largest = max(buckets, key=lambda b: b.peak_bytes).bucket if buckets else None
    where = f" at batch 1 in the {_bucket_name(largest, unit)} bucket" if largest is not None else ""
    for sug in plan.suggestions if plan is not None else []:
        text += (f"\n- {sug.switch}: {gb(sug.peak_bytes)}{where} — "
                 f"{'fits' if sug.fits else 'does not fit'} the budget")
    return text


def plan_rows(plan: Any) -> list[list[Any]]:
    """[bucket, micro-batch, grad-accum, predicted peak GB] per bucket of a planner's plan."""
    return [] if plan is None else [[b.bucket, b.micro_batch, b.grad_accum, round(b.peak_bytes / GB, 2)]
                                    for b in plan.buckets]


# The cards of "What fits where", by their names in the card list: each row is the memory torch
# reports for that card (an "8 GB" card holds 8.36 GB), the same figure the card picker plans with.
TABLE_CARDS = (("8gb", "8 GB"), ("12gb", "12 GB"), ("16gb", "16 GB"), ("24gb", "24 GB"),
               ("a100-40gb", "40 GB"), ("l40s", "48 GB"), ("a100-80gb", "80 GB"))


def table_cards_gb(budget_bytes: int | None = None) -> list[float]:
    """The table's card sizes in GB (1e9 bytes), with the planned budget as a row of its own
    when it is none of the table's cards."""
    sizes = [card_by_name(key).total_bytes / GB for key, _ in TABLE_CARDS]
    if budget_bytes and not any(abs(budget_bytes / GB - s) < 1e-6 for s in sizes):
        sizes.append(budget_bytes / GB)
    return sorted(sizes)


def card_row_label(size_gb: float, budget_gb: float | None = None) -> str:
    """A row's name: '24 GB card (25.35 GB)', marked when it is the budget being planned."""
    names = {round(card_by_name(key).total_bytes / GB, 6): label for key, label in TABLE_CARDS}
    name = names.get(round(size_gb, 6))
    text = f"{name} card ({size_gb:,.2f} GB)" if name else f"{size_gb:,.2f} GB"
    if budget_gb is not None and abs(size_gb - budget_gb) < 1e-6:
        text += " (this budget)"
    return text


SMALLEST_TRIED = "256 tokens"  # what_fits_where's shortest length: a card holding none says so


def _fit_cell(fit: tuple, smallest: str = SMALLEST_TRIED) -> str:
    """'longest / batch' of one card, or 'under 256 tokens' when not even the shortest tried fits
    (a shorter bucket may still fit), the same words on the page and in the CLI."""
    return f"{fit[0]} / {fit[1]}" if fit[0] else f"under {smallest}"


def fits_rows(rows: list[Any], smallest: str | None = None, budget_gb: float | None = None,
              ) -> list[list[Any]]:
    """What fits where, one table row per card: longest at batch 1, batch at the chosen size, the
    FSDP columns and, for text, the quantized-base columns (the dashboard's table).

    ``smallest``: the smallest size the table tries ("256 tokens"): a card that holds none says
    "under 256 tokens", not "nothing fits" (a shorter bucket may still fit); ``budget_gb``: the
    row of the budget being planned, marked as such."""
    smallest = smallest or SMALLEST_TRIED
    none = f"under {smallest}"
    return [[card_row_label(r.card_gb, budget_gb), r.longest or none, r.batch_at_chosen,
             *(_fit_cell(fit, smallest) for fit in r.by_gpus.values()),
             *([_fit_cell(fit, smallest) for fit in getattr(r, "by_quantization", {}).values()] or ["-"] * 3)]
            for r in rows]


def fits_lines(rows: list[Any], chosen: int, budget_gb: float | None = None) -> list[str]:
    """The same as text lines (`plan` on the CLI), in the same words."""
    counts = list(rows[0].by_gpus) if rows else []
    lines = [f"\nWhat fits where on CUDA cards: longest sequence at batch 1 / largest batch per GPU at "
             f"{chosen} (N GPUs: FSDP shards the frozen weights; under DDP each GPU is the 1-GPU column, "
             "N x the batch)",
             f"  {'card':<37}" + "".join(f"{'1 GPU' if n == 1 else f'{n} GPUs':>17}" for n in [1, *counts])]
    for row in rows:
        fits = [(row.longest, row.batch_at_chosen), *row.by_gpus.values()]
        lines.append(f"  {card_row_label(row.card_gb, budget_gb):<37}"
                     + "".join(f"{_fit_cell(f):>17}" for f in fits))
    if rows and rows[0].by_quantization:
        names = list(rows[0].by_quantization)
        lines += ["\nSame, 1 GPU, per quantization of the base weights (bitsandbytes)",
                  f"  {'card':<37}" + "".join(f"{q:>17}" for q in names)]
        lines += [f"  {card_row_label(row.card_gb, budget_gb):<37}"
                  + "".join(f"{_fit_cell(row.by_quantization[q]):>17}" for q in names) for row in rows]
    return lines
