"""How long a micro-batch's forward and backward take on the device a run trains on (source:
measured), and which micro-batch per length bucket trains fastest inside a memory budget.

The model of one micro-batch of ``rows`` rows padded to ``length`` tokens::

    seconds = overhead_s + rows * length * (per_token_s + per_token_pair_s * length)

``overhead_s`` is what a forward and backward cost whatever their size (Python, kernel launches,
the adapter's small matmuls); ``per_token_s`` the cost of one token through the linear layers;
``per_token_pair_s * length`` the attention's cost per token, which grows with the length.

The coefficients are measured by a short calibration of the run's own architecture (random
weights: the time does not depend on their values) on the run's device: the smallest step
(:data:`OVERHEAD_SHAPE`) gives the overhead, steps of about :data:`CALIBRATION_TOKENS` tokens
at three lengths give the per-token cost and its growth with length. A calibration is cached per
machine, device, torch version, thread count and step settings in a JSON file
(:func:`cache_path`), so a plan and the run that follows read the same coefficients, and a
second plan costs nothing. A measured calibration rather than a table shipped with the program:
the CPUs users train on differ too much for one table, and timing a small model takes seconds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

OVERHEAD_SHAPE = (1, 16)  # (rows, tokens): a step this small is almost all fixed cost
CALIBRATION_TOKENS = 512  # tokens per timed micro-batch at each calibration length
CALIBRATION_REPEATS = 3  # timed steps per shape (the median is kept), after one warm-up step
# largest models timed for a plan: a step of a larger model on a CPU takes too long for a plan
# (a 100M-parameter fp32 step of 1,024 tokens: about a second per core); on a GPU the model must
# also fit beside what the card holds, and planning stays a matter of seconds
MAX_CALIBRATION_PARAMS = {"cpu": 100_000_000, "cuda": 2_000_000_000}
HEADROOM_SHARE = 0.9  # batch_choice 'headroom': keep at least this share of the fastest tokens/s
CACHE_VERSION = 3  # 2: the step's FLOP count and the matmul peak (MFU); 3: the host link's round trip
HOST_COPY_BYTES = 64 * 2**20  # bytes timed to host memory and back (pinned) for the host link's rate
CACHE_ENV = "LORA_GUI_CACHE_DIR"  # where calibrations are kept (default ~/.cache/lora_gui)


@dataclass(frozen=True)
class StepTimeModel:
    """Seconds of one micro-batch's forward and backward (see the module doc).

    Attributes:
        overhead_s: seconds per micro-batch whatever its size.
        per_token_s: seconds per padded token through the layers.
        per_token_pair_s: seconds per padded token per token of length (attention).
        device: 'cpu' or 'cuda'.
        source: how the coefficients were had ('calibrated on ...' or 'cached calibration ...').
        points: the timed (rows, length, seconds) the coefficients come from.
        flops: the step's useful FLOPs (:class:`lora_gui.models.flops.TextFlops`: per token
            through the frozen projections, per token through the adapters, per causal pair of
            attention), counted on the calibrated model; None: not counted.
        peak_flops_per_s: the device's measured matmul peak in the step's compute dtype
            (FLOP/s, :func:`lora_gui.models.flops.machine_peak`), the MFU's denominator.
        host_round_trip_s_per_byte: seconds per byte copied to host memory and back (pinned,
            measured on the GPU, :func:`host_round_trip_seconds_per_byte`): what offloading the
            checkpointed layer inputs costs; None on a CPU, where it saves nothing.
    """

    overhead_s: float
    per_token_s: float
    per_token_pair_s: float
    device: str
    source: str
    points: tuple[tuple[int, int, float], ...] = ()
    flops: tuple[int, int, int] | None = None
    peak_flops_per_s: float | None = None
    host_round_trip_s_per_byte: float | None = None

    def seconds(self, rows: int, length: int) -> float:
        """Predicted seconds of one micro-batch of ``rows`` x ``length`` padded tokens."""
        return self.overhead_s + rows * length * (self.per_token_s + self.per_token_pair_s * length)

    def step_seconds(self, samples: int, micro_batch: int, length: int) -> float:
        """Predicted seconds of ``samples`` rows of ``length`` tokens cut into micro-batches of at
        most ``micro_batch`` rows (the last one holds the rest)."""
        full, rest = divmod(samples, micro_batch)
        return full * self.seconds(micro_batch, length) + (self.seconds(rest, length) if rest else 0.0)

    def tokens_per_s(self, samples: int, micro_batch: int, length: int) -> float:
        """Predicted padded tokens per second of such a step (forward and backward)."""
        return samples * length / self.step_seconds(samples, micro_batch, length)

    def useful_flops(self, lengths: Sequence[int]) -> int | None:
        """Useful FLOPs of a step over rows of ``lengths`` real tokens (padding excluded), counted
        as the run counts them (:meth:`lora_gui.models.flops.TextFlops.step`); None uncounted."""
        if self.flops is None:
            return None
        from lora_gui.models.flops import TextFlops

        return TextFlops(*self.flops).step(lengths)

    def mfu(self, samples: int, micro_batch: int, length: int) -> float | None:
        """Predicted model FLOPs utilisation of a step of ``samples`` full rows of ``length``
        tokens cut into micro-batches of ``micro_batch``: useful FLOPs over the predicted seconds
        over the measured matmul peak (None without a count or a peak)."""
        flops = self.useful_flops([length] * samples)
        if not flops or not self.peak_flops_per_s:
            return None
        return plausible_mfu(flops / self.step_seconds(samples, micro_batch, length) / self.peak_flops_per_s)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "points": [list(p) for p in self.points],
                "flops": list(self.flops) if self.flops else None}

    @classmethod
    def from_json(cls, row: dict[str, Any], source: str | None = None) -> StepTimeModel:
        """A model from :meth:`to_json` (``source``: in place of the stored one)."""
        return cls(row["overhead_s"], row["per_token_s"], row["per_token_pair_s"], row["device"],
                   source or row["source"], tuple(tuple(p) for p in row["points"]),
                   tuple(row["flops"]) if row.get("flops") else None, row.get("peak_flops_per_s"),
                   row.get("host_round_trip_s_per_byte"))


def plausible_mfu(share: float) -> float | None:
    """``share`` when it is at most 1; above, the matmul peak was measured while the machine was
    busier than during the step's timing (both are measured, at different moments): no MFU then."""
    if share > 1:
        log.warning("step time: a predicted MFU of %.0f%% is above the measured matmul peak (the "
                    "machine was busy while it was measured); no MFU predicted", 100 * share)
        return None
    return share


def fit(points: Sequence[tuple[int, int, float]], overhead_s: float, device: str,
        source: str) -> StepTimeModel:
    """The coefficients from timed micro-batches: ``overhead_s`` measured apart, then the cost per
    token ``(seconds - overhead_s) / tokens`` fitted as a line in the length (least squares; a
    negative slope or intercept, which timing noise can give, is set to 0 and the other refitted).

    Raises:
        ValueError: fewer than two lengths, or a point that is not (rows >= 1, length >= 1, s > 0).
    """
    for rows, length, seconds in points:
        if rows < 1 or length < 1 or not seconds > 0:
            raise ValueError(f"step time: a timed point must be (rows >= 1, length >= 1, seconds > 0), "
                             f"got {(rows, length, seconds)}")
    if len({length for _, length, _ in points}) < 2:
        raise ValueError("step time: the calibration needs points at two lengths at least")
    xs = [float(length) for _, length, _ in points]
    ys = [max(0.0, seconds - overhead_s) / (rows * length) for rows, length, seconds in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
    intercept = mean_y - slope * mean_x
    if slope < 0:  # attention cannot make a token cheaper: the cost is flat within the noise
        slope, intercept = 0.0, mean_y
    if intercept < 0:  # the line through the origin
        intercept = 0.0
        slope = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return StepTimeModel(overhead_s, intercept, slope, device, source, tuple(points))


def calibration_shapes(longest: int) -> list[tuple[int, int]]:
    """(rows, length) timed for the per-token cost: three lengths up to ``longest`` (at least
    64 apart), each with about :data:`CALIBRATION_TOKENS` tokens."""
    top = max(64, min(longest, CALIBRATION_TOKENS))
    lengths = sorted({max(16, top // 4), max(32, top // 2), top})
    return [(max(1, CALIBRATION_TOKENS // n), n) for n in lengths]


def time_steps(step: Callable[[int, int], None], shapes: Sequence[tuple[int, int]],
               device: str, repeats: int = CALIBRATION_REPEATS) -> list[tuple[int, int, float]]:
    """Median seconds of ``step(rows, length)`` per shape, after one untimed warm-up each; the
    shapes are timed in rounds (every shape once per round) so a slow spell of a shared machine
    falls on all of them."""
    def once(rows: int, length: int) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step(rows, length)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for shape in shapes:
        once(*shape)
    times: dict[tuple[int, int], list[float]] = {tuple(s): [] for s in shapes}
    for _ in range(repeats):
        for shape in shapes:
            times[tuple(shape)].append(once(*shape))
    return [(rows, length, statistics.median(ts)) for (rows, length), ts in times.items()]


def calibrate(step: Callable[[int, int], None], longest: int, device: str) -> StepTimeModel:
    """Times ``step(rows, length)`` (one forward and backward) at :data:`OVERHEAD_SHAPE` and at
    :func:`calibration_shapes` and fits the model (a few seconds on a CPU for a small model)."""
    (_, _, overhead), *points = time_steps(step, [OVERHEAD_SHAPE, *calibration_shapes(longest)], device)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    return fit(points, overhead, device, f"calibrated on {device_name(device)} ({when})")


def host_round_trip_seconds_per_byte(device: str) -> float | None:
    """Seconds per byte of a copy from the GPU to pinned host memory and back (the median of
    :data:`CALIBRATION_REPEATS` round trips of :data:`HOST_COPY_BYTES`, after a warm-up): the
    rate at which offloaded layer inputs travel. None on a CPU: host and device are the same
    memory there, so offloading keeps nothing off it and a plan does not choose it."""
    if device != "cuda" or not torch.cuda.is_available():
        return None
    on_card = torch.empty(HOST_COPY_BYTES, dtype=torch.uint8, device="cuda")
    on_host = torch.empty(HOST_COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    times = []
    for _ in range(1 + CALIBRATION_REPEATS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        on_host.copy_(on_card, non_blocking=True)
        on_card.copy_(on_host, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    del on_card, on_host
    return statistics.median(times[1:]) / HOST_COPY_BYTES


def device_name(device: str) -> str:
    """The device in words: the GPU's name, or the CPU's model and the threads torch uses."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {torch.get_num_threads()} threads"


def cache_path() -> Path:
    """The JSON file of cached calibrations (``$LORA_GUI_CACHE_DIR`` or ~/.cache/lora_gui)."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "lora_gui"
    return Path(root) / "step_time.json"


def cache_key(device: str, what: dict[str, Any]) -> str:
    """A calibration's key: the machine and device, torch's version and threads, and ``what``
    (the step's architecture and settings), hashed."""
    text = json.dumps({"machine": platform.node(), "device": device_name(device),
                       "torch": torch.__version__, "version": CACHE_VERSION, **what},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached(key: str, measure: Callable[[], Any] | None, kind: Any = None) -> Any:
    """The calibration stored under ``key``, else ``measure()`` stored there (None, no model to
    time, is not stored; ``measure`` None: the stored one or None, nothing timed; a file that
    cannot be read or written is logged and the measurement used as it is). ``kind``: the
    model's class, read back with its ``from_json`` (default :class:`StepTimeModel`; an image
    run's is :class:`lora_gui.memory.predict.image_speed.ImageStepTimeModel`)."""
    kind = kind or StepTimeModel
    path = cache_path()
    try:
        stored = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as err:
        log.warning("step time: cannot read the calibrations in %s (%s); measuring again", path, err)
        stored = {}
    if key in stored:
        return kind.from_json(stored[key], f"cached {stored[key]['source']}")
    if measure is None:  # asked for a stored calibration only
        return None
    model = measure()
    if model is None:
        return None
    stored[key] = model.to_json()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(stored, indent=1))
        tmp.replace(path)  # atomic: two plans at once leave one whole file
    except OSError as err:
        log.warning("step time: cannot keep the calibration in %s (%s)", path, err)
    return model


def choose_micro_batch(model: StepTimeModel, samples: int, length: int, largest: int,
                       choice: str) -> int:
    """The micro-batch for ``samples`` rows of ``length`` tokens a step, from 1 to ``largest``
    (the largest that fits the budget).

    ``choice``: 'largest' (the largest that fits); 'fastest' (the highest predicted tokens/s; of
    equally fast ones the smallest, which holds the least memory); 'headroom' (the smallest that
    keeps :data:`HEADROOM_SHARE` of the fastest predicted tokens/s).
    """
    if choice not in ("largest", "fastest", "headroom"):
        raise ValueError(f"batch_choice: {choice!r} is not one of largest, fastest, headroom")
    if largest <= 1 or choice == "largest":
        return largest
    speed = {m: model.tokens_per_s(samples, m, length) for m in range(1, largest + 1)}
    best = max(speed.values())
    # 1e-9: rounding of equal predictions (two cuts into the same micro-batch counts)
    floor = best * (HEADROOM_SHARE if choice == "headroom" else 1 - 1e-9)
    return min(m for m, s in speed.items() if s >= floor)


def largest_calibrated_params(device: str) -> int:
    """Parameters of the largest model timed for a plan on ``device`` (see the constant)."""
    return MAX_CALIBRATION_PARAMS.get(device, 0)
