"""What ``plan --longest`` answers for a text run (:class:`Longest`, source: predicted) and the
answer in words (:func:`describe`); the search itself is :mod:`lora_gui.memory.predict.longest_text`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lora_gui.units import gb

BOUND_CARD, BOUND_HOST, BOUND_CONTEXT = "card memory", "host memory", "the model's context"


@dataclass
class Candidate:
    """One combination of switches and the longest length the estimate gives it."""

    changes: dict[str, Any]  # setting -> value changed from the user's settings
    seq_len: int  # longest length under the budget (estimate), 0: nothing fits
    cost: float  # product of per-switch slowdowns (measured or the default order)
    host_bytes: int = 0  # host memory the switches use at seq_len (estimate)


@dataclass
class Longest:
    """The answer of :func:`longest_text` (source: predicted).

    Attributes:
        seq_len: longest ``max_seq_len`` that fits (0: nothing fits).
        switches: settings to change from the user's (setting -> value).
        peak_bytes: traced peak at ``seq_len`` (CUDA overheads included; the context only when
            counted); host_bytes: host memory the switches use there.
        capped_by_context: the model's context, not memory, set the length; context_len: it.
        memory_allows: longest length memory alone allows (estimate; above the context when
            capped, else ``seq_len``).
        speed_cost: setting -> measured slowdown (step time with / without), None: not measured.
    """

    seq_len: int
    switches: dict[str, Any]
    peak_bytes: int
    host_bytes: int
    budget_bytes: int
    device: str
    micro_batch: int
    capped_by_context: bool
    context_len: int | None
    memory_allows: int
    speed_cost: dict[str, float | None]
    count_cuda_context: bool
    cuda_context_bytes: int
    confirmed_by_trace: bool
    traces: int
    counted_bytes: int = 0  # the peak compared with the budget (less the context when not counted)
    notes: list[str] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    card: dict[str, Any] = field(default_factory=dict)  # CUDA: kernel, workspace, allocated, reserved
    bound: str = "card memory"  # what stopped the length: card memory, host memory, the model's context
    host_limit_bytes: int | None = None  # host memory the offloaded tensors were allowed (None: no limit)
    unconfirmed: list[str] = field(default_factory=list)  # savings counted or margined, no card yet
    margin_bytes: int = 0  # what the unconfirmed savings would save at seq_len (kept as a margin)
    reserve_margin_bytes: int = 0  # card memory kept free for the allocator's reserve (confirmed.py)

    def to_json(self) -> dict[str, Any]:
        """The ``plan --longest --json`` object."""
        return {"longest_seq_len": self.seq_len, "switches": self.switches, "host_bytes": self.host_bytes,
                "peak_bytes": self.peak_bytes, "budget_bytes": self.budget_bytes, "device": self.device,
                "source": "predicted", "micro_batch": self.micro_batch,
                "capped_by_context": self.capped_by_context, "context_len": self.context_len,
                "memory_allows_seq_len": self.memory_allows, "speed_cost": self.speed_cost,
                "speed_cost_measured": all(v is not None for v in self.speed_cost.values()),
                "cuda_context_counted": self.count_cuda_context,
                "cuda_context_bytes": self.cuda_context_bytes,
                "counted_peak_bytes": self.counted_bytes,
                "confirmed_by_trace": self.confirmed_by_trace, "traces": self.traces, "notes": self.notes,
                "bound": self.bound, "host_limit_bytes": self.host_limit_bytes,
                "unconfirmed_savings": self.unconfirmed, "margin_bytes": self.margin_bytes,
                "reserve_margin_bytes": self.reserve_margin_bytes,
                **self.card,
                "alternatives": [{"switches": c.changes, "estimated_seq_len": c.seq_len,
                                  "estimated_host_bytes": c.host_bytes} for c in self.candidates]}


def describe(result: Longest) -> list[str]:
    """The answer in words, one line each (the CLI prints them, the Plan tab shows them), every
    figure in decimal GB, the unit of the budget field, the card sizes and ``--budget-gb``."""
    size = small = gb

    ctx = (f"CUDA context ({small(result.cuda_context_bytes)}) counted" if result.count_cuda_context
           else f"CUDA context (~{small(500 * 2**20)}) not counted: add it for a whole card") \
        if result.device == "cuda" else "planned for this CPU"
    budget = size(result.budget_bytes)
    lines = [f"Longest max_seq_len that fits {budget} on {result.device}: "
             f"{result.seq_len:,} tokens (micro-batch {result.micro_batch}; source: predicted, "
             f"{'confirmed by the fake-tensor trace' if result.confirmed_by_trace else 'estimate'}; {ctx})",
             f"  predicted peak there: {size(result.counted_bytes)} ({result.counted_bytes:,} bytes"
             + (f"; {size(result.peak_bytes)} with the CUDA context)" if result.counted_bytes
                != result.peak_bytes else ")")]
    if result.card:
        c = result.card
        lines.append(f"  on the card: allocated {size(c['allocated_bytes'])}, reserved (caching "
                     f"allocator) {size(c['reserved_bytes'])}; attention kernel "
                     f"{c['attention_kernel']}, its backward workspace "
                     f"{small(c['attention_workspace_bytes'])} a layer")
    if result.switches:
        lines.append("  switches: " + ", ".join(f"{k}={v}" for k, v in result.switches.items()))
        costs = [f"{k} x{v:.2f}" if v is not None else f"{k} (cost not measured)"
                 for k, v in result.speed_cost.items()]
        lines.append("  speed cost (step time with / without, bench/results/long_switches.json): "
                     + ", ".join(costs))
    else:
        lines.append("  switches: none needed beyond your settings")
    host = size(result.host_bytes)
    allowed = "no limit" if result.host_limit_bytes is None else size(result.host_limit_bytes)
    lines.append(f"  stopped by: {result.bound}")
    lines.append(f"  host memory for offloaded tensors: {host} (allowed: {allowed})")
    lines += [f"  note: {n}" for n in result.notes]
    return lines
