"""FSDP with an adapter initialisation that reads the base weights: 2 gloo processes on a CPU.

Only the main process loads the base and runs the init (LoftQ on a 4-bit base, PiSSA on a
full-precision one); the other builds a weightless skeleton and receives the initialised adapter
and, for PiSSA, the residual base by broadcast. Each process writes its weights as they stand
before step 1 (the ``LORA_GUI_DEBUG_WEIGHTS`` hook), and the test compares them with the init the
main process saved. The launches are `launch` of test_multiprocess_nf4: a session of their own,
killed as a group when the test ends early.
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


@pytest.fixture(scope="module")
def loftq(tmp_path_factory) -> Path:
    return run_init(tmp_path_factory.mktemp("loftq"), lora_init="loftq")


@pytest.fixture(scope="module")
def pissa(tmp_path_factory) -> Path:
    return run_init(tmp_path_factory.mktemp("pissa"), lora_init="pissa", quantization="none")


def check_only_main_loaded(run: Path) -> None:
    summary = json.loads((run / "run.json").read_text())
    loaded, frozen = summary["loaded_bytes_by_rank"], summary["frozen_bytes_by_rank"]
    assert summary["fsdp"] is True and summary["world_size"] == 2
    assert loaded[0] >= sum(frozen)  # the whole base on the main process
    assert 0 < loaded[1] < 0.001 * loaded[0], loaded  # the other: the rotary frequencies only


def ranks(run: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    return load_file(run / "weights-rank0.safetensors"), load_file(run / "weights-rank1.safetensors")


def check_adapter_everywhere(run: Path) -> dict[str, torch.Tensor]:
    """Every rank's LoRA weights before step 1 are the main process's initialised ones."""
    init = load_file(run / "lora_init.safetensors")  # what the init pass made on the main process
    zero, one = ranks(run)
    lora = [k for k in init if ".lora_" in k]
    assert lora and sorted(lora) == sorted(k for k in zero if ".lora_" in k)
    for key in lora:
        assert torch.equal(zero[key], init[key]) and torch.equal(one[key], init[key]), key
    # the init ran: peft's default leaves every B at zero, LoftQ and PiSSA do not
    assert all(init[k].abs().sum() > 0 for k in lora if ".lora_B." in k)
    return init


def test_loftq_on_a_4bit_base_runs_on_the_main_process_only(loftq):
    check_only_main_loaded(loftq)
    check_adapter_everywhere(loftq)


def test_pissa_residual_base_reaches_every_process(pissa):
    check_only_main_loaded(pissa)
    init = check_adapter_everywhere(pissa)
    zero, one = ranks(pissa)
    bases = [k for k in init if k.endswith(".base_layer.weight")]
    assert bases
    for key in bases:  # FSDP2's shards are rows (dim 0): the two together are the residual
        torch.testing.assert_close(torch.cat([zero[key], one[key]]), init[key], rtol=0, atol=0)


def test_the_init_runs_once_and_the_steps_train(loftq, pissa):
    for run in (loftq, pissa):
        summary = json.loads((run / "run.json").read_text())
        assert summary["status"] == "completed"
        assert summary["init_peak_bytes"] > 0  # measured on the main process, which ran it
        assert len(list(run.rglob("lora_init.safetensors"))) == 1

