"""Chat data end to end: each format trains the built-in model and a local Qwen2; packed rows
never attend across conversations; generation and export of a chat run."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.data.batching import MicroBatch, collate, plan_epoch
from lora_gui.data.chat import Conversation
from lora_gui.data.chat_template import ensure_chat_template, tokenize_conversations
from lora_gui.data.text import IGNORE_INDEX, DataError
from lora_gui.engine.core.rundir import RunDirError
from lora_gui.engine.export.run_export import ExportError, export_run
from lora_gui.engine.generate import TextTrial, open_run
from lora_gui.engine.text.train import train_text
from lora_gui.models.text import load_tokenizer
from tests.chat_templates import save_tiny_qwen2

QA = [("what is a wave", "a moving disturbance."), ("what is light", "a wave and a particle."),
      ("who wrote hamlet", "shakespeare."), ("what is ice", "frozen water."),
      ("what is a comet", "a ball of ice in space."), ("what is rain", "water that falls.")]
RECORDS = {
    "messages": [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
                 for q, a in QA],
    "sharegpt": [{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
                 for q, a in QA],
    "alpaca": [{"instruction": q, "input": "", "output": a} for q, a in QA],
    "prompt_response": [{"prompt": q, "response": a} for q, a in QA],
    "text": [{"text": f"{q}? {a}"} for q, a in QA],
}


def chat_cfg(data, **kw) -> RunConfig:
    base = {"data": str(data), "max_seq_len": 64, "batch_size": 2, "max_steps": 2, "lr": 5e-3,
            "eval_fraction": 0.2, "warmup_steps": 0, "precision": "fp32", "monitor_hz": 0.0}
    return apply_overrides(RunConfig(), {**base, **kw})


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory, builtin_model_dir):
    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2"), builtin_model_dir)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", list(RECORDS))
@pytest.mark.parametrize("model", ["builtin", "qwen2"])
def test_each_format_trains_the_builtin_model_and_a_local_qwen2(tmp_path, fmt, model, qwen2_dir):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS[fmt]))
    out = tmp_path / "run"
    summary = train_text(chat_cfg(data, model=str(qwen2_dir) if model == "qwen2" else model), out,
                         progress=False)
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert summary["eval_loss"] is not None and summary["base_eval_loss"] is not None
    chat = fmt in ("messages", "sharegpt", "alpaca")
    saved = out / "adapter" / "tokenizer_config.json"
    assert saved.is_file() == chat  # chat runs carry their template with the adapter
    if chat:
        tok = AutoTokenizer.from_pretrained(out / "adapter")
        assert "<|im_start|>" in tok.chat_template
        assert open_run(out).is_chat


def test_builtin_chat_run_trains_the_added_tokens_and_generates_and_exports(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS["messages"]))
    out = tmp_path / "run"
    cfg = chat_cfg(data, max_steps=3)
    summary = train_text(cfg, out, progress=False)
    # the trained token rows are in the prediction (peft trainable tokens: a full-table copy a pass)
    report = summary["memory_report"]
    assert -0.01 <= report["predicted_vs_measured"] <= 0.03, report
    from lora_gui.memory.predict.run import text_memory_plan
    from lora_gui.models.text import resolve_model_source

    form = text_memory_plan(cfg, resolve_model_source(cfg.model), None, "cpu")[3]  # reads the data itself
    assert form["peak_bytes"] == report["predicted_peak_bytes"]
    trial = TextTrial(open_run(out), device="cpu")
    assert len(trial.tokenizer) == 4098  # the built-in 4096 + ChatML's two tokens
    prompt = trial.prompt_ids("what is ice")[0].tolist()
    assert trial.tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    texts = [list(trial.stream("what is ice", adapter=a, max_new_tokens=8, temperature=0, seed=1))
             for a in (False, True)]
    assert all(t and isinstance(t[-1], str) for t in texts)
    assert texts[0][-1] != texts[1][-1]  # the adapter (and its trained token rows) changes the answer
    merged_dir = export_run(out, tmp_path / "merged", merged=True)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        expected = TextTrial(open_run(out), device="cpu").model(input_ids=ids).logits
        assert torch.allclose(merged(input_ids=ids).logits, expected, atol=1e-4)
    assert AutoTokenizer.from_pretrained(merged_dir).chat_template == trial.tokenizer.chat_template
    card = export_run(out, tmp_path / "adapter-export") / "README.md"
    assert "base model: `builtin`" in card.read_text()
    assert (card.parent / "adapter_model.safetensors").is_file()


def test_export_and_generate_refuse_bad_input_and_write_nothing(tmp_path):
    empty = tmp_path / "no-run"
    empty.mkdir()
    with pytest.raises(RunDirError, match="not a run folder"):
        open_run(empty)
    (empty / "config.json").write_text(json.dumps(RunConfig().to_dict()))
    with pytest.raises(RunDirError, match="has no trained adapter"):
        export_run(empty, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("keep")
    (empty / "adapter").mkdir()
    (empty / "adapter" / "adapter_config.json").write_text("{}")
    with pytest.raises(ExportError, match="exists and is not empty"):
        export_run(empty, taken)
    assert [p.name for p in taken.iterdir()] == ["x"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-run", "taken"]  # no staging left


def test_bad_chat_data_writes_no_run_folder(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(DataError, match="bad.jsonl:1: the conversation has no assistant turn"):
        train_text(chat_cfg(data), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_batch_builders_keep_the_answer_masks_and_packing_isolates_conversations(builtin_model_dir):
    tok = load_tokenizer(str(builtin_model_dir))
    ensure_chat_template(tok)
    convs = [Conversation(r["messages"], f"x:{i}") for i, r in enumerate(RECORDS["messages"])]
    samples = tokenize_conversations(tok, convs, 64)
    lengths = [len(s) for s in samples]
    for batching in ("fixed", "bucketed", "packed"):
        for step in plan_epoch(lengths, batching, batch_size=3, max_seq_len=64, seed=0, epoch=0):
            for mb in step.micro_batches:
                labels = collate(samples, mb, tok.pad_token_id)["labels"]
                got = sorted(int(t) for t in labels.flatten() if t != IGNORE_INDEX)
                want = sorted(t for i in mb.indices for t in samples[i].labels[1:] if t != IGNORE_INDEX)
                assert got == want, batching  # every answer token trained, no prompt token
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir, attn_implementation="sdpa")
    model.resize_token_embeddings(len(tok))
    model.eval()
    packed = collate(samples, MicroBatch((0, 1, 2), sum(lengths[:3]), packed=True), tok.pad_token_id)
    with torch.no_grad():
        together = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"],
                         use_cache=False).logits[0]  # as the engine runs packed rows
        start = 0
        for i in range(3):
            alone = model(input_ids=torch.tensor([samples[i].input_ids])).logits[0]
            assert torch.allclose(together[start:start + lengths[i]], alone, atol=1e-4)
            start += lengths[i]
