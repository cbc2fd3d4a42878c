"""The Train tab on several GPUs: how they share the run (DDP, FSDP, FSDP with offload) is planned
per GPU by the same call as `plan --world-size N --fsdp [--offload]`, and launched as planned."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lora_gui.engine.jobs.launch import FSDP_CONFIG, launch_command
from lora_gui.ui import common, gpu_share
from lora_gui.ui.tabs import train_handlers as handle
from lora_gui.ui.tabs import train_prediction_handlers as predicted
from lora_gui.units import gb


def values(**kw):
    return {**handle.form_values("text-demo"), **kw}


@pytest.fixture()
def two_gpus(tmp_path, monkeypatch):
    """Two GPUs shown, and a job manager that records what it is asked to start."""
    started = []

    def start(cfg, out, **kw):
        started.append(kw)
        return SimpleNamespace(name=out.name, out=out)

    monkeypatch.setattr(common, "RUNS_ROOT", tmp_path)
    monkeypatch.setattr(common, "gpu_count", lambda: 2)
    monkeypatch.setattr(common, "MANAGER", SimpleNamespace(start=start))
    return started


def test_start_launches_the_sharing_picked(two_gpus):
    message, _, _ = handle.start("r", 2, values(quantization="nf4"), handle.START_NEW,
                                 gpu_share.FSDP_OFFLOAD)
    assert two_gpus == [{"overwrite": False, "processes": 2, "fsdp": True, "offload": True}], message
    assert "on 2 GPUs, FSDP (frozen weights sharded, offloaded to host memory)" in message
    handle.start("d", 2, values(), handle.START_NEW, gpu_share.REPLICATED)
    assert two_gpus[-1] == {"overwrite": False, "processes": 2, "fsdp": False, "offload": False}


@pytest.mark.parametrize("kw, words", [({"task": "image"}, "FSDP shards text runs; a image run"),
                                       ({"quantization": "int8"}, "cannot shard an int8 base")])
def test_a_sharing_the_run_cannot_use_starts_nothing(two_gpus, kw, words):
    message, _, _ = handle.start("r", 2, values(**kw), handle.START_NEW, gpu_share.FSDP)
    assert message.startswith("Error: sharing over GPUs:") and words in message and two_gpus == []


def test_the_launch_uses_the_fsdp_config_with_its_offload_switch():
    out, preset = Path("runs/x"), Path("runs/.launch/x.yaml")
    ddp = launch_command(preset, out, 2, False)
    assert "--multi_gpu" in ddp and "--config_file" not in ddp
    for offload in (False, True):
        cmd = launch_command(preset, out, 2, False, fsdp=True, offload=offload)
        assert "--multi_gpu" not in cmd and FSDP_CONFIG.is_file()
        assert cmd[cmd.index("--config_file") + 1] == str(FSDP_CONFIG)
        assert cmd[cmd.index("--fsdp_offload_params") + 1] == ("true" if offload else "false")
        assert cmd[cmd.index("--num_processes") + 1] == "2"
    assert "accelerate" not in " ".join(launch_command(preset, out, 1, False, fsdp=True))


@pytest.mark.slow
def test_the_train_tabs_plan_for_2_processes_with_fsdp_is_the_clis(two_gpus, capsys):
    """The run's own plan on the Train tab, 2 processes with FSDP over an nf4 base, is the figure of
    `plan --world-size 2 --fsdp --json` for the same settings and budget (here: planned for this
    CPU; the budget sets the micro-batches)."""
    from lora_gui.cli import main
    from lora_gui.memory.predict import predict

    capsys.readouterr()
    assert main(["plan", "--preset", "text-demo", "--set", "quantization=nf4", "--world-size", "2",
                 "--fsdp", "--budget-gb", "2", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    text, _, _ = predicted.prediction_view(values(quantization="nf4", budget_gb=2.0), 2, True, gpu_share.FSDP)
    assert f"Predicted peak: **{gb(cli['peak_bytes'])}**" in text and "Per GPU: 2 GPUs, FSDP" in text
    cfg, _ = handle.config_from_form(values(quantization="nf4", budget_gb=2.0))
    assert predict(cfg, processes=2, fsdp=True).peak_bytes == cli["peak_bytes"]
    nf4 = values(quantization="nf4", budget_gb=2.0)
    text, _, _ = predicted.prediction_view(nf4, 2, True, gpu_share.FSDP_OFFLOAD)
    assert text.startswith("No prediction for these settings: parameter offload"), text


def test_add_to_queue_keeps_the_sharing_picked(two_gpus, monkeypatch):
    """Add to queue passes the GPUs' sharing to the queue (which plans and launches with it), and
    refuses a sharing the run cannot use as Start does."""
    from lora_gui.config import ConfigError
    from lora_gui.engine.jobs import queue_runner
    from lora_gui.ui.tabs import queue_handlers

    seen = []

    def add(root, cfg, name, processes, **kw):
        seen.append({"processes": processes, "fsdp": kw["fsdp"], "offload": kw["offload"]})
        raise ConfigError("recorded")  # stop before the queue file: what was asked is the point

    monkeypatch.setattr(queue_runner, "add", add)
    message, _ = queue_handlers.add_from_form("q", 2, values(quantization="nf4"), gpu_share.FSDP_OFFLOAD)
    assert message == "Error: recorded" and seen == [{"processes": 2, "fsdp": True, "offload": True}]
    message, _ = queue_handlers.add_from_form("q", 2, values(quantization="int8"), gpu_share.FSDP)
    assert "FSDP cannot shard an int8 base" in message and len(seen) == 1
