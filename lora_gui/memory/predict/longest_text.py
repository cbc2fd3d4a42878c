"""The longest sequence a run can train under a memory budget, and the cheapest switches that get there.

``python -m lora_gui plan --longest``, the Plan tab and the Train tab's "Longest that fits" call
:func:`longest_text`. The search uses the run's own planner:

1. every combination of the memory switches the user has not already turned on (chunked loss,
   8-bit optimizer states on CUDA, host embeddings, a sequence-tiled MLP, gradient checkpointing,
   offloaded checkpoints) is searched with the closed-form estimate (:mod:`estimate`, ~0.3 ms a
   call): a bisection over lengths in steps of :data:`GRANULE` tokens up to the model's context;
2. the longest length any combination reaches is kept, and among the combinations that reach it
   the one with the least speed cost (measured in ``bench/results/long_switches.json`` where it
   exists, else a default order, said as "not measured");
3. the fake-tensor trace of the micro-batch the run will execute at that length (the shapes of
   :func:`run_predict.worst_case_shapes`, the run's own prediction) confirms it: a length the
   trace says does not fit steps down, headroom the trace shows steps up, until the answer is
   within :data:`CLOSE_ENOUGH` (2%) of the traced limit: the line through the last two traces (the
   estimate's slope after the first) says under 2% more length is left, or a length 2% longer was
   traced and did not fit. Each step aims half that tolerance under the line's limit, so that the
   next trace, when the line is close to right, both fits and ends the search (the 8B: 1-2 traces).
   The answer is always a length whose trace fit.

Every figure is ``source: predicted``. On CUDA the CUDA context (920 MiB, measured on an H200,
outside the allocator) is counted unless ``count_cuda_context=False`` (published figures usually
leave it out).
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from lora_gui.config import ConfigError, RunConfig
from lora_gui.memory.predict import planner
from lora_gui.memory.predict.confirmed import RESERVE_MARGIN, is_confirmed, margin_needed, unconfirmed
from lora_gui.memory.predict.estimate import LLAMA_LIKE, estimate_text_step
from lora_gui.memory.predict.longest_result import (
    BOUND_CARD,
    BOUND_CONTEXT,
    BOUND_HOST,
    Candidate,
    Longest,
    describe,
)
from lora_gui.memory.predict.model_configs import max_positions
from lora_gui.memory.predict.run_plan import model_config_for, step_kwargs
from lora_gui.memory.predict.run_predict import worst_case_shapes
from lora_gui.memory.predict.trace import TraceResult, trace_text_step
from lora_gui.memory.runtime.guard import BatchCaps
from lora_gui.memory.runtime.host import check_host_memory
from lora_gui.models.stand_ins import rebuilds_made
from lora_gui.units import gb

__all__ = ["BOUND_CARD", "BOUND_CONTEXT", "BOUND_HOST", "Candidate", "Longest", "describe", "longest_text"]

log = logging.getLogger(__name__)

GRANULE = 64  # tokens: answers are multiples of the bucketed builder's default pad multiple
MAX_LEN = 1 << 20  # tokens: the max_seq_len setting's upper bound
CLOSE_ENOUGH = 0.02  # stop refining once the traced headroom is worth under 2% more tokens
MAX_TRACES = 5  # fake-tensor traces of the answer at most (an 8B step takes ~10-40 s on a CPU)
COSTS_FILE = Path(__file__).resolve().parents[3] / "bench" / "results" / "long_switches.json"
# Order in which switches are tried when their speed cost is not measured (cheapest first); the
# weights rank them only and are never shown as a cost: the answer says "not measured".
DEFAULT_ORDER = {"loss_chunk": 1.01, "optimizer": 1.02, "embeddings_on_host": 1.03,
                 "attention_head_groups": 1.04, "mlp_chunk": 1.05, "offload_checkpoints": 1.10,
                 "gradient_checkpointing": 1.35}
LOSS_CHUNKS = (1024, 256)  # positions of one chunk of the chunked loss (logits = 12 B x vocab each)
# tokens of one MLP tile: smaller tiles save little more (Llama-3.1-8B at 8 GB: 10,304 tokens at
# 2048, 12,096 at 512, estimate) while every tile adds ops to the trace that confirms the answer
MLP_CHUNKS = (4096, 2048)


def measured_costs(path: Path | None = None) -> dict[str, float]:
    """Measured slowdowns per switch from the bench results (empty when not measured).

    The file (default :data:`COSTS_FILE`) maps a setting to ``{"slowdown": step time with /
    without the switch, ...}``.
    """
    path = path or COSTS_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        log.warning("%s: not read (%s); speed costs not measured", path, err)
        return {}
    out = {}
    for name, entry in data.items():
        value = entry.get("slowdown") if isinstance(entry, dict) else None
        if isinstance(value, (int, float)) and value > 0:
            # a switch measured faster than without it is within the bench's noise (about 5%
            # on a shared CPU): never a reason to turn on a switch the length does not need
            out[name] = max(1.0, float(value))
    return out


def switch_choices(cfg: RunConfig, device: str) -> dict[str, list[Any]]:
    """Per setting, the values the search may use: the user's own value first, then the ones
    that save memory (a switch the user turned on stays on)."""

    from lora_gui.config import bitsandbytes_present

    choices: dict[str, list[Any]] = {}
    chunk = cfg.resolved_loss_chunk()
    choices["loss_chunk"] = [cfg.loss_chunk, *(c for c in LOSS_CHUNKS if not chunk or c < chunk)]
    choices["gradient_checkpointing"] = [True] if cfg.gradient_checkpointing else [False, True]
    choices["offload_checkpoints"] = [True] if cfg.offload_checkpoints else [False, True]
    choices["mlp_chunk"] = [cfg.mlp_chunk, *(c for c in MLP_CHUNKS if not cfg.mlp_chunk or c < cfg.mlp_chunk)]
    tied = getattr(model_config_for(cfg), "tie_word_embeddings", False)  # the head shares the table
    host_table = [] if cfg.embeddings_on_host or tied else [True]
    choices["embeddings_on_host"] = [cfg.embeddings_on_host, *host_table]
    optimizer = cfg.resolved_optimizer(device)
    eight_bit = device == "cuda" and optimizer == "adamw" and bitsandbytes_present()
    choices["optimizer"] = [cfg.optimizer, "adamw8bit"] if eight_bit else [cfg.optimizer]
    choices["attention_head_groups"] = [cfg.attention_head_groups, *_head_groups(cfg, device)]
    return choices


def _head_groups(cfg: RunConfig, device: str) -> list[int]:
    """Attention in one call per key/value head, where it saves memory: on CUDA with SDPA (the
    kernels' backward scratch; a CPU kernel has none), when the user has not set it."""
    if device != "cuda" or cfg.attention_head_groups or cfg.attention == "windowed" \
            or cfg.resolved_attn_backend() != "sdpa" or not is_confirmed("attention_head_groups"):
        return []  # (a saving no card has confirmed is not proposed: memory/predict/confirmed.py)
    from lora_gui.attention.head_groups import key_value_heads

    kv = key_value_heads(model_config_for(cfg))
    return [kv] if kv > 1 else []


def _combinations(cfg: RunConfig, device: str) -> list[dict[str, Any]]:
    """Every combination of switch values as changes from ``cfg`` (offload needs checkpointing)."""
    choices = switch_choices(cfg, device)
    names = list(choices)
    out = []
    for values in itertools.product(*(choices[n] for n in names)):
        combo = dict(zip(names, values))
        if combo["offload_checkpoints"] and not combo["gradient_checkpointing"]:
            continue
        out.append({n: v for n, v in combo.items() if v != getattr(cfg, n)})
    return out


def _cost(changes: dict[str, Any], measured: dict[str, float]) -> float:
    cost = 1.0
    for name, value in changes.items():
        cost *= measured.get(name, DEFAULT_ORDER.get(name, 1.5))
        if name in ("loss_chunk", "mlp_chunk") and value:  # smaller chunks: more kernel launches
            cost *= 1 + 1e-3 * (4096 / value)
    return cost


class _Search:
    """The estimate and trace of one run at any length, with a switch combination applied."""

    def __init__(self, cfg: RunConfig, budget: int, device: str, count_cuda_context: bool) -> None:
        self.cfg, self.budget, self.device = cfg, budget, device
        self.card_budget = budget  # the budget asked for; ``budget`` may keep a margin below it
        self.count_context = count_cuda_context
        self.config = model_config_for(replace(cfg, max_seq_len=max_positions_for(cfg) or cfg.max_seq_len))
        shape = self.shape(cfg, cfg.max_seq_len)
        self.rows, self.grads_before = shape.batch_size, shape.grads_before

    def shape(self, cfg: RunConfig, seq_len: int):
        """The micro-batch the run executes at ``seq_len`` (worst case: a full-length sample)."""
        at = replace(cfg, max_seq_len=seq_len)
        caps = BatchCaps()
        if at.resolved_batching() != "fixed":  # under a budget the run caps long buckets at 1 row
            caps.caps = {seq_len: 1}
        return max(worst_case_shapes(at, caps), key=lambda s: (s.batch_size, s.seq_len))

    def counted(self, step: TraceResult) -> int:
        """Bytes compared with the budget (the CUDA context left out when not counted)."""
        return step.peak_bytes - (0 if self.count_context else step.cuda_overheads.get("cuda_context", 0))

    def estimate(self, changes: dict[str, Any], seq_len: int) -> tuple[int, TraceResult]:
        kw = step_kwargs(replace(self.cfg, **changes), self.device)
        step = estimate_text_step(self.config, batch_size=self.rows, seq_len=seq_len, **kw)
        extra = step.breakdown["lora_params"] if self.grads_before else 0  # earlier micro-batches' grads
        return self.counted(step) + extra, step

    def trace(self, changes: dict[str, Any], seq_len: int) -> TraceResult:
        at = replace(self.cfg, **changes, max_seq_len=seq_len)
        shape = self.shape(at, seq_len)
        return trace_text_step(self.config, batch_size=shape.batch_size, seq_len=shape.seq_len,
                               mask=shape.mask, grads_before=shape.grads_before,
                               lora_dropout=at.lora_dropout, **step_kwargs(at, self.device))

    def longest(self, changes: dict[str, Any], cap: int, host_limit: int | None = None) -> int:
        """Longest length in steps of GRANULE (and ``cap`` itself) the estimate fits, its host
        memory within ``host_limit`` (None: no limit); 0: none."""
        lengths = _lengths(cap)

        def peak(i: int) -> int:
            device_bytes, step = self.estimate(changes, lengths[i - 1])
            over_host = host_limit is not None and _host(step) > host_limit
            return self.budget + 1 if over_host else device_bytes

        k = planner._largest(peak, self.budget, len(lengths))
        return lengths[k - 1] if k else 0


def _lengths(cap: int) -> list[int]:
    out = list(range(GRANULE, cap + 1, GRANULE))
    return out + [cap] if not out or out[-1] != cap else out


def max_positions_for(cfg: RunConfig) -> int | None:
    """The model's context (max_position_embeddings), None when its config does not say."""
    return max_positions(model_config_for(cfg))


def _host(step: TraceResult) -> int:
    return int(step.info.get("host_bytes", 0) or 0)


def longest_text(cfg: RunConfig, budget_bytes: int, device: str = "cuda", *, count_cuda_context: bool = True,
                 host_limit_bytes: int | None = None, beyond_context: bool = False,
                 confirm: bool = True, margin: bool = True) -> Longest:
    """The longest ``max_seq_len`` this run fits under the budget, with the switches it needs.

    Args:
        cfg: the run's settings (model, quantization, LoRA, batch, attention...).
        budget_bytes: accelerator memory budget (bytes).
        device: plan for 'cuda' or 'cpu'.
        count_cuda_context: count the CUDA context against the budget (False: as published
            figures, which report the allocator's peak).
        host_limit_bytes: host memory the offloaded tensors may take (None: no limit).
        beyond_context: search past the model's context (only for a run that extends it).
        confirm: confirm with the trace (False: estimate only, instant).
        margin: keep a margin for the savings no card has confirmed yet: the traces count the
            step without them (:mod:`lora_gui.memory.predict.confirmed`), and the answer says
            what they would add (False: count them).

    Returns:
        A :class:`Longest`.

    Raises:
        ConfigError: an image run, the weights alone above the budget (with the quantization
            that fits), nothing fitting even at the shortest length.
    """
    if cfg.task != "text":
        raise ConfigError("plan --longest: sequence length applies to text runs; see longest_image")
    budget = planner.check_budget(budget_bytes)
    notes: list[str] = []
    if cfg.resolved_batching() == "packed":  # several documents a row: a block mask of length^2
        cfg = replace(cfg, batching="bucketed")
        notes.append("planned for one document a row (batching=bucketed): a packed row's block mask "
                     "grows with the square of its length")
    if cfg.is_preference:  # the traced step is the preference step: both answers, the reference
        notes.append(f"longest pair ({cfg.objective}): each micro-batch row is a pair, its chosen and "
                     "rejected answers each up to this length, run together with the reference pass")
    search = _Search(cfg, budget, device, count_cuda_context)
    reserve_margin = 0
    if margin and device == "cuda":  # the allocator's reserve: its plan ran 1.23% low on a card's edge
        ctx = estimate_text_step(search.config, batch_size=1, seq_len=GRANULE,
                                 **step_kwargs(cfg, device)).cuda_overheads.get("cuda_context", 0)
        reserve_margin = int(RESERVE_MARGIN * max(0, budget - (ctx if count_cuda_context else 0)))
        search.budget = budget - reserve_margin
    context = max_positions(search.config)
    cap = MAX_LEN if beyond_context or not context else min(context, MAX_LEN)
    measured = measured_costs()
    usable = _candidates(search, cfg, device, cap, host_limit_bytes, measured)
    best_len = max(c.seq_len for c in usable)
    unlimited = usable if host_limit_bytes is None else _candidates(search, cfg, device, cap, None, measured)
    most = max(unlimited, key=lambda c: (c.seq_len, -c.cost))
    if best_len == 0 and most.seq_len:  # the device would hold it: host memory is what is short
        shortest = _host(search.estimate(most.changes, GRANULE)[1])
        check_host_memory(shortest, host_limit_bytes, f"the offloaded tensors of {GRANULE} tokens")
    if best_len == 0:
        raise ConfigError(_nothing_fits(cfg, search, device, count_cuda_context))
    if most.seq_len > best_len:
        notes.append(f"with about {gb(most.host_bytes)} of host memory: about {most.seq_len:,} tokens "
                     f"(estimate, not traced; host memory allowed: {gb(host_limit_bytes)})")
    chosen = min((c for c in usable if c.seq_len == best_len), key=lambda c: (c.cost, len(c.changes)))
    candidates = usable
    allows = best_len
    if best_len == cap and cap < MAX_LEN:
        allows = search.longest(chosen.changes | _most_saving(cfg, device, chosen.changes), MAX_LEN)
        notes.append(f"capped at the model's context ({cap:,} tokens); memory alone allows about "
                     f"{allows:,} (estimate)")
    seq_len, step, traces = best_len, None, 0
    bound = BOUND_HOST if most.seq_len > best_len else BOUND_CARD  # the estimate's answer
    kept = margin and margin_needed(cfg, chosen.changes)
    if confirm:
        with rebuilds_made(not kept):  # with a margin: traced as if the unconfirmed rebuilds were off
            seq_len, step, traces, bound = _confirm(search, chosen.changes, best_len, cap, host_limit_bytes)
        if seq_len == 0 and bound == BOUND_HOST:
            check_host_memory(_host(step), host_limit_bytes, "the offloaded tensors of the shortest length")
        if seq_len == 0:
            raise ConfigError(_nothing_fits(cfg, search, device, count_cuda_context))
        if most.seq_len > seq_len:  # more host memory would have let the offloading switches go longer
            bound = BOUND_HOST
    else:
        step = search.estimate(chosen.changes, seq_len)[1]
    host = _host(step)
    if host_limit_bytes is not None:
        check_host_memory(host, host_limit_bytes, "the offloaded tensors at the longest length")
    capped = seq_len == cap and cap < MAX_LEN and not beyond_context
    if capped:
        bound = BOUND_CONTEXT
    names = [s.name for s in unconfirmed(cfg, chosen.changes)]
    margin_bytes = 0
    if kept and confirm:
        margin_bytes = max(0, step.peak_bytes - search.trace(chosen.changes, seq_len).peak_bytes)
    if margin_bytes:
        more = int(margin_bytes / _slope(search, chosen.changes, [(seq_len, search.counted(step))]))
        notes.append(f"kept at a margin: {', '.join(names)} not yet confirmed on a card, so this answer "
                     f"counts the step without them ({gb(margin_bytes)} more at this length); "
                     f"counting them: about {min(cap, seq_len + more) // GRANULE * GRANULE:,} tokens "
                     "(unconfirmed; --count-unconfirmed)")
    if reserve_margin:
        notes.append(f"kept at a margin of {gb(reserve_margin)} ({RESERVE_MARGIN:.2%} of the card's "
                     "usable memory): the caching allocator's reserve ran 1.23% above its plan at the 8 GB "
                     "edge on a card (H200, bench/results/gpu_h200)")
    if names and not kept and not margin_bytes:
        notes.append(f"counts savings not yet confirmed on a card: {', '.join(names)}")
    if beyond_context and context and seq_len > context:
        notes.append(f"beyond the model's context ({context:,} tokens): the run must extend it")
    ctx = step.cuda_overheads.get("cuda_context", 0)
    alternatives = sorted(candidates, key=lambda c: (-c.seq_len, c.cost))[:8]
    card = {}
    if device == "cuda":
        card = {"attention_kernel": step.info.get("kernel"),
                "attention_workspace_bytes": step.info.get("attention_workspace_bytes", 0),
                "allocated_bytes": step.allocator_peak_bytes, "reserved_bytes": step.reserved_peak_bytes}
    return Longest(seq_len, dict(chosen.changes), step.peak_bytes, host, budget, device, search.rows,
                   capped, context, max(allows, seq_len),
                   {k: measured.get(k) for k in chosen.changes}, count_cuda_context, ctx,
                   confirm, traces, search.counted(step), notes, alternatives, card, bound=bound,
                   host_limit_bytes=host_limit_bytes, unconfirmed=names, margin_bytes=margin_bytes,
                   reserve_margin_bytes=reserve_margin)


def _candidates(search: _Search, cfg: RunConfig, device: str, cap: int, host_limit: int | None,
                measured: dict[str, float]) -> list[Candidate]:
    """Every switch combination with the longest length the estimate gives it."""
    out = []
    for changes in _combinations(cfg, device):
        n = search.longest(changes, cap, host_limit)
        host = _host(search.estimate(changes, n)[1]) if n else 0
        out.append(Candidate(changes, n, _cost(changes, measured), host))
    return out


def _most_saving(cfg: RunConfig, device: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Every switch at its most saving value (for the uncapped figure)."""
    choices = switch_choices(cfg, device)
    out = {n: v[-1] for n, v in choices.items() if v[-1] != getattr(cfg, n)}
    return {k: v for k, v in out.items() if k not in changes}


def _confirm(search: _Search, changes: dict[str, Any], start: int, cap: int,
             host_limit: int | None = None) -> tuple[int, TraceResult, int, str]:
    """The trace at the estimate's answer, then steps (secant on traced peaks) to the traced limit.

    A length fits when its traced peak is within the budget and its offloaded tensors within
    ``host_limit`` (None: no limit); each bound has its own line through the traces and the
    nearer limit is aimed at. Each step aims half of :data:`CLOSE_ENOUGH` under it: a trace there
    fits when the line errs by less than that, and ends the search, the line through it then
    leaving under :data:`CLOSE_ENOUGH` to gain. Returns (longest length the trace fits, its trace,
    traces run, the bound that stopped it: :data:`BOUND_CARD` or :data:`BOUND_HOST`); (0, last
    trace, n, bound) if none."""
    budget = search.budget
    fit: tuple[int, TraceResult] | None = None
    too_long = cap + 1  # shortest length known not to fit
    points: list[tuple[int, int]] = []  # (length, counted traced peak)
    host_points: list[tuple[int, int]] = []  # (length, host bytes of the offloaded tensors)
    seq_len, traces, bound = start, 0, BOUND_CARD
    while traces < MAX_TRACES:
        step = search.trace(changes, seq_len)
        traces += 1
        peak, host = search.counted(step), _host(step)
        points.append((seq_len, peak))
        host_points.append((seq_len, host))
        over_host = host_limit is not None and host > host_limit
        if peak <= budget and not over_host:
            if fit is None or seq_len > fit[0]:
                fit = (seq_len, step)
        elif seq_len < too_long:
            too_long, bound = seq_len, BOUND_HOST if peak <= budget else BOUND_CARD
        lo = fit[0] if fit else 0
        target = seq_len + (budget - peak) / _slope(search, changes, points)
        if host_limit is not None and host:  # the host bound's own line (offloaded bytes grow with length)
            host_target = seq_len + (host_limit - host) / _host_slope(host_points)
            if host_target < target:
                target, bound = host_target, BOUND_HOST if too_long > cap else bound
        log.info("trace at %d tokens: %d bytes (budget %d), host %d bytes (limit %s); the lines through "
                 "it fit %d", seq_len, peak, budget, host, host_limit, int(target))
        close = max(GRANULE, CLOSE_ENOUGH * max(lo, 1))
        fits_now = peak <= budget and not over_host
        if fit and (lo == cap or too_long - lo <= close or (fits_now and target - lo < close)):
            break
        nxt = min(cap, _aim(target, lo))
        if not lo < nxt < too_long:  # the secant overshot what is known: bisect
            nxt = (lo + min(too_long, cap)) // 2 // GRANULE * GRANULE
        if nxt <= lo or nxt >= too_long or nxt < GRANULE:
            break
        seq_len = nxt
    if fit is None:
        return 0, step, traces, bound
    return fit[0], fit[1], traces, bound


def _host_slope(points: list[tuple[int, int]]) -> float:
    """Host bytes per token: from the last two traces, else proportional to length (offloaded
    layer inputs and host-side embeddings are a fixed number of bytes a token)."""
    if len(points) >= 2 and points[-1][0] != points[-2][0]:
        (a, ha), (b, hb) = points[-2], points[-1]
        if hb > ha:
            return (hb - ha) / (b - a)
    n, host = points[-1]
    return max(1.0, host / max(1, n))


def _aim(target: float, lo: int) -> int:
    """The next length to trace: half of :data:`CLOSE_ENOUGH` under the line's limit ``target``
    (tokens), in GRANULE steps, at least one step above ``lo`` (the longest traced fit) when the
    line says there is room."""
    margin = max(GRANULE, CLOSE_ENOUGH * target) / 2
    nxt = int(target - margin) // GRANULE * GRANULE
    return max(nxt, lo + GRANULE) if target >= lo + GRANULE else nxt


def _slope(search: _Search, changes: dict[str, Any], points: list[tuple[int, int]]) -> float:
    """Bytes per token: from the last two traces, else the estimate's (both err high in length)."""
    if len(points) >= 2 and points[-1][0] != points[-2][0]:
        (a, pa), (b, pb) = points[-2], points[-1]
        slope = (pb - pa) / (b - a)
        if slope > 0:
            return slope
    n = points[-1][0]
    lo = max(1, n // 2)
    return max(1.0, (search.estimate(changes, n)[0] - search.estimate(changes, lo)[0]) / max(1, n - lo))


def _nothing_fits(cfg: RunConfig, search: _Search, device: str, count_context: bool) -> str:
    """Why nothing fits: the weights alone (and the quantization that would fit), or the step."""
    gb = 1e9
    kw = step_kwargs(cfg, device)
    step = estimate_text_step(search.config, batch_size=1, seq_len=GRANULE, **kw)
    weights = step.breakdown["frozen_weights"]
    if weights > search.budget:
        return (f"the weights alone need {weights / gb:.2f} GB; the budget is "
                f"{search.card_budget / gb:.2f} GB" + _quantization_hint(cfg, search, device, count_context))
    need = search.estimate(_most_saving(cfg, device, {}), GRANULE)[0]
    return (f"even {GRANULE} tokens with every memory switch need {need / gb:.2f} GB; the budget is "
            f"{search.card_budget / gb:.2f} GB" + _quantization_hint(cfg, search, device, count_context))


def _quantization_hint(cfg: RunConfig, search: _Search, device: str, count_context: bool) -> str:
    """'; quantization=nf4 fits (longest N tokens)' for the quantizations that would fit."""
    if getattr(search.config, "model_type", None) not in LLAMA_LIKE:
        return ""
    fits = []
    for quantization in ("int8", "nf4"):
        if quantization == cfg.quantization:
            continue
        other = replace(cfg, quantization=quantization)
        trial = _Search(other, search.budget, device, count_context)
        cap = max_positions(trial.config) or MAX_LEN
        n = trial.longest(_most_saving(other, device, {}), cap)
        if n:
            fits.append(f"quantization={quantization} fits (about {n:,} tokens, estimate)")
    return "; " + "; ".join(fits) if fits else "; no quantization of the base weights fits either"
