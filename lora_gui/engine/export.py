"""Export a finished run: the adapter with a model card, or (text runs) the base model with the
adapter merged in, saved in transformers' safetensors format.

Everything is written into a temporary folder beside ``out`` and renamed at the end, so a failed
export leaves nothing behind; an existing non-empty ``out`` is refused.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import torch

from lora_gui.config import diff_from_defaults
from lora_gui.engine.core.rundir import RunDirError
from lora_gui.engine.generate import RunInfo, open_run
from lora_gui.errors import UserError

log = logging.getLogger(__name__)


class ExportError(UserError, ValueError):
    """The export cannot be done as asked; nothing was written."""


def model_card(run: RunInfo, merged: bool) -> str:
    """README.md text: base model, data, settings that differ from the defaults, eval losses."""
    summary = {}
    if (run.out / "run.json").is_file():
        summary = json.loads((run.out / "run.json").read_text(encoding="utf-8"))
    settings = "\n".join(f"- `{k}`: {v}" for k, v in diff_from_defaults(run.cfg).items()) or "- defaults"

    def loss(key: str) -> str:
        value = summary.get(key)
        return f"{value:.4f}" if isinstance(value, float) else "not measured"

    kind = "merged model (base + LoRA)" if merged else "LoRA adapter (peft format)"
    if run.cfg.task == "image":
        kind = "LoRA adapter (diffusers format: pipe.load_lora_weights)"
    return (f"# {run.out.name}: {kind}\n\nTrained with lora_gui.\n\n"
            f"- base model: `{run.cfg.model}`\n- data: `{run.cfg.data}` (format: {run.cfg.data_format})\n"
            f"- task: {run.cfg.task}\n"
            f"- chat template: {'yes, in the tokenizer files' if run.is_chat else 'no'}\n"
            f"- steps: {summary.get('steps', 'unknown')}, status: {summary.get('status', 'unknown')}\n"
            f"- held-out loss: {loss('eval_loss')} (base model: {loss('base_eval_loss')})\n\n"
            f"## Settings (differences from the defaults)\n\n{settings}\n")


def _staging(out: Path) -> Path:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out {out}: exists and is not empty; choose a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-export-"))


def _merge_text(run: RunInfo, folder: Path) -> None:
    from lora_gui.engine.generate import TextTrial

    trial = TextTrial(run, device="cpu")
    merged = trial.model.merge_and_unload()
    merged = merged.to(torch.float32)
    merged.config.use_cache = True
    merged.save_pretrained(folder, safe_serialization=True)
    trial.tokenizer.save_pretrained(folder)


def export_run(run_dir: str | Path, out: str | Path, merged: bool = False) -> Path:
    """Exports the run in ``run_dir`` into ``out`` (a new or empty folder); returns ``out``.

    Args:
        run_dir: a finished run folder (with adapter/).
        out: destination folder.
        merged: text runs only: save the base with the adapter merged (loads with
            ``AutoModelForCausalLM.from_pretrained(out)``) instead of the adapter.

    Raises:
        ExportError, RunDirError: with nothing written.
    """
    run = open_run(run_dir)
    out = Path(out)
    if merged and run.cfg.task == "image":
        raise ExportError("--merged: image runs export the adapter only (load it with "
                          "pipe.load_lora_weights); drop --merged")
    if out.resolve() == run.out.resolve() or run.out.resolve() in out.resolve().parents:
        raise ExportError(f"--out {out}: must not be inside the run folder {run.out}")
    staging = _staging(out)
    try:
        if merged:
            _merge_text(run, staging)
        else:
            for item in run.adapter.iterdir():
                if item.is_file():
                    shutil.copy2(item, staging / item.name)
        (staging / "README.md").write_text(model_card(run, merged), encoding="utf-8")
        if out.exists():
            out.rmdir()  # empty (checked above)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("exported %s -> %s (%s)", run.out, out, "merged" if merged else "adapter")
    return out


__all__ = ["ExportError", "RunDirError", "export_run", "model_card"]
