"""FSDP with an adapter initialisation that reads the base weights: 2 gloo processes on a CPU.

Only the main process loads the base and runs the init (LoftQ on a 4-bit base; PiSSA, EVA and
CorDA on a full-precision one, EVA and CorDA reading training data); the other builds a
weightless skeleton and receives the initialised adapter and, for PiSSA and CorDA, the residual
base by broadcast. Each process writes its weights as they stand before step 1 (the
``LORA_GUI_DEBUG_WEIGHTS`` hook), and the test compares them with the init the main process
saved. The launches are `launch` of test_multiprocess_nf4, which kills the launcher and its ranks
when a test ends early.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lora_gui.engine.core.fsdp_loading import DEBUG_WEIGHTS_ENV
from tests.engine.test_multiprocess_nf4 import SETTINGS, launch

assert SETTINGS["precision"] == "fp32"  # the residual compared bit for bit: no cast after the init

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # starts accelerate launches
SHORT = {"max_steps": 1, "checkpoint_every": 10}  # the init and one step are what is checked


def run_init(tmp: Path, **settings) -> Path:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(DEBUG_WEIGHTS_ENV, "1")
        res = launch(tmp, tmp / "run", 2, **SHORT, **settings)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "run"


INITS = {"loftq": {"quantization": "nf4"},  # the 4-bit base untouched; A and B fitted to its error
         "pissa": {"quantization": "none"},  # the base keeps a residual
         "eva": {"quantization": "none"},  # reads training batches; A only, the base untouched
         "corda": {"quantization": "none"}}  # reads training samples; the base keeps a residual
BASE_CHANGING = ("pissa", "corda")


@pytest.fixture(scope="module", params=list(INITS))
def launched(request, tmp_path_factory) -> tuple[str, Path]:
    """One 2-process FSDP run of each init: its name and run folder."""
    init = request.param
    return init, run_init(tmp_path_factory.mktemp(init), lora_init=init, **INITS[init])


def check_only_main_loaded(run: Path) -> None:
    summary = json.loads((run / "run.json").read_text())
    loaded, frozen = summary["loaded_bytes_by_rank"], summary["frozen_bytes_by_rank"]
    assert summary["fsdp"] is True and summary["world_size"] == 2
    assert loaded[0] >= sum(frozen)  # the whole base on the main process
    assert 0 < loaded[1] < 0.001 * loaded[0], loaded  # the other: the rotary frequencies only


def ranks(run: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    return load_file(run / "weights-rank0.safetensors"), load_file(run / "weights-rank1.safetensors")


def check_adapter_everywhere(run: Path, init_name: str) -> dict[str, torch.Tensor]:
    """Every rank's LoRA weights before step 1 are the main process's initialised ones."""
    init = load_file(run / "lora_init.safetensors")  # what the init pass made on the main process
    zero, one = ranks(run)
    lora = [k for k in init if ".lora_" in k]
    assert lora and sorted(lora) == sorted(k for k in zero if ".lora_" in k)
    for key in lora:
        assert torch.equal(zero[key], init[key]) and torch.equal(one[key], init[key]), key
    if init_name != "eva":  # the init ran: peft's default (and EVA) leave every B at zero
        assert all(init[k].abs().sum() > 0 for k in lora if ".lora_B." in k)
    return init


def test_the_init_runs_on_the_main_process_only(launched):
    init_name, run = launched
    check_only_main_loaded(run)
    init = check_adapter_everywhere(run, init_name)
    summary = json.loads((run / "run.json").read_text())
    assert summary["status"] == "completed"
    # measured on the main process, which ran it over the whole base, as planned (the plan's
    # figure before sharding: LoftQ's resident 4-bit weights are the whole base, not a shard)
    planned, measured = summary["prediction"]["init_peak_bytes"], summary["init_peak_bytes"]
    assert -0.01 <= (planned - measured) / measured <= 0.03, (planned, measured)
    assert len(list(run.rglob("lora_init.safetensors"))) == 1
    bases = [k for k in init if k.endswith(".base_layer.weight")]
    assert bool(bases) == (init_name in BASE_CHANGING)
    zero, one = ranks(run)
    for key in bases:  # FSDP2's shards are rows (dim 0): the two together are the residual
        torch.testing.assert_close(torch.cat([zero[key], one[key]]), init[key], rtol=0, atol=0)
