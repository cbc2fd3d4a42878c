"""The Plan tab's text: one verdict consistent with the bucket and card tables beside it, each
suggestion saying whether it fits, one memory unit (GB) on the page."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from lora_gui.config import ConfigError
from lora_gui.memory.predict.longest_text import Longest, describe
from lora_gui.memory.predict.parallel import Parallel
from lora_gui.memory.predict.planner import CardFit
from lora_gui.ui import gpu_share
from lora_gui.ui.tabs import plan_handlers

MIB, GB = 2**20, 10**9


def bucket(n: int, batch: int, mib: int) -> SimpleNamespace:
    return SimpleNamespace(bucket=n, micro_batch=batch, grad_accum=8 // batch if batch else 0,
                           peak_bytes=mib * MIB)


def short_plan() -> SimpleNamespace:
    """As the planner answers Llama-3.1-8B nf4 on an 8 GB card: 64 tokens fit, longer do not."""
    return SimpleNamespace(
        fits=False, message="does not fit even at batch 1: needs 19.41 GB; see the suggestions",
        buckets=[bucket(64, 1, 7_001), bucket(128, 0, 8_298), bucket(1024, 0, 18_508)], suggestions=[
            SimpleNamespace(switch="gradient_checkpointing=True", peak_bytes=8_550 * MIB, fits=False),
            SimpleNamespace(switch="quantization=nf4", peak_bytes=3_000 * MIB, fits=True)])


def outputs(plan, rows=()):
    step = SimpleNamespace(peak_bytes=17_458 * MIB, breakdown={"weights": 9_000 * MIB}, cuda_overheads={})
    budget = int(8.3582 * GB)
    return plan_handlers._outputs(plan, step, list(rows), budget, "cuda", "the run's largest micro-batch")


def units(text: str) -> set[str]:
    return set(re.findall(r"\d\s*(MiB|GiB|GB|MB)\b", text))


def test_each_suggestion_says_whether_it_fits():
    _, text, _, _ = outputs(short_plan())
    assert "gradient_checkpointing=True: 8.97 GB at batch 1 in the 1,024 tokens bucket — does not fit" in text
    assert "quantization=nf4: 3.15 GB at batch 1 in the 1,024 tokens bucket — fits the budget" in text


def test_the_verdict_agrees_with_the_bucket_table_in_one_unit():
    _, text, buckets, _ = outputs(short_plan())
    assert text.startswith("**Does not fit** — the 1,024 tokens bucket needs 19.41 GB even at batch 1")
    assert "only buckets up to 64 tokens fit" in text  # as the table's first row says
    assert buckets[0] == [64, 1, 8, 7.34] and buckets[-1] == [1024, 0, 0, 19.41]  # GB, as the verdict
    assert "18.31 GB** against the 8.36 GB budget" in text
    assert units(text) == {"GB"}


def test_what_fits_where_rows_are_the_cards_and_never_say_nothing_fits_beside_a_fitting_bucket():
    """The rows are the cards as the picker plans them (an 8 GB card holds 8.36 GB), the card
    being planned marked on its own row (no second "8" row beside it), a budget that is no card
    a row of its own; a card that holds no length says so in the CLI's words too."""
    from lora_gui.cards import CARDS
    from lora_gui.memory.predict.report import fits_lines

    eight = CARDS["8gb"].total_bytes
    sizes = plan_handlers.cards_with(eight)
    assert len(sizes) == 7 and sizes[0] == eight / GB and sizes[-1] == CARDS["a100-80gb"].total_bytes / GB
    assert 10.0 in plan_handlers.cards_with(10 * GB) and len(plan_handlers.cards_with(10 * GB)) == 8
    rows = [CardFit(eight / GB, None, 0, {2: (None, 0)}), CardFit(sizes[1], 256, 0, {2: (512, 0)})]
    step = SimpleNamespace(peak_bytes=17_458 * MIB, breakdown={"weights": 9_000 * MIB}, cuda_overheads={})
    _, _, _, table = plan_handlers._outputs(short_plan(), step, rows, eight, "cuda", "the run's largest")
    assert [r[:2] for r in table] == [["8 GB card (8.36 GB) (this budget)", "under 256 tokens"],
                                      ["12 GB card (12.45 GB)", 256]]
    assert table[0][3] == "under 256 tokens"  # the 2-GPU column in the same words
    cli = "\n".join(fits_lines(rows, 1024, eight / GB))
    assert "- / 0" not in cli and "under 256 tokens" in cli and "8 GB card (8.36 GB) (this budget)" in cli


def test_longest_speaks_the_pages_unit():
    result = Longest(seq_len=12_288, micro_batch=1, budget_bytes=int(8.3582 * GB), counted_bytes=8 * GB,
                     peak_bytes=int(8.2 * GB), device="cuda", switches={"gradient_checkpointing": True},
                     speed_cost={"gradient_checkpointing": 1.3}, host_bytes=2 * GB, notes=[],
                     confirmed_by_trace=True, count_cuda_context=True, cuda_context_bytes=500 * MIB,
                     capped_by_context=False, context_len=None, memory_allows=12_288, traces=1,
                     card={"allocated_bytes": 7 * GB, "reserved_bytes": int(7.5 * GB),
                           "attention_kernel": "flash", "attention_workspace_bytes": 40 * MIB})
    assert units("\n".join(describe(result))) == {"GB"}  # the Plan tab and the CLI alike
    assert "fits 8.36 GB on cuda" in describe(result)[0]


def test_the_image_demo_plans_on_the_plan_tab():
    """The Plan tab plans the image demo under its budget (its DiT is calibrated at the sizes its
    position embedding covers; it answered an error before) and shows a verdict, not an error."""
    from lora_gui.ui.tabs.plan_handlers import plan

    _, text, buckets, _ = plan("image-demo", "builtin:drawing", 0, 64, 24, "cuda", False)
    assert not text.startswith("Error"), text
    assert "fits" in text and buckets, text


def test_the_plan_tab_shows_the_presets_settings_and_only_its_tasks_size():
    """A preset fills the tab's fields (its LoRA rank and batch size too), and a text preset shows
    a length, an image preset a resolution: one task at a time."""
    text = plan_handlers.preset_settings("text-demo")
    image = plan_handlers.preset_settings("image-512")
    assert text[0]["visible"] is True and text[1]["visible"] is False
    assert image[0]["visible"] is False and image[1]["visible"] is True and image[1]["value"] == 512
    from lora_gui.presets import load_config

    demo = load_config("text-demo")
    assert text[5:7] == (demo.lora_rank, demo.batch_size)


def test_a_stale_answer_is_marked_and_an_empty_one_stays_empty():
    marked = plan_handlers.mark_stale("**Fits** — ...", "")
    assert marked[0].startswith(plan_handlers.STALE) and marked[1] == ""
    assert plan_handlers.mark_stale(*marked) == marked  # marked once


def _cli(capsys, *args: str) -> str:
    from lora_gui.cli import main

    capsys.readouterr()
    assert main(["plan", "--preset", "text-demo", "--set", "quantization=nf4", "--device", "cuda",
                 "--budget-gb", "24", *args]) == 0
    return capsys.readouterr().out


def _spied_plan(monkeypatch, gpus: int, sharing: str):
    """The Plan tab's answer for text-demo on an nf4 base, and the prediction it showed."""
    import lora_gui.memory.predict as predict_module

    real, seen = predict_module.predict, []

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(predict_module, "predict", spy)
    _, text, _, _ = plan_handlers.plan("text-demo", "builtin", 0, 0, 24, "cuda", False, "nf4",
                                       gpus=gpus, sharing=sharing)
    assert len(seen) == 1 and not text.startswith("Error"), text
    return text, seen[0]


@pytest.mark.slow
def test_the_plan_tabs_figure_for_2_gpus_with_fsdp_is_the_clis(monkeypatch, capsys):
    """2 GPUs, FSDP over an nf4 base: the figure the tab shows is `plan --world-size 2 --fsdp
    --json`'s peak_bytes, per GPU, with the frozen weights split (the whole peak of this small
    model is not lower: NCCL's buffers on each GPU outweigh half its weights)."""
    import json

    from lora_gui.units import gb

    cli = json.loads(_cli(capsys, "--world-size", "2", "--fsdp", "--json"))
    text, pred = _spied_plan(monkeypatch, 2, gpu_share.FSDP)
    assert pred.peak_bytes == cli["peak_bytes"]
    assert gb(cli["peak_bytes"]) in text and "Per GPU: 2 GPUs, FSDP" in text
    _, one = _spied_plan(monkeypatch, 1, gpu_share.FSDP)
    assert one.step.breakdown["frozen_weights"] > pred.step.breakdown["frozen_weights"]


@pytest.mark.slow
def test_the_plan_tab_names_the_offloaded_shards_host_memory_as_the_cli(monkeypatch, capsys):
    from lora_gui.units import gb

    cli = _cli(capsys, "--world-size", "2", "--fsdp", "--offload")
    text, pred = _spied_plan(monkeypatch, 2, gpu_share.FSDP_OFFLOAD)
    host = pred.step.info["fsdp_offload_host_bytes"]
    assert host > 0 and f"host memory for the offloaded shards: {gb(host)} per machine" in cli
    assert f"Host memory for the offloaded shards: **{gb(host)}** per machine" in text
    assert f"({gb(pred.peak_bytes)}" in cli or gb(pred.peak_bytes) in cli  # the same per-GPU peak


def test_the_gpu_fields_are_read_as_the_cli_reads_its_flags():
    assert gpu_share.parallel_from_form(2, gpu_share.FSDP_OFFLOAD) == Parallel(2, True, True)
    assert gpu_share.parallel_from_form(4, gpu_share.REPLICATED) == Parallel(4, False, False)
    assert gpu_share.parallel_from_form(1, gpu_share.FSDP) == Parallel(1, False, False)  # nothing to shard
    assert gpu_share.parallel_from_form(None, None) == Parallel(1, False, False)
    for bad in (0, 1.5, "two"):
        with pytest.raises(ConfigError, match=f"GPUs: {bad!r}"):
            gpu_share.parallel_from_form(bad, gpu_share.FSDP)
    with pytest.raises(ConfigError, match="'ZeRO'"):
        gpu_share.parallel_from_form(2, "ZeRO")
    _, text, _, _ = plan_handlers.plan("text-demo", "builtin", 0, 0, 24, "cuda", False, gpus=0)
    assert text == "Error: GPUs: 0 is not a whole number of GPUs (1 or more)"
