"""The image peer bench's own measuring code (bench/peer_diffusers): the torchvision op schemas
that let the CUDA wheel's Python transforms import next to torch's CPU build, the tracker that
counts real tensors only and the machine-peak probe apart, and the verdicts of its table."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from bench.peer_diffusers import bench, launch
from lora_gui.models import flops

MB = 2**20


def test_torchvision_fake_registration_runs_once_its_schemas_are_declared():
    # torchvision 0.28's _meta_registrations calls exactly this at import; without the schema it
    # raises "operator torchvision::nms does not exist" when its C++ extension did not load
    launch.allow_torchvision_without_ops()
    launch.allow_torchvision_without_ops()  # idempotent: a second call (or a loaded extension) is fine
    for op in ("nms", "qnms"):
        schema = str(getattr(torch.ops.torchvision, op).default._schema)
        assert schema.startswith(f"torchvision::{op}(Tensor dets, Tensor scores, float iou_threshold)")


def test_real_tracker_counts_real_tensors_not_fake_ones():
    tracker = launch.RealTracker()
    with tracker:
        real = torch.ones(MB // 4)  # 1 MiB of float32
        with FakeTensorMode():
            fake = torch.ones(16 * MB)  # 64 MiB that never exist
    assert tracker.peak_bytes == MB
    del real, fake


def test_machine_peak_probe_is_counted_apart(monkeypatch):
    def probe(device, dtype, budget_s=1.0):  # stands in for the GEMM measurement: 4 MiB operands
        operands = torch.zeros(MB, device=device, dtype=dtype)
        return float(operands.numel())

    monkeypatch.setattr(flops, "measure_gemm_peak", probe)
    tracker = launch.RealTracker()
    launch._probe_apart(tracker)
    with tracker:
        kept = torch.ones(MB // 4)  # 1 MiB live while the probe runs
        flops.measure_gemm_peak("cpu", torch.float32)
    assert tracker.peak_bytes == MB  # the run without the probe
    assert tracker.probe_peak_bytes == 5 * MB  # 1 MiB live + the probe's 4 MiB
    del kept


def _row(pipeline, config, peak, speed, losses, bare=None):
    return {"pipeline": pipeline, "config": config, "peak_bytes": peak, "optimizer_steps": len(losses),
            "peak_bytes_without_probe": bare or peak, "images_per_s": speed, "steady_images_per_s": speed,
            "losses": losses, "total_s": 1.0}


def test_table_says_which_targets_are_met_and_which_are_missed():
    noisy = [1.0, 0.8, 1.2, 0.9, 1.1, 1.0]
    rows = [_row("sdxl", "script", 100 * MB, 10.0, noisy),
            _row("sdxl", "script-switches", 80 * MB, 5.0, noisy),
            _row("sdxl", "lora_gui", 50 * MB, 14.0, [x + 0.01 for x in noisy]),
            _row("sdxl", "lora_gui-switches", 40 * MB, 6.0, noisy),
            _row("flux", "script", 10 * MB, 10.0, noisy), _row("flux", "script-switches", 9 * MB, 8.0, noisy),
            _row("flux", "lora_gui", 8 * MB, 9.0, [x + 5 for x in noisy], bare=5 * MB),
            _row("flux", "lora_gui-switches", 7 * MB, 8.0, noisy)]
    verdicts = {line.split(" | ")[0].strip("| "): line for line in bench.table(rows) if "x " in line}
    assert "0.62x met; 0.62x | 1.40x met; 1.40x" in verdicts["sdxl"]
    assert "within noise" in verdicts["sdxl"]
    assert "0.89x MISSED; 0.56x | 0.90x MISSED" in verdicts["flux"]
    assert "OUTSIDE noise" in verdicts["flux"]


def test_peaks_come_from_the_tracked_round_and_speeds_from_the_untracked_ones():
    """--untracked-peer: round 0 runs both sides under the bench's tracker (peaks, slowed); the
    later rounds run each side as its users do (no peak: 0) and alone give the speeds."""
    noisy = [1.0, 0.8, 1.2, 0.9, 1.1, 1.0]
    rows = []
    for rnd, tracked in ((0, True), (1, False)):
        for config, peak, speed in (("script", 100 * MB, 10.0), ("script-switches", 80 * MB, 5.0),
                                    ("lora_gui", 50 * MB, 14.0), ("lora_gui-switches", 40 * MB, 6.0)):
            row = _row("sdxl", config, peak if tracked else 0, speed * (1 if tracked else 3), noisy)
            rows.append({**row, "round": rnd, "tracked": tracked})
    verdicts = [line for line in bench.table(rows) if line.startswith("| sdxl | 0")]
    assert "0.62x met; 0.62x | 1.40x met; 1.40x" in verdicts[0]
    script = next(line for line in bench.table(rows) if line.startswith("| sdxl | script |"))
    assert "| 100.0 | 100.0 | 30.00 | [30.0] |" in script  # peak of round 0, speed of round 1


def test_the_cpu_seconds_column_gives_its_own_verdict():
    """Speeds in process CPU seconds (what a loaded machine's other processes do not change):
    lora_gui's default over the script's fastest, in a column of its own."""
    noisy = [1.0, 0.8, 1.2, 0.9, 1.1, 1.0]
    rows = [{**_row("sdxl", config, 10 * MB, speed, noisy), "cpu_images_per_s": cpu}
            for config, speed, cpu in (("script", 10.0, 20.0), ("script-switches", 5.0, 10.0),
                                       ("lora_gui", 14.0, 30.0), ("lora_gui-switches", 6.0, None))]
    table = bench.table(rows)
    verdict = next(line for line in table if line.startswith("| sdxl | 1.00x"))
    assert verdict.endswith("| 1.50x met |")
    assert next(line for line in table if line.startswith("| sdxl | lora_gui-switches |")).endswith("| - |")


def test_peak_contents_lists_the_storages_alive_at_the_peak_with_their_module():
    from torch import nn

    from bench.peer_diffusers.peak_contents import RecordingTracker, _module_names, folded, table

    layer = nn.Sequential(nn.Linear(4, 256)).requires_grad_(False)  # nothing kept for a backward
    tracker = RecordingTracker()
    hooks = _module_names(tracker)
    try:
        with tracker:
            tracker.track(list(layer.parameters()))  # 4 KiB weight + 1 KiB bias, made before
            x = torch.ones(2, 4)  # 32 bytes
            y = layer(x)  # 2 KiB, made inside the Linear
            del x
            z = torch.ones(8)  # 32 bytes: 7,200 live, as at the peak so far
            peak = tracker.peak_bytes
            w = y * 2  # 2 KiB more: the peak
            del y, w
    finally:
        for hook in hooks:
            hook.remove()
    live = tracker.live_at_peak()
    assert (peak, tracker.peak_bytes) == (7200, 9248)
    assert sorted(b.nbytes for b in live) == [32, 1024, 2048, 2048, 4096]
    assert {b.module for b in live if b.op == "addmm"} == {"0"}  # the Linear, named in its model
    assert {b.op for b in live} >= {"addmm", "mul"}
    assert all(b.died is not None for b in live if b.nbytes == 2048)  # both freed afterwards
    assert folded("down_blocks.1.attentions.0.transformer_blocks.12.attn2.to_k") == \
        "down_blocks.N.attentions.N.transformer_blocks.N.attn2.to_k"
    assert "| `0` | `addmm` | 1 | 2,048 |" in "\n".join(table(live, top=5))
    del z


def test_plan_contents_groups_every_byte_of_the_traced_peak_by_module():
    from bench.memory.plan_contents import KEPT_APART, contents
    from lora_gui.models.build_diffusion import build_sdxl_pipeline

    config = {**build_sdxl_pipeline(seed=0).unet.config, "_class_name": "UNet2DConditionModel"}
    result, groups = contents(config, resolution=64, batch=2, targets=None)
    kept_apart = sum(result.breakdown[c] for c in KEPT_APART)
    assert sum(sum(sizes) for sizes in groups.values()) + kept_apart == result.traced_peak_bytes
    modules = {module for module, _ in groups}
    assert any(m.endswith("attn2.to_k") for m in modules)  # named inside the model, blocks folded
    assert not any(part.isdigit() for m in modules for part in m.split("."))  # block indices folded
