"""Initialisations that read the run's data or fit a 4-bit base (lora_init eva / corda / loftq)
with peft's own code, on a tiny Qwen2-family model: each runs before the first step with a
progress line, the run stays planned within -1%...+3% (the pass is below the steps' peak here,
and measured), a resume loads the saved initialisation instead of running the pass again and
continues to the same losses, and the saved adapter loads with PeftModel.from_pretrained giving
the logits the trained model gave."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from bench.memory.adapter_variants import tiny_qwen2
from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.core.records import read_records
from lora_gui.engine.text import train as text_train
from lora_gui.models import init_passes
from lora_gui.models.adapters import INIT_FILE

LOW, HIGH = 0.0, 0.03
TINY = dict(max_steps=2, batch_size=4, max_seq_len=64, monitor_hz=0.0, eval_fraction=0.05,
            checkpoint_every=1, precision="fp32", warmup_steps=0, lr=1e-2, lora_rank=4)
IDS = torch.tensor([[1, 5, 9, 12, 40, 7, 300, 2]])
INITS = {"eva": {}, "corda": {}, "loftq": {"quantization": "nf4"}}
PASS = {"eva": "run_eva", "corda": "run_corda", "loftq": "run_loftq"}
PROGRESS = {"eva": "batches read in", "corda": "covariances and decompositions done",
            "loftq": "layers in"}


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return tiny_qwen2(tmp_path_factory.mktemp("qwen2"))


def _train(over, out, monkeypatch, seen=None, **kw):
    if seen is not None:
        save = text_train._save_adapter

        def save_and_look(model, folder):
            model.eval()
            with torch.no_grad():
                seen["logits"] = model(input_ids=IDS).logits.float()
            return save(model, folder)

        monkeypatch.setattr(text_train, "_save_adapter", save_and_look)
    return text_train.train_text(apply_overrides(RunConfig(), over), out, progress=False, **kw)


def _loaded_logits(cfg_over, adapter_dir) -> torch.Tensor:
    from peft import PeftModel

    from lora_gui.models import text as text_models

    cfg = apply_overrides(RunConfig(), cfg_over)
    base = text_models.load_model_for(cfg, cfg.model, torch.float32, torch.device("cpu"))
    if cfg.quantization != "none":  # bitsandbytes' CPU repack for inference fails on tiny layers
        from lora_gui.models.quant import prepare_for_training

        prepare_for_training(base)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits.float()


@pytest.mark.parametrize("init", list(INITS))
def test_init_runs_once_is_planned_resumes_and_loads_back(init, qwen2_dir, tmp_path, monkeypatch, caplog):
    if init == "loftq":
        pytest.importorskip("bitsandbytes")
    over = {**TINY, "model": str(qwen2_dir), "lora_init": init, **INITS[init]}
    seen: dict = {}
    with caplog.at_level(logging.INFO, logger="lora_gui.models.init_passes"):
        straight = _train(over, tmp_path / "straight", monkeypatch, seen)
    assert f"lora_init {init}: " in caplog.text and PROGRESS[init] in caplog.text  # the progress lines
    assert straight["status"] == "completed"
    assert 0 < straight["init_peak_bytes"] <= straight["peak_bytes"]  # measured, below the steps here
    report = straight["memory_report"]
    assert LOW <= report["predicted_vs_measured"] <= HIGH, (report, straight["prediction"])
    assert (tmp_path / "straight" / INIT_FILE).is_file()

    loaded = _loaded_logits(over, tmp_path / "straight" / "adapter")
    assert torch.allclose(loaded, seen["logits"], atol=1e-4, rtol=1e-4), (loaded - seen["logits"]).abs().max()

    monkeypatch.undo()
    _train({**over, "max_steps": 1}, tmp_path / "resumed", monkeypatch)

    def again(*a, **k):
        raise AssertionError(f"a resume ran lora_init {init} again")

    monkeypatch.setattr(init_passes, PASS[init], again)
    cfg = json.loads((tmp_path / "resumed" / "config.json").read_text())
    resumed = _train({**cfg, "max_steps": 2}, tmp_path / "resumed", monkeypatch, resume=True)
    assert resumed["status"] == "completed" and "init_peak_bytes" not in resumed
    losses = [r["loss"] for r in read_records(tmp_path / "resumed" / "metrics.jsonl")]
    assert losses == pytest.approx([r["loss"] for r in read_records(tmp_path / "straight" / "metrics.jsonl")],
                                   rel=1e-5)


@pytest.mark.parametrize(("overrides", "words"), [
    ({"lora_init": "loftq"}, ["loftq", "quantization: nf4", "none"]),
    ({"lora_init": "loftq", "quantization": "int8"}, ["loftq", "quantization: nf4", "int8"]),
    ({"lora_init": "loftq", "quantization": "nf4", "adapter": "dora"}, ["loftq", "dora", "adapter: lora"]),
    ({"lora_init": "eva", "adapter": "dora"}, ["eva", "dora", "adapter: lora"]),
    ({"lora_init": "corda", "adapter": "loha"}, ["lora_init", "loha", "adapter: lora"]),
    ({"lora_init": "eva", "quantization": "nf4"}, ["eva", "nf4", "quantization: none"]),
    ({"lora_init": "corda", "quantization": "int8"}, ["corda", "int8", "quantization: none"]),
    ({"lora_init": "eva", "task": "image"}, ["lora_init", "text runs"]),
])
def test_combinations_peft_cannot_run_are_refused(overrides, words):
    with pytest.raises(ConfigError) as err:
        apply_overrides(RunConfig(), overrides)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_the_form_offers_every_init_with_its_help():
    import gradio as gr

    from lora_gui.ui.forms import settings_fields, widget_for

    field = next(f for f in settings_fields() if f.name == "lora_init")
    with gr.Blocks():
        widget = widget_for(field, "default")
    offered = [c[0] if isinstance(c, tuple) else c for c in widget.choices]
    assert offered == ["default", "gaussian", "pissa", "olora", "loftq", "eva", "corda"]
    assert all(w in widget.info for w in ("loftq (with quantization nf4", "eva (", "corda ("))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_corda_pass_is_planned_as_measured(tmp_path, dtype):
    """CorDA's covariances and full factors, closed form, against the tracker on peft's pass."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from lora_gui.memory.predict.init_trace import corda_peak_bytes, measured_init
    from lora_gui.models.adapters import AdapterSpec, attach_adapter

    model_dir = tiny_qwen2(tmp_path / "m", intermediate_size=1024)
    spec = AdapterSpec("lora", 4, 8.0, 0.0, False, "corda", False)
    predicted = corda_peak_bytes(AutoConfig.from_pretrained(model_dir), dtype=dtype,
                                 target_modules="all-linear", spec=spec, tokens=64)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    rows = [torch.randint(0, 300, (1, 64)) for _ in range(4)]
    _, measured, source = measured_init(
        model, lambda: attach_adapter(model, spec, "all-linear", task_type="CAUSAL_LM", corda_rows=rows),
        torch.device("cpu"))
    assert source == "tracker" and LOW <= predicted / measured - 1 <= HIGH, (predicted, measured)


def test_a_corda_run_whose_pass_is_its_peak_is_planned(tmp_path):
    model_dir = tiny_qwen2(tmp_path / "m", intermediate_size=1024)
    over = {**TINY, "model": str(model_dir), "lora_init": "corda", "batch_size": 1, "max_seq_len": 16,
            "gradient_checkpointing": True, "checkpoint_every": 1000}
    summary = text_train.train_text(apply_overrides(RunConfig(), over), tmp_path / "run", progress=False)
    assert summary["init_peak_bytes"] > summary["step_peak_bytes"]  # the covariances are this run's peak
    assert summary["prediction"]["init_peak_bytes"] == summary["prediction"]["peak_bytes"]
    report = summary["memory_report"]
    assert LOW <= report["predicted_vs_measured"] <= HIGH, (report, summary["prediction"])


def test_a_loftq_run_whose_pass_is_its_peak_is_planned(tmp_path):
    """64 x 4096 MLP weights on a 4-bit base: one layer's original weight, 4-bit copy, error and
    SVD outgrow a 16-token training step."""
    pytest.importorskip("bitsandbytes")
    model_dir = tiny_qwen2(tmp_path / "m", intermediate_size=4096)
    over = {**TINY, "model": str(model_dir), "lora_init": "loftq", "quantization": "nf4", "batch_size": 1,
            "max_seq_len": 16, "gradient_checkpointing": True, "checkpoint_every": 1000}
    summary = text_train.train_text(apply_overrides(RunConfig(), over), tmp_path / "run", progress=False)
    assert summary["init_peak_bytes"] > summary["step_peak_bytes"]
    assert summary["prediction"]["init_peak_bytes"] == summary["prediction"]["peak_bytes"]
    report = summary["memory_report"]
    assert LOW <= report["predicted_vs_measured"] <= HIGH, (report, summary["prediction"])


def test_eva_that_cannot_converge_is_stopped_with_the_way_out(qwen2_dir, tmp_path, monkeypatch):
    """peft skips every batch with fewer trained tokens than lora_rank and would cycle forever."""
    monkeypatch.setattr(init_passes, "EVA_MAX_FORWARDS", 20)  # the same stop, sooner
    over = {**TINY, "model": str(qwen2_dir), "lora_init": "eva", "batch_size": 1, "max_seq_len": 16,
            "lora_rank": 16}
    with pytest.raises(ConfigError, match="did not converge.*larger batch_size"):
        text_train.train_text(apply_overrides(RunConfig(), over), tmp_path / "run", progress=False)


def _eva_samples() -> list:
    """Samples of unequal lengths whose first tokens carry no label (a prompt): padded batches
    whose trained tokens are fewer than their real ones."""
    from lora_gui.data.text import IGNORE_INDEX, TokenizedSample

    gen = torch.Generator().manual_seed(0)
    out = []
    for n in (40, 64, 23, 64, 51, 30, 64, 17, 45, 64, 33, 28):
        ids = torch.randint(3, 300, (n,), generator=gen).tolist()
        out.append(TokenizedSample(ids, [IGNORE_INDEX] * (n // 4) + ids[n // 4:]))
    return out


@pytest.mark.parametrize(("intermediate", "batch_size", "max_len"), [(160, 3, 64), (2048, 2, 24)])
def test_eva_pass_is_planned_as_measured(tmp_path, intermediate, batch_size, max_len):
    """EVA's pass traced with peft's hooks on fake tensors, against the tracker on peft's real pass
    over the same batches (padded rows, prompt tokens without a label): never below, at most +3%."""
    from lora_gui.data.batching import MicroBatch, collate
    from lora_gui.memory.predict.eva_trace import EvaBatch, eva_batches, eva_peak_bytes
    from lora_gui.memory.predict.init_trace import measured_init
    from lora_gui.models.adapters import AdapterSpec, attach_adapter
    from lora_gui.models.text import load_base_model

    model_dir = tiny_qwen2(tmp_path / "m", intermediate_size=intermediate)
    samples = _eva_samples()
    batches = init_passes.init_batches(samples, batch_size, max_len, 0, torch.device("cpu"), collate,
                                       lambda idx, width: MicroBatch(idx, width))
    planned = eva_batches(samples, batch_size, max_len)
    real = [(b["attention_mask"], b["labels"]) for b in batches]  # what peft's mask selects
    assert planned == [EvaBatch(*mask.shape, int((mask.bool() & (labels != -100)).sum()),
                                bool((mask == 0).any())) for mask, labels in real]
    assert any(b.padded for b in planned) and len({b.tokens for b in planned}) > 1
    spec = AdapterSpec("lora", 4, 8.0, 0.0, False, "eva", False)
    predicted = eva_peak_bytes(str(model_dir), dtype=torch.float32, target_modules="all-linear", spec=spec,
                               batches=planned)
    model = load_base_model(str(model_dir), "sdpa")

    def attach():
        peft_model = attach_adapter(model, spec, "all-linear", task_type="CAUSAL_LM")
        init_passes.run_eva(peft_model, batches)
        return peft_model

    _, measured, source = measured_init(model, attach, torch.device("cpu"),
                                        inputs=[t for b in batches for t in b.values()])
    assert source == "tracker" and 0 <= predicted / measured - 1 <= HIGH, (predicted, measured)


def test_an_eva_run_whose_pass_is_its_peak_is_planned(qwen2_dir, tmp_path):
    """Micro-batches of one row (a 16-token budget) train below EVA's pass over the run's first
    batches of 4 rows: the plan counts the pass (the CLI's plan too, reading the data itself); a
    plan of the steps alone would be more than 1% under the run's peak."""
    from lora_gui.memory.predict.run import predict

    over = {**TINY, "model": str(qwen2_dir), "lora_init": "eva", "token_budget": 16, "checkpoint_every": 1000}
    cfg = apply_overrides(RunConfig(), over)
    summary = text_train.train_text(cfg, tmp_path / "run", progress=False)
    prediction = summary["prediction"]
    assert summary["init_peak_bytes"] > summary["step_peak_bytes"]  # EVA's pass is this run's peak
    assert prediction["init_peak_bytes"] == prediction["peak_bytes"] >= summary["init_peak_bytes"]
    assert prediction["step_peak_bytes"] / summary["peak_bytes"] - 1 < LOW  # uncounted, the plan fails
    report = summary["memory_report"]
    assert LOW <= report["predicted_vs_measured"] <= HIGH, (report, prediction)
    planned = predict(cfg, device="cpu")  # the CLI's plan: reads the data itself
    assert planned.peak_bytes == planned.figures["init_peak_bytes"] == prediction["init_peak_bytes"]
