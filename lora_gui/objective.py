"""The training objective's settings: next-token loss (sft) or preference tuning on pairs of
answers (DPO, ORPO, SimPO). A group of :class:`lora_gui.config.RunConfig`'s fields, declared here
to keep config.py short; the form, the CLI and presets see them as any other setting."""

from __future__ import annotations

from dataclasses import dataclass

from lora_gui.options import READS, TEXT, option

OBJECTIVES = ("sft", "dpo", "orpo", "simpo")
PREFERENCE = "preference"  # the settings' group on the form


@dataclass
class PreferenceSettings:
    """Objective and preference-loss settings (mixed into RunConfig)."""

    objective: str = option("sft", "sft: next-token loss on the data. dpo / orpo / simpo: "
                            "preference tuning on pairs (prompt, chosen, rejected): the model "
                            "learns to prefer the chosen answer; each step runs both answers.",
                            PREFERENCE, choices=OBJECTIVES, tasks=TEXT)
    beta: float = option(0.1, "Preference: scale of the implicit reward (DPO 0.1; SimPO about "
                         "2; ORPO: only the logged rewards).", PREFERENCE, low=1e-4, high=100.0,
                         tasks=TEXT)
    dpo_loss: str = option("sigmoid", "DPO loss: sigmoid (the DPO paper), ipo (squared, "
                           "bounded margin) or hinge (SLiC).", PREFERENCE,
                           choices=("sigmoid", "ipo", "hinge"), tasks=TEXT, label="DPO loss")
    orpo_lambda: float = option(0.1, "ORPO: weight of the odds-ratio term added to the chosen "
                                "answer's next-token loss.", PREFERENCE, low=0.0, high=100.0,
                                tasks=TEXT, label="ORPO lambda")
    simpo_gamma: float = option(0.5, "SimPO: target reward margin between chosen and rejected "
                                "(length-normalised log-probabilities times beta).", PREFERENCE,
                                low=0.0, high=100.0, tasks=TEXT, label="SimPO gamma")
    ref_logps: str = option("on_the_fly", "DPO: the reference model's log-probabilities, from "
                            "the same model with the adapter switched off: on_the_fly (a no-grad "
                            "pass each step) or precomputed (one pass before training, stored "
                            "with the run).", PREFERENCE, choices=("on_the_fly", "precomputed"),
                            tasks=TEXT, label="Reference log-probs")
    long_pairs: str = option("skip", "Preference: a pair longer than max_seq_len is skipped and "
                             "counted (skip), or its prompt is cut from the start so both answers "
                             "stay whole (truncate_prompt); an answer is never cut.", PREFERENCE,
                             choices=("skip", "truncate_prompt"), tasks=TEXT)

    init_adapter: str = option("", "Start from an earlier run's adapter (its run folder or adapter "
                               "folder, same adapter settings), e.g. an sft run before dpo; empty: a "
                               "fresh adapter. DPO's reference is then that starting model "
                               "(ref_logps: precomputed).", PREFERENCE, tasks=TEXT,
                               label="Start from adapter", path=READS)

    @property
    def is_preference(self) -> bool:
        """True for dpo, orpo and simpo (pairs of answers), False for sft."""
        return self.objective != "sft"

    def rows_per_sample(self) -> int:
        """Sequences a training sample puts in a micro-batch: 2 for a pair, 1 otherwise."""
        return 2 if self.is_preference else 1

    def sample_token_budget(self) -> int:
        """token_budget in units of samples' padded lengths: a pair's two rows share it."""
        return getattr(self, "token_budget", 2048) // self.rows_per_sample()

    def preference_problem(self) -> str | None:
        """What is wrong with this group's values for the run (None: nothing)."""
        if self.is_preference and getattr(self, "task", "text") != "text":
            return f"objective: {self.objective} is for text runs; image runs use objective: sft"
        if self.is_preference and getattr(self, "batching", "auto") == "packed":
            return (f"batching: packed puts several documents in one row; objective: {self.objective} "
                    "runs the two answers of a pair as rows of their own (use bucketed or fixed)")
        if self.init_adapter and self.objective == "dpo" and self.ref_logps == "on_the_fly":
            return ("ref_logps: on_the_fly takes the reference from the base with the adapter off, "
                    "but a run that starts from init_adapter has that starting model as its "
                    "reference; use ref_logps: precomputed")
        return None
