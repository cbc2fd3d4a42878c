"""The training loop's settings (sequence length, batch, steps, learning rate, checkpoints,
experiment trackers): a group of :class:`lora_gui.config.RunConfig`'s fields."""

from __future__ import annotations

from dataclasses import dataclass

from lora_gui.errors import clip
from lora_gui.options import TEXT, WRITES, ConfigError, option

MIN_SEQ_LEN = 16  # shorter rows leave no room for a useful document
TRACKERS = ("none", "tensorboard", "trackio", "mlflow", "wandb")  # report_to names


@dataclass
class TrainingSettings:
    """The optimizer steps, their batch and what a run logs to (mixed into RunConfig)."""

    # -- training ------------------------------------------------------------------------------
    max_seq_len: int = option(1024, "Longest sample in tokens; longer documents are truncated.",
                              "train", low=MIN_SEQ_LEN, high=1 << 20, tasks=TEXT,
                              label="Max sequence length (tokens)")
    batch_size: int = option(8, "Samples per optimizer step (the effective batch).", "train",
                             low=1, high=4096)
    max_steps: int = option(0, "Stop after this many optimizer steps (0 = run all epochs).",
                            "train", low=0, high=10_000_000)
    epochs: int = option(1, "Passes over the training documents.", "train", low=1, high=1000)
    lr: float = option(1e-3, "Peak learning rate (AdamW), cosine decay after warmup.", "train",
                       low=1e-7, high=1.0, label="Learning rate")
    warmup_steps: int = option(5, "Linear warmup steps.", "train", low=0, high=1_000_000)
    weight_decay: float = option(0.0, "AdamW weight decay.", "train", low=0.0, high=1.0)
    seed: int = option(0, "Seed for the data split, data order and LoRA init.", "train",
                       low=0, high=2**31 - 1)
    checkpoint_every: int = option(50, "Save a checkpoint every N steps (and always on stop).",
                                   "train", low=1, high=10_000_000)
    report_to: str = option("none", "Also log the run to experiment trackers: a comma list of "
                            f"{', '.join(TRACKERS)} (e.g. tensorboard,trackio). TensorBoard and "
                            "trackio write beside the run (offline); mlflow needs MLFLOW_TRACKING_URI, "
                            "wandb a login (wandb login) or WANDB_MODE=offline.", "train")
    tracker_dir: str = option("", "Folder for TensorBoard and trackio data (empty: TensorBoard in the "
                              "run folder, trackio in TRACKIO_DIR or trackio/ beside the run folder).",
                              "train", path=WRITES)

    def trackers(self) -> list[str]:
        """report_to as a list of tracker names, without 'none' (empty: no tracker)."""
        names = [n.strip().lower() for n in self.report_to.split(",") if n.strip()]
        unknown = [n for n in names if n not in TRACKERS]
        if unknown:
            raise ConfigError(f"report_to: {clip(unknown[0])} is not a tracker; use a comma list of "
                              f"{', '.join(TRACKERS)}")
        if "none" in names and len(names) > 1:
            raise ConfigError(f"report_to: {clip(self.report_to)} names 'none' with other trackers")
        return list(dict.fromkeys(n for n in names if n != "none"))
