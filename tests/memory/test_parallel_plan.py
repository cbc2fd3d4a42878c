"""Per-GPU planning of data-parallel runs: DDP replicates, FSDP shards the frozen weights."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lora_gui.memory.predict import planner
from lora_gui.memory.predict.estimate import estimate_text_step
from lora_gui.memory.predict.model_configs import load_model_config
from lora_gui.memory.predict.parallel import Parallel, frozen_layout, per_gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llama():
    return load_model_config("llama-3.1-8b")


@pytest.mark.parametrize("n", [2, 4, 8])
def test_fsdp_per_gpu_frozen_is_total_over_n(llama, n):
    one = estimate_text_step(llama, batch_size=1, seq_len=1024, lora_rank=16)
    shard = per_gpu(one, llama, Parallel(n, fsdp=True))
    total = one.breakdown["frozen_weights"]
    assert shard.breakdown["frozen_weights"] == math.ceil(total / n)
    units = frozen_layout(llama, total)
    assert units.tail == (128256 * 4096 + 4096) * 2  # bf16 output head + final norm
    assert units.layer == (218_103_808 + 2 * 4096) * 2  # one Llama-3.1-8B decoder layer, exactly
    assert units.quant_state == 0 and units.params == total
    # unsharded beside the shards at the peak: the head and two layers (running, prefetched)
    assert shard.breakdown["fsdp_gathered"] == units.tail + 2 * units.layer
    gathered = shard.breakdown["fsdp_gathered"]
    nccl = shard.cuda_overheads["nccl_buffers"]  # NCCL's own buffers, beside the allocator
    assert nccl == 128 * 2**20 and "nccl_buffers" not in one.cuda_overheads
    assert shard.peak_bytes == one.peak_bytes - total + math.ceil(total / n) + gathered + nccl
    for key in ("activations", "lora_params", "optimizer_state", "temporaries"):  # not sharded
        assert shard.breakdown[key] == one.breakdown[key]


def test_ddp_replicates_and_notes_the_gradient_buckets(llama):
    one = estimate_text_step(llama, batch_size=1, seq_len=1024, lora_rank=16)
    ddp = per_gpu(one, llama, Parallel(4))
    # every GPU holds a replica, plus NCCL's own buffers on CUDA
    assert ddp.peak_bytes == one.peak_bytes + 128 * 2**20 and ddp.breakdown == one.breakdown
    assert ddp.info["allreduce_bucket_bytes"] == 25 * 2**20  # LoRA r16 grads (160 MiB) > one bucket
    assert per_gpu(one, llama, Parallel(1, fsdp=True)) is one


def test_bad_world_size():
    with pytest.raises(ValueError, match="world_size must be a whole number >= 1, got 0"):
        Parallel(0)


def test_what_fits_where_gains_gpu_columns(llama):
    rows = planner.what_fits_where(llama, chosen=2048, cards_gb=(16, 24, 80), lora_rank=16)
    for row in rows:
        assert list(row.by_gpus) == [2, 4, 8]
        longest = [row.longest or 0] + [fit[0] or 0 for fit in row.by_gpus.values()]
        assert longest == sorted(longest)  # more GPUs to shard over: never shorter
    assert rows[0].longest is None and rows[0].by_gpus[8][0]  # 16 GB: only with 8-way FSDP


def test_fsdp_plan_fits_where_one_gpu_does_not(llama):
    one = planner.plan_text(llama, 20e9, [512], confirm=False, lora_rank=16)
    eight = planner.plan_text(llama, 20e9, [512], confirm=False, lora_rank=16, parallel=Parallel(8, True))
    assert not one.fits and eight.fits
    assert eight.buckets[0].peak_bytes <= 20e9 and eight.budget_bytes == int(20e9)


def test_plan_cli_world_size_json():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "lora_gui", "plan", "--preset", "text-demo", "--device", "cpu", "--json",
            "--set", "max_seq_len=256"]
    out = [json.loads(subprocess.run(base + extra, env=env, cwd=ROOT, capture_output=True, text=True,
                                     timeout=300, check=True).stdout)
           for extra in ([], ["--world-size", "2", "--fsdp"])]
    assert out[1]["world_size"] == 2 and out[1]["fsdp"] is True
    assert out[1]["breakdown"]["frozen_weights"] == math.ceil(out[0]["breakdown"]["frozen_weights"] / 2)
    assert out[1]["breakdown"]["fsdp_gathered"] > 0


def test_fsdp_over_nf4_keeps_the_quant_state_whole_and_offloads_to_host():
    """nf4 under FSDP: the packed weights are sharded, the 4-bit scales stay whole on every GPU;
    with offload the shards move to host memory (all of them on one machine)."""
    from lora_gui.memory.predict.quant import NF4_BLOCK

    llama = load_model_config("llama-2-7b")
    one = estimate_text_step(llama, batch_size=1, seq_len=512, lora_rank=8, quantization="nf4",
                             double_quant=False, device="cuda")
    units = frozen_layout(llama, one.breakdown["frozen_weights"], "nf4")
    linear = 4 * 4096 * 4096 + 3 * 4096 * 11008  # one layer's Linear weights
    assert units.layer == linear // 2 + 2 * 4096 * 2  # packed two a byte + bf16 norms
    assert units.tail == (32000 * 4096 + 4096) * 2 and units.embed == 32000 * 4096 * 2
    assert units.quant_state == pytest.approx(32 * linear / NF4_BLOCK * 4, rel=0.01)  # float32 absmax
    two = per_gpu(one, llama, Parallel(2, fsdp=True))
    assert two.breakdown["frozen_weights"] == units.quant_state + math.ceil(units.params / 2)
    off = per_gpu(one, llama, Parallel(2, fsdp=True, offload=True))
    assert off.breakdown["frozen_weights"] == units.quant_state
    assert off.info["fsdp_offload_host_bytes"] == 2 * math.ceil(units.params / 2)
    assert off.peak_bytes < two.peak_bytes
    with pytest.raises(ValueError, match="int8 cannot be sharded by FSDP"):
        per_gpu(estimate_text_step(llama, batch_size=1, seq_len=64, quantization="int8"), llama,
                Parallel(2, fsdp=True))
    with pytest.raises(ValueError, match="plan it for a GPU"):
        per_gpu(estimate_text_step(llama, batch_size=1, seq_len=64, device="cpu"), llama,
                Parallel(2, fsdp=True, offload=True))
    with pytest.raises(ValueError, match="parameter offload is FSDP's"):
        Parallel(2, offload=True)


def test_plan_cli_fsdp_offload_over_nf4():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "lora_gui", "plan", "--world-size", "2", "--fsdp", "--offload",
            "--set", "quantization=nf4", "--set", "max_seq_len=64", "--set", "batch_size=4"]
    shown = subprocess.run(base + ["--device", "cuda"], env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=300, check=True).stdout
    assert "FSDP (frozen weights sharded, offloaded to host memory)" in shown
    assert "host memory for the offloaded shards:" in shown and "fsdp_offload_staging" in shown
    refused = subprocess.run(base + ["--device", "cpu"], env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode != 0 and "on a CPU the weights are in host memory already" in refused.stderr


def test_fsdp_loading_is_planned_on_the_main_process_only():
    """Only the main process loads the base: it holds all of it plus its shard while it sends the
    shards; every other process its shard, the 4-bit scales and the largest tensor in flight (here
    the 32,000 x 4,096 bf16 embedding). On a CPU the machine's host memory is their sum."""
    llama = load_model_config("llama-2-7b")
    for device in ("cuda", "cpu"):
        one = estimate_text_step(llama, batch_size=1, seq_len=512, lora_rank=8, quantization="nf4",
                                 double_quant=False, device=device)
        units = frozen_layout(llama, one.breakdown["frozen_weights"], "nf4")
        assert units.largest == 32000 * 4096 * 2
        three = per_gpu(one, llama, Parallel(3, fsdp=True))
        shard = math.ceil(units.params / 3)
        main, other = three.info["fsdp_load_main_bytes"], three.info["fsdp_load_other_bytes"]
        assert main == units.params + units.quant_state + shard
        assert other == shard + units.quant_state + units.largest and other < main / 2
        if device == "cpu":
            assert three.info["fsdp_load_host_bytes"] == main + 2 * other
        else:
            assert "fsdp_load_host_bytes" not in three.info
