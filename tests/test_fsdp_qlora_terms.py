"""The term table beside PEFT's 70B figures: made from the committed plans by the code, each sum
and gap the arithmetic of its rows."""

from __future__ import annotations

import json

import pytest

from bench.memory import fsdp_qlora_70b, fsdp_qlora_terms


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads(fsdp_qlora_70b.OUT.read_text())


def test_the_committed_table_is_what_the_results_make(results):
    assert json.loads(fsdp_qlora_70b.TERMS.read_text()) == json.loads(json.dumps(
        fsdp_qlora_terms.table(results)))


def test_the_shapes_are_llama_2_70b():
    s = fsdp_qlora_terms.shapes()
    # q and o 8,192 x 8,192, k and v 8,192 x 1,024 (8 key-value heads of 128), gate, up, down
    # 8,192 x 28,672
    assert s["layer_params"] == 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    assert s["lora_params"] == 80 * 8 * (2 * 16384 + 2 * 9216 + 3 * 36864)


def test_sums_and_gaps_are_the_rows(results):
    rows = fsdp_qlora_terms.terms(results)
    planned = [r for r in results["rows"] if r["model"] == "llama-2-70b" and r["step"] == "PEFT's LoRA"]
    by_offload = {r["offload"]: r["gpu_bytes"] / 1e9 for r in planned}
    assert rows[0][1:3] == (by_offload[True], by_offload[False])
    assert rows[-1][2] == 0  # the offload-only term adds nothing without offload
    cells = {c[0]: c for c in fsdp_qlora_terms.table(results)["rows"]}
    for col, published in ((1, 19.6), (2, 35.6)):
        total = sum(r[col] for r in rows)
        assert float(cells["sum"][col]) == pytest.approx(total, abs=0.005)
        assert float(cells["not explained"][col].split()[0]) == pytest.approx(published - total, abs=0.05)


def test_the_committed_save_table_is_what_the_results_make(results):
    from bench.memory import fsdp_qlora_save

    assert json.loads(fsdp_qlora_70b.SAVE.read_text()) == json.loads(json.dumps(
        fsdp_qlora_save.save_table(results)))


def test_the_save_peak_is_its_terms_and_reads_the_plans_own_figures(results):
    from bench.memory import fsdp_qlora_save

    rows = fsdp_qlora_save.save_terms(results)
    planned = {r["offload"]: r for r in results["rows"]
               if r["model"] == "llama-2-70b" and r["step"] == "PEFT's LoRA"}
    # resident: with offload the 4-bit scales alone, without also the frozen shard (the plan's figure)
    assert rows[0][1:3] == (planned[True]["breakdown"]["frozen_weights"] / 1e9,
                            planned[False]["breakdown"]["frozen_weights"] / 1e9)
    shard = rows[0][2] - rows[0][1]
    lora_shard = fsdp_qlora_terms.shapes()["lora_params"] * 2 / 2
    assert rows[2][1] == rows[2][2] == pytest.approx(shard + lora_shard / 1e9)  # the clones, both columns
    assert rows[3][1] == pytest.approx(2 * 32000 * 8192 * 2 / 1e9)  # embedding and head gathered
    cells = {c[0]: c for c in fsdp_qlora_save.save_table(results)["rows"]}
    for col, published in ((1, 19.6), (2, 35.6)):
        total = sum(r[col] for r in rows)
        assert float(cells["sum (GB)"][col]) == pytest.approx(total, abs=0.005)
        assert float(cells["the sum in GiB (nvidia-smi's MiB / 1,024)"][col]) == pytest.approx(
            total * 1e9 / 2**30, abs=0.005)
        gap = float(cells["sum against their figure read as GB"][col].rstrip("%")) / 100
        assert gap == pytest.approx(total / published - 1, abs=0.0005)
