"""Adapter variants side by side: LoRA, DoRA, LoHa, LoKr and OFT trained on the same samples, the
same number of optimizer steps and the same budget, each row a real run through the engine.

Every row starts from the run's own settings (preset + --set) and changes only ``adapter``;
``lora_dropout`` is 0 for every row (LoHa, LoKr and OFT have no input dropout, and one setting
for all keeps the rows comparable). The data is the preset's real documents at one length
(``corpus`` data of :mod:`lora_gui.engine.compare.data`): ``steps`` x ``batch_size`` training
samples and the same held-out samples for every row, so the held-out loss of each row is after
the same steps on the same data. Each row reports its peak memory with its source (tracker on a
CPU, cuda_allocator on a GPU) beside its predicted peak, real tokens per second over the steps
after the first, and the held-out loss; rows are ordinary compare.json rows (question
``variants``, mode = the variant), written after each one so an interrupted comparison resumes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from lora_gui.config import ADAPTERS, ConfigError, RunConfig
from lora_gui.engine.compare.data import data_stats, prepare_data
from lora_gui.engine.compare.quick import cpu_threads_for_load
from lora_gui.engine.compare.results import Comparison, resume_rows, write_results
from lora_gui.engine.compare.spec import CompareSettings, RowSpec
from lora_gui.engine.core.lock import holds_run_folder
from lora_gui.units import gb

log = logging.getLogger(__name__)
QUESTION = "variants"
DEFAULT_STEPS = 20


def parse_variants(text: str) -> list[str]:
    """``lora,dora,loha`` -> the list; an unknown name lists the valid ones.

    Raises:
        ConfigError: an unknown or repeated variant, or none.
    """
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in names if v not in ADAPTERS]
    if bad or not names:
        raise ConfigError(f"--variants: {', '.join(bad) or 'none given'}: choose from {', '.join(ADAPTERS)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--variants: {text!r} names a variant twice")
    return names


def variant_settings(variants: list[str], seq_len: int, steps: int, eval_samples: int = 8) -> CompareSettings:
    """The comparison's settings (saved in compare.json; a resume must match them)."""
    return CompareSettings(seq_lens=[seq_len], steps=steps, questions=["memory"], data_kinds=["corpus"],
                           ablations=False, eval_samples=eval_samples, variants=list(variants)).validate()


@holds_run_folder("out")  # one writer per folder, as a training run
def run_variants(base: RunConfig, variants: list[str], out: str | Path, *, seq_len: int | None = None,
                 steps: int = DEFAULT_STEPS, eval_samples: int = 8, overwrite: bool = False,
                 stop: threading.Event | None = None, on_row: Callable[[dict[str, Any]], None] | None = None,
                 progress: bool = False) -> dict[str, Any]:
    """Trains each variant on the same data and steps into ``out/compare.json``; returns
    {settings, rows}. Resumes the rows already there unless ``overwrite``.

    Raises:
        ConfigError: an image preset (variants are compared on text runs), bad settings.
    """
    from lora_gui.engine.compare.text_rows import _device, _run_row
    from lora_gui.models.text import load_tokenizer, resolve_model_source

    if base.task != "text":
        raise ConfigError(f"--variants: compares text runs; the preset is a {base.task} run")
    seq_len = seq_len or base.max_seq_len
    settings = variant_settings(variants, seq_len, steps, eval_samples)
    cmp = Comparison(base, settings, Path(out), stop or threading.Event(), on_row, progress)
    cmp.rows = resume_rows(cmp.out, cmp.saved_settings(), overwrite)
    tokenizer = load_tokenizer(resolve_model_source(base.model))
    data_stats(base, "corpus", seq_len, tokenizer)  # refuses data too short for the length
    data = prepare_data(base, "corpus", seq_len, steps * base.batch_size, eval_samples, cmp.out / "data",
                        tokenizer)
    budget = int(base.budget_gb * 2**30) or None
    precision = None if base.precision == "auto" else base.precision
    with cpu_threads_for_load(), tqdm(total=len(variants), disable=not progress, unit="row") as bar:
        for variant in variants:
            if cmp.stop.is_set():
                break
            spec = RowSpec(QUESTION, "corpus", variant, seq_len, {"adapter": variant, "lora_dropout": 0.0},
                           budget)
            if spec.key not in cmp.done():
                bar.set_postfix_str(variant)
                precision = precision or next((r["precision"] for r in cmp.rows if r.get("precision")), None)
                row = _run_row(cmp, spec, base.batch_size, data, precision, _device())
                if row is None:
                    break
                row["adapter_params"] = _adapter_params(cmp.out / "runs" / spec.folder)
                cmp.add(row)
            bar.update(1)
    write_results(cmp.out, cmp.saved_settings(), cmp.rows)
    return {"settings": cmp.saved_settings(), "rows": cmp.rows}


def _adapter_params(folder: Path) -> int | None:
    """Numbers in the saved adapter (adapter/adapter_model.safetensors); None without one."""
    from safetensors import safe_open

    path = folder / "adapter" / "adapter_model.safetensors"
    if not path.is_file():
        return None
    with safe_open(path, "pt") as f:
        return sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def format_variants_table(rows: list[dict[str, Any]]) -> str:
    """Plain-text table: peak (with source), tokens/s and held-out loss per variant, against lora."""
    rows = [r for r in rows if r.get("question") == QUESTION]
    ref = next((r for r in rows if r["mode"] == "lora" and r.get("status") == "ok"), {})

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a and b else "-"

    lines = [f"{'variant':<8} {'params':>8} {'len':>5} {'batch':>5} {'steps':>5} {'peak GB':>9} "
             f"{'vs lora':>7} {'predicted':>9} {'tok/s':>7} {'vs lora':>7} {'eval loss':>9} "
             f"{'vs lora':>8}  source"]
    for r in rows:
        peak, speed, loss = r.get("peak_bytes"), r.get("real_tokens_per_s"), r.get("eval_loss")
        base_loss = ref.get("eval_loss")
        status = "" if r.get("status") == "ok" else f"  [{r.get('message')}]"
        predicted = r.get("predicted_peak_bytes")
        lines.append(
            f"{r['mode']:<8} {r.get('adapter_params')!s:>8} {r.get('seq_len')!s:>5} "
            f"{r.get('batch_size')!s:>5} {r.get('steps')!s:>5} "
            f"{gb(peak or 0, unit=False):>9} {ratio(peak, ref.get('peak_bytes')):>7} "
            f"{gb(predicted or 0, unit=False):>9} {f'{speed:.0f}' if speed else '-':>7} "
            f"{ratio(speed, ref.get('real_tokens_per_s')):>7} "
            f"{f'{loss:.4f}' if loss is not None else '-':>9} "
            f"{f'{loss / base_loss - 1:+.2%}' if loss and base_loss else '-':>8}"
            f"  {r.get('memory_source')}{status}")
    return "\n".join(lines)
