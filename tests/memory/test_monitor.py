import time

import torch

from lora_gui.memory.runtime.monitor import MemoryMonitor, rss_bytes
from lora_gui.memory.runtime.tracker import StorageTracker


def test_samples_name_their_source_and_follow_the_tracker():
    samples = []
    with StorageTracker() as tracker:
        with MemoryMonitor(samples.append, interval_s=0.05, live_bytes=lambda: tracker.live_bytes):
            keep = torch.zeros(1 << 20)  # 4 MiB
            time.sleep(0.3)
        del keep
    assert len(samples) >= 4  # start, several at 20 Hz, end
    assert all("rss_bytes" in s and "tracker_live_bytes" in s for s in samples)
    assert samples[-1]["tracker_live_bytes"] >= 4 * 2**20
    if not torch.cuda.is_available():
        assert not any(k.startswith(("cuda", "nvml")) for k in samples[0])


def test_no_tracker_figure_while_a_step_runs_without_the_tracker():
    sample = MemoryMonitor(lambda s: None, live_bytes=lambda: None).sample()
    assert "tracker_live_bytes" not in sample and sample["rss_bytes"] > 0


def test_rss_is_plausible():
    assert 10 * 2**20 < rss_bytes() < 64 * 2**30
