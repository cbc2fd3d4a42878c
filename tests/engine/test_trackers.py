"""report_to: text and image runs leave TensorBoard event files (and a trackio store) whose
scalars equal metrics.jsonl's step for step; a resumed run continues the same tracker run; a
missing package or login is refused before anything is written. Offline, tiny runs."""

import importlib.util
import sys

import pytest

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.data.build_images import build
from lora_gui.engine.core.records import read_records
from lora_gui.engine.core.trackers import TrackerError, check_trackers, open_commands, read_tracker_info
from lora_gui.engine.image.train import train_image
from lora_gui.engine.text.train import TrainControl, train_text

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def text_cfg(data, **kw) -> RunConfig:
    base = {"data": str(data), "max_seq_len": 64, "batch_size": 4, "max_steps": 3, "lr": 5e-3,
            "checkpoint_every": 2, "eval_fraction": 0.1, "warmup_steps": 1, "monitor_hz": 0,
            "precision": "fp32", "report_to": "tensorboard"}
    return apply_overrides(RunConfig(), {**base, **kw})


def scalars(folder, tag: str) -> dict[int, float]:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)}


def assert_same_as_metrics(out, keys=("loss", "lr", "peak_bytes")) -> None:
    records = read_records(out / "metrics.jsonl")
    folder = read_tracker_info(out)["tensorboard"]["dir"]
    for key in keys:
        logged = scalars(folder, key)
        # a CPU step the meter did not measure has no peak (None), and none is logged for it
        kept = [r for r in records if r[key] is not None]
        assert sorted(logged) == [r["step"] for r in kept], key
        # TensorBoard keeps scalars as float32
        assert [logged[r["step"]] for r in kept] == pytest.approx([r[key] for r in kept], rel=1e-6)


def test_text_run_logs_every_record_config_and_eval_loss(tmp_path, small_corpus):
    out = tmp_path / "run"
    summary = train_text(text_cfg(small_corpus), out, progress=False)
    assert_same_as_metrics(out, ("loss", "lr", "peak_bytes", "tokens_per_s", "real_tokens"))
    folder = out / "tensorboard"
    assert read_tracker_info(out)["tensorboard"]["dir"] == str(folder)
    assert scalars(folder, "eval_loss") == {3: pytest.approx(summary["eval_loss"], rel=1e-6)}
    assert scalars(folder, "base_eval_loss")[0] == pytest.approx(summary["base_eval_loss"], rel=1e-6)
    hparams = list(folder.glob("*/hparams.yml"))
    assert hparams and "report_to: tensorboard" in hparams[0].read_text()
    assert "memory_source: tracker" in hparams[0].read_text()
    opens = open_commands(read_tracker_info(out))
    assert opens == [f"tensorboard: {folder} -> tensorboard --logdir {folder}"]


def test_resumed_run_continues_the_same_event_files(tmp_path, small_corpus):
    """A crash after step 3 (checkpoint at 2): the resumed run rewrites step 3, and TensorBoard
    drops the crashed run's step 3, as metrics.jsonl does."""
    cfg = text_cfg(small_corpus, max_steps=4)
    control = TrainControl()

    def crash(record):
        if record["step"] == 3:
            raise RuntimeError("crash")

    control.on_record = crash
    with pytest.raises(RuntimeError, match="crash"):
        train_text(cfg, tmp_path / "run", control=control, progress=False)
    train_text(cfg, tmp_path / "run", resume=True, progress=False)
    assert [r["step"] for r in read_records(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3, 4]
    assert_same_as_metrics(tmp_path / "run")


@pytest.mark.slow
def test_a_replaced_run_in_tracker_dir_leaves_only_its_own_scalars(tmp_path, small_corpus):
    shared = tmp_path / "tb"
    train_text(text_cfg(small_corpus, tracker_dir=str(shared), max_steps=3), tmp_path / "r", progress=False)
    train_text(text_cfg(small_corpus, tracker_dir=str(shared), max_steps=2, lr=1e-3), tmp_path / "r",
               overwrite=True, progress=False)
    assert read_tracker_info(tmp_path / "r")["tensorboard"]["dir"] == str(shared / "r")
    assert_same_as_metrics(tmp_path / "r")  # steps 1-2 of the new run, not step 3 of the old


def test_missing_tracker_is_one_line_before_the_run(tmp_path, small_corpus, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for name in ("mlflow", "wandb"):
        cfg = text_cfg(small_corpus, report_to=f"tensorboard,{name}")
        with pytest.raises(TrackerError, match=f"report_to: {name}") as err:
            train_text(cfg, tmp_path / name, progress=False)
        assert "\n" not in str(err.value) and not (tmp_path / name).exists()
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # find_spec: not installed
    with pytest.raises(TrackerError, match="pip install tensorboard"):
        check_trackers(text_cfg(small_corpus))
    with pytest.raises(ConfigError, match="report_to: 'tensorbord' is not a tracker"):
        text_cfg(small_corpus, report_to="tensorbord")


@pytest.mark.slow
def test_image_run_logs_loss_and_samples(tmp_path):
    pictures = tmp_path / "pictures"
    build(pictures, count=5)
    cfg = apply_overrides(RunConfig(), {"task": "image", "model": "builtin", "data": str(pictures),
                                        "resolution": 64, "max_steps": 2, "batch_size": 2,
                                        "monitor_hz": 0, "eval_fraction": 0.2, "sample_images": 1,
                                        "sample_steps": 1, "report_to": "tensorboard"})
    out = tmp_path / "img"
    summary = train_image(cfg, out, progress=False)
    assert_same_as_metrics(out, ("loss", "images_per_s", "peak_bytes"))
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"images": 0})
    acc.Reload()
    assert len(summary["samples"]) == 1 and acc.Images("samples/0")[0].step == 2
    assert scalars(out / "tensorboard", "eval_loss")[2] == pytest.approx(summary["eval_loss"], rel=1e-6)


def test_trackio_local_store_holds_the_loss_curve(tmp_path, small_corpus, monkeypatch):
    if importlib.util.find_spec("trackio") is None:
        pytest.skip("trackio is not installed")
    fresh = "trackio" not in sys.modules  # trackio fixes its folder at import, once a process
    monkeypatch.setenv("TRACKIO_DIR", "")  # unset for the run; restored after the test
    out = tmp_path / "trackio-run"
    train_text(text_cfg(small_corpus, report_to="tensorboard,trackio"), out, progress=False)
    info = read_tracker_info(out)["trackio"]
    from trackio.sqlite_storage import SQLiteStorage

    logs = [row for row in SQLiteStorage.get_logs(info["project"], info["name"]) if "loss" in row]
    records = read_records(out / "metrics.jsonl")
    assert [row["step"] for row in logs] == [r["step"] for r in records]
    assert [row["loss"] for row in logs] == [r["loss"] for r in records]
    if fresh:  # the default store: beside the run folder
        assert info["dir"] == str(tmp_path / "trackio") and (tmp_path / "trackio").is_dir()


def test_mlflow_local_store_holds_the_loss_curve(tmp_path, small_corpus, monkeypatch):
    """report_to=mlflow against a local store (no server): its loss history is metrics.jsonl's."""
    if importlib.util.find_spec("mlflow") is None:
        pytest.skip("mlflow is not installed (an optional extra)")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    out = tmp_path / "mlflow-run"
    summary = train_text(text_cfg(small_corpus, report_to="mlflow"), out, progress=False)
    info = read_tracker_info(out)["mlflow"]
    client = MlflowClient(uri)
    records = read_records(out / "metrics.jsonl")
    for key in ("loss", "lr", "peak_bytes"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(info["run_id"], key))
        assert history == [(r["step"], pytest.approx(r[key], rel=1e-9)) for r in records
                           if r[key] is not None], key  # an unmeasured CPU step has no peak
    assert client.get_run(info["run_id"]).data.metrics["eval_loss"] == pytest.approx(summary["eval_loss"])
    assert client.get_run(info["run_id"]).data.params["report_to"] == "mlflow"
    assert open_commands(read_tracker_info(out))[0].endswith(f"mlflow ui --backend-store-uri {uri}")


def wandb_history(run_dir) -> list[dict]:
    """The history rows of an offline W&B run, read from its .wandb file."""
    import json

    from wandb.proto import wandb_internal_pb2

    try:
        from wandb.sdk.internal import datastore
    except ImportError:  # wandb 0.31 moved the .wandb reader into its Go core
        pytest.skip("this wandb version has no Python reader of offline .wandb files")

    store = datastore.DataStore()
    store.open_for_scan(str(next(run_dir.glob("*.wandb"))))
    rows = []
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def test_wandb_offline_run_holds_the_loss_curve(tmp_path, small_corpus, monkeypatch):
    """report_to=wandb with WANDB_MODE=offline: the offline run's history is metrics.jsonl's."""
    if importlib.util.find_spec("wandb") is None:
        pytest.skip("wandb is not installed (an optional extra)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "wandb-run"
    train_text(text_cfg(small_corpus, report_to="wandb"), out, progress=False)
    info = read_tracker_info(out)["wandb"]
    assert info["offline"] and str(out) in info["dir"]  # under the run folder
    from pathlib import Path

    rows = [r for r in wandb_history(Path(info["dir"]).parent) if "loss" in r]
    records = read_records(out / "metrics.jsonl")
    assert [r["_step"] for r in rows] == [r["step"] for r in records]
    assert [r["loss"] for r in rows] == [r["loss"] for r in records]
    assert open_commands(read_tracker_info(out))[0].startswith("wandb: ")
