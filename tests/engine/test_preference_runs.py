"""Preference runs end to end on a tiny Qwen2 saved with save_pretrained: DPO, ORPO and SimPO
train on the bundled demo pairs, are planned exactly, their adapters load with peft, and a
resumed run continues the same pairs."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from lora_gui.config import BUILTIN_DATA, ConfigError, RunConfig, apply_overrides
from lora_gui.engine.core.control import TrainControl
from lora_gui.engine.text.train import train_text
from tests.chat_templates import save_tiny_qwen2

LOW, HIGH = 0.0, 0.03  # predicted_vs_measured, as every other mode


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory, builtin_model_dir):
    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2"), builtin_model_dir)


@pytest.fixture(scope="module")
def demo_pairs(tmp_path_factory):
    """The first 64 bundled demo pairs (a quarter held out)."""
    lines = BUILTIN_DATA["builtin:pairs"].read_text(encoding="utf-8").splitlines()[:64]
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def pref_cfg(model, data, **kw) -> RunConfig:
    base = {"model": str(model), "data": str(data), "objective": "dpo", "max_seq_len": 96,
            "pad_multiple": 16, "batch_size": 8, "max_steps": 3, "lr": 1e-2, "eval_fraction": 0.25,
            "warmup_steps": 0, "precision": "fp32", "monitor_hz": 0.0, "checkpoint_every": 2}
    return apply_overrides(RunConfig(), {**base, **kw})


@pytest.mark.parametrize("objective, extra", [
    ("dpo", {}), ("dpo", {"ref_logps": "precomputed", "loss_chunk": 0}), ("orpo", {}),
    ("simpo", {"beta": 2.0})])
def test_each_objective_trains_is_planned_exactly_and_loads_with_peft(tmp_path, qwen2_dir, demo_pairs,
                                                                      objective, extra):
    out = tmp_path / "run"
    summary = train_text(pref_cfg(qwen2_dir, demo_pairs, objective=objective, **extra), out,
                         progress=False)
    assert summary["status"] == "completed" and summary["steps"] == 3
    report = summary["memory_report"]
    assert LOW <= report["predicted_vs_measured"] <= HIGH, report
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for key in ("loss", "rewards_chosen", "rewards_rejected", "reward_margin", "reward_accuracy"):
        assert all(isinstance(r[key], float | int) and r[key] == r[key] for r in records), key
    assert records[0]["padded_tokens"] == 2 * 8 * records[0]["seq_len"]  # both answers of 8 pairs
    if objective == "dpo":
        assert abs(records[0]["reward_margin"]) < 1e-4  # adapter B = 0: the policy is the reference
    assert (out / "reference_logps.pt").is_file() == (extra.get("ref_logps") == "precomputed")
    base = AutoModelForCausalLM.from_pretrained(qwen2_dir)
    base.resize_token_embeddings(base.get_input_embeddings().weight.shape[0])
    tuned = PeftModel.from_pretrained(base, out / "adapter")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert tuned(input_ids=ids).logits.shape[-1] == base.config.vocab_size
    assert summary["eval_pairs"] == 16 and summary["base_eval_reward_accuracy"] is not None


@pytest.mark.slow
@pytest.mark.parametrize("objective, extra", [("dpo", {}), ("orpo", {"orpo_lambda": 1.0}),
                                              ("simpo", {"beta": 2.0})])
def test_held_out_reward_accuracy_rises_above_the_base(tmp_path, qwen2_dir, demo_pairs, objective, extra):
    summary = train_text(pref_cfg(qwen2_dir, demo_pairs, objective=objective, max_steps=24,
                                  checkpoint_every=100, **extra), tmp_path / "run", progress=False)
    assert summary["eval_reward_accuracy"] > summary["base_eval_reward_accuracy"], summary
    assert summary["eval_reward_accuracy"] > 0.5, summary  # more than a coin would
    assert summary["eval_likelihood_accuracy"] > summary["base_eval_likelihood_accuracy"], summary


@pytest.mark.slow
def test_resume_continues_the_same_pairs(tmp_path, qwen2_dir, demo_pairs):
    cfg = pref_cfg(qwen2_dir, demo_pairs, max_steps=4, ref_logps="precomputed")
    whole = train_text(cfg, tmp_path / "whole", progress=False)
    control = TrainControl()
    control.on_record = lambda r: control.stop.set() if r["step"] == 2 else None
    stopped = train_text(cfg, tmp_path / "cut", control=control, progress=False)
    assert stopped["status"] == "stopped" and stopped["steps"] == 2
    reference = torch.load(tmp_path / "cut" / "reference_logps.pt")
    resumed = train_text(cfg, tmp_path / "cut", resume=True, progress=False)
    assert resumed["status"] == "completed" and resumed["steps"] == 4

    def losses(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["loss"] for line in lines]

    assert losses("cut") == pytest.approx(losses("whole"), rel=1e-5, abs=1e-6)
    assert torch.equal(torch.load(tmp_path / "cut" / "reference_logps.pt"), reference)  # read back
    assert whole["eval_reward_accuracy"] == resumed["eval_reward_accuracy"]


@pytest.mark.slow
def test_a_budget_cuts_the_pairs_into_planned_micro_batches(tmp_path, qwen2_dir, demo_pairs):
    from lora_gui.memory.predict.run_predict import predict_text_run

    whole = predict_text_run(pref_cfg(qwen2_dir, demo_pairs), "cpu")
    assert whole.shape.batch_size == 8 and whole.step.info["objective"] == "dpo"
    budget_gb = round(0.7 * whole.peak_bytes / 1e9, 4)  # 8 pairs a micro-batch do not fit
    cfg = pref_cfg(qwen2_dir, demo_pairs, max_steps=2, budget_gb=budget_gb)
    summary = train_text(cfg, tmp_path / "run", progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["micro_batches"] > 1 and r["batch_size"] == 8 for r in records), records
    report = summary["memory_report"]
    assert LOW <= report["predicted_vs_measured"] <= HIGH, report
    assert report["peak_bytes"] <= budget_gb * 1e9, report  # the planned cut keeps the run under it


@pytest.mark.slow
def test_dpo_starts_from_an_sft_runs_adapter_with_it_as_the_reference(tmp_path, qwen2_dir, demo_pairs,
                                                                      monkeypatch):
    chats = tmp_path / "chats.jsonl"
    rows = [json.loads(line) for line in demo_pairs.read_text().splitlines()]
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": r["prompt"]},
                                                      {"role": "assistant", "content": r["chosen"]}]})
                             + "\n" for r in rows))
    sft = train_text(pref_cfg(qwen2_dir, chats, objective="sft", max_steps=2), tmp_path / "sft",
                     progress=False)
    assert sft["status"] == "completed"
    with pytest.raises(ConfigError, match="ref_logps: precomputed"):
        pref_cfg(qwen2_dir, demo_pairs, init_adapter=str(tmp_path / "sft"))
    cfg = pref_cfg(qwen2_dir, demo_pairs, init_adapter=str(tmp_path / "sft"), ref_logps="precomputed")
    with pytest.raises(ConfigError, match="has rank 8; set lora_rank: 8"):
        train_text(apply_overrides(cfg, {"lora_rank": 4}), tmp_path / "bad", progress=False)
    with pytest.raises(ConfigError, match="holds no adapter"):
        train_text(apply_overrides(cfg, {"init_adapter": str(tmp_path)}), tmp_path / "bad", progress=False)
    assert not (tmp_path / "bad").exists()  # refused before anything was written
    summary = train_text(cfg, tmp_path / "dpo", progress=False)
    first = json.loads((tmp_path / "dpo" / "metrics.jsonl").read_text().splitlines()[0])
    assert abs(first["reward_margin"]) < 1e-4  # step 1: the policy is the starting (sft) model
    assert first["loss"] == pytest.approx(0.6931, abs=1e-3)
    train_text(pref_cfg(qwen2_dir, demo_pairs, max_steps=1, ref_logps="precomputed"), tmp_path / "fresh",
               progress=False)  # the base's reference is not the sft model's
    assert not torch.equal(torch.load(tmp_path / "dpo" / "reference_logps.pt"),
                           torch.load(tmp_path / "fresh" / "reference_logps.pt"))
    assert summary["status"] == "completed"
    # Try: base, the sft adapter the run started from and the dpo adapter side by side
    from lora_gui.engine.generate import TextTrial, open_run
    from lora_gui.ui import common
    from lora_gui.ui.tabs import try_handlers

    trial = TextTrial(open_run(tmp_path / "dpo"), device="cpu")
    assert trial.start == tmp_path / "sft" / "adapter"
    answers = [list(trial.stream("What is AI?", adapter=a, max_new_tokens=6, temperature=0))[-1]
               for a in (False, "start", True)]
    assert answers[1] != answers[2] or answers[0] != answers[1]  # three models, not one
    assert TextTrial(open_run(tmp_path / "fresh"), device="cpu").start is None
    monkeypatch.setattr(common, "RUNS_ROOT", tmp_path)  # the page reaches runs in its runs folder
    from lora_gui.ui import paths

    paths.configure(allow=[qwen2_dir, demo_pairs.parent])  # the run's model and data (--allow-path)
    try:
        *texts, message = list(try_handlers.generate(str(tmp_path / "dpo"), "What is AI?", 6, 0.0, 0,
                                                      1.0))[-1]
    finally:
        paths.configure()
    assert message.startswith("Done") and texts[4] == answers[1] and texts[1] == answers[2]


def test_an_out_of_memory_step_is_split_into_smaller_micro_batches_of_pairs(tmp_path, qwen2_dir, demo_pairs,
                                                                          monkeypatch):
    monkeypatch.setenv("LORA_GUI_INJECT_OOM", "0:2")
    summary = train_text(pref_cfg(qwen2_dir, demo_pairs), tmp_path / "run", progress=False)
    assert summary["status"] == "completed" and summary["steps"] == 3
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["micro_batches"] for r in records] == [1, 2, 2]  # the guard keeps the smaller cap
    assert all(r["batch_size"] == 8 for r in records)
    assert summary["memory_report"]["oom_events_recovered"] == 1
