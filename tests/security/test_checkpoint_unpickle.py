"""Resume never unpickles objects from a run folder: a state.pt that would run code is refused
(and runs nothing); the training state a checkpoint holds reads back."""

from __future__ import annotations

import os
import pickle

import torch

from lora_gui.engine.core import checkpoint as ckpt


class _RunsCode:
    """What a crafted state.pt holds: unpickling it calls os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _checkpoint(folder, state) -> None:
    folder.mkdir(parents=True)
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, folder / "adapter.safetensors")
    (folder / "trainer_state.json").write_text('{"step": 2}')
    with open(folder / "state.pt", "wb") as fh:
        if isinstance(state, dict):
            torch.save(state, fh)
        else:
            pickle.dump(state, fh)


def _read(folder):
    """The error read_checkpoint raised (None when it read the folder)."""
    try:
        ckpt.read_checkpoint(folder)
    except Exception as err:  # noqa: BLE001  (which error is asserted below, after the marker)
        return err
    return None


def test_a_crafted_state_file_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    _checkpoint(tmp_path / "ck", {"optimizer": {}, "scheduler": {}, "rng": _RunsCode(marker)})
    err = _read(tmp_path / "ck")
    assert not marker.exists(), "reading the checkpoint ran code"
    assert isinstance(err, ckpt.CheckpointError) and "could run code" in str(err)
    _checkpoint(tmp_path / "raw", _RunsCode(marker))  # a bare pickle, not torch's zip
    err = _read(tmp_path / "raw")
    assert not marker.exists() and isinstance(err, ckpt.CheckpointError)


def test_a_checkpoints_training_state_reads_back(tmp_path):
    layer = torch.nn.Linear(3, 3)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3, betas=(0.9, 0.99))
    layer(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": ckpt.rng_state()}  # what save_checkpoint writes, as earlier versions did
    _checkpoint(tmp_path / "ck", state)
    contents = ckpt.read_checkpoint(tmp_path / "ck")
    again = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    ckpt.restore_training_state(contents, again, torch.optim.lr_scheduler.LambdaLR(again, lambda s: 1.0))
    assert again.state_dict()["param_groups"][0]["betas"] == (0.9, 0.99)
    assert contents["trainer"] == {"step": 2}
