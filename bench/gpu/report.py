"""A lent card's measurements next to the plans they were run with, reserved memory judged the
way the card used it.

    python -m bench.gpu.report bench/results/gpu_h200/run2_gpu_check.json \
        --plans bench/results/gpu_h200/run2_plans.json

``bench.gpu.check`` compares every row's ``max_memory_reserved`` with the pages a CAPPED run
needs. Only the card rows are capped; every other row ran uncapped, where the allocator keeps
freed pages mapped, so its reserve is compared here with the allocator replay's uncapped figure
(``allocator_replay.peak_reserved`` of the same plan). The capped rows are compared with what
the planner now counts for a capped run (:func:`lora_gui.memory.predict.allocator.capped_need`:
the replay's live pages plus the fragmentation a capped run could not unmap, at most the uncapped
figure). Allocated is the same in both views. All figures MiB; sources: ``cuda_allocator``
(measured) and ``predicted`` (the plans).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lora_gui.memory.predict.allocator import Replay, capped_need

MIB = 2**20


def _replay(plan: dict[str, Any]) -> Replay:
    r = plan["trace"]["info"]["allocator_replay"]
    return Replay(r["peak_allocated"], r["peak_reserved"], False, r["segments"], r["peak_pages"],
                  r["expandable_segments"])


def _key(section: str, row: dict[str, Any], plans: dict[str, Any]) -> str | None:
    """The plan a row was measured against (gpu_check's keys: ``section:name:dtype:shape...``,
    ``card:card:HxL:dtype:seq:head_groups``)."""
    shape = str(row.get("seq_len") or row.get("resolution"))
    found = []
    for key in plans:
        parts = key.split(":")
        if parts[0] != section or "estimate" in parts or "longest" in parts:
            continue
        if section == "card":
            groups = str(row["attention_head_groups"])
            ok = parts[1] == row["card"] and parts[4] == shape and parts[5] == groups
        else:
            ok = parts[3] == shape and (section == "nf4" or parts[1] == row["model"])
        if ok:
            found.append(key)
    return found[0] if len(found) == 1 else None


def report(check: dict[str, Any], plans: dict[str, Any]) -> str:
    out = [f"Card: {check['device_name']} (torch {check['torch']}); plans traced with "
           f"{check.get('plans_traced_with')}", "",
           "| row | shape | allocated measured / planned | error | reserved measured (uncapped) / "
           "replay uncapped | error |", "|---|---|---|---|---|---|"]
    for section in ("text", "nf4", "unet", "dit"):
        for row in check.get(section, []):
            key = _key(section, row, plans)
            if key is None:
                continue
            rp = _replay(plans[key])
            alloc, res = row["measured_bytes"], row["measured_reserved_bytes"]
            shape = f"seq {row['seq_len']}" if "seq_len" in row else f"{row['resolution']} px"
            planned = row["predicted_bytes"]
            out.append(f"| {row['model']} | {shape} | {alloc / MIB:,.0f} / {planned / MIB:,.0f} | "
                       f"{planned / alloc - 1:+.1%} | {res / MIB:,.0f} / "
                       f"{rp.peak_reserved / MIB:,.0f} | {rp.peak_reserved / res - 1:+.1%} |")
    out += ["", "Capped rows (the card's memory less the plans' context, "
            "`set_per_process_memory_fraction`):", "",
            "| card | seq | head groups | cap | measured allocated / reserved | replay pages | "
            "planned need now (pages + fragmentation) | fits by the plan now | ran |",
            "|---|---|---|---|---|---|---|---|---|"]
    for row in check.get("card", []):
        key = _key("card", row, plans)
        if key is None:
            continue
        rp = _replay(plans[key])
        cap = row["budget_bytes"] - (row["predicted_nvidia_smi_bytes"] - row["predicted_reserved_bytes"])
        need = capped_need(rp)
        ran = "out of memory" if row["out_of_memory"] else "ran"
        if row["out_of_memory"]:
            measured = (f"{row['uncapped_measured_bytes'] / MIB:,.0f} / "
                        f"{row['uncapped_reserved_bytes'] / MIB:,.0f} (uncapped rerun)")
        else:
            measured = f"{row['measured_bytes'] / MIB:,.0f} / {row['measured_reserved_bytes'] / MIB:,.0f}"
        out.append(f"| {row['card']} | {row['seq_len']} | {row['attention_head_groups'] or 'off'} | "
                   f"{cap / MIB:,.0f} | {measured} | {rp.peak_pages / MIB:,.0f} | {need / MIB:,.0f} | "
                   f"{'yes' if need <= cap else 'no'} | {ran} |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", type=Path, help="gpu_check.json written on the card")
    parser.add_argument("--plans", type=Path, required=True, help="the plans file the check read")
    args = parser.parse_args()
    check = json.loads(args.check.read_text(encoding="utf-8"))
    plans = json.loads(args.plans.read_text(encoding="utf-8"))["plans"]
    print(report(check, plans), end="")


if __name__ == "__main__":
    main()
