"""Export a finished run: the adapter with a model card, or (text runs) the base model with the
adapter merged in, saved in transformers' safetensors format or as GGUF for llama.cpp / Ollama
(:mod:`lora_gui.engine.export.gguf_export`: the merged model, the adapter alone where it can be, and a
Modelfile; each file read back and compared before the export is published).

Everything is written into a temporary folder beside ``out`` and renamed at the end, so a failed
export leaves nothing behind; an existing non-empty ``out`` is refused.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

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
    files = ""
    if run.cfg.task == "image":
        kind = f"{run.cfg.adapter} adapter (image)"
        info_file = run.adapter / "adapter_info.json"
        info = json.loads(info_file.read_text(encoding="utf-8")) if info_file.is_file() else {}
        files = "".join(f"- `{name}`: {who}\n" for name, who in info.get("files", {}).items())
        files = f"\n## Which tools read which file\n\n{files}" if files else ""
    return (f"# {run.out.name}: {kind}\n\nTrained with lora_gui.\n{files}\n"
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


def _gguf_inputs(run: RunInfo) -> tuple[Any, dict[str, Any], Path]:
    """The tokenizer, base config and a temporary tokenizer folder of a text run, checked for
    GGUF (architecture, tokenizer) before any work. The caller removes the folder."""
    from transformers import AutoConfig

    from lora_gui.engine.export import gguf_export
    from lora_gui.models import text as text_models

    source = text_models.resolve_model_source(run.cfg.model)
    config = AutoConfig.from_pretrained(source).to_dict()
    gguf_export.architecture(config, run.cfg.model)
    tokenizer = text_models.load_tokenizer(str(run.adapter) if run.is_chat else source)
    folder = Path(tempfile.mkdtemp(prefix="lora-gui-tokenizer-"))
    tokenizer.save_pretrained(folder)
    try:
        if not (folder / "tokenizer.json").is_file():
            raise ExportError(f"{run.cfg.model}: its tokenizer has no tokenizer.json (a fast tokenizer "
                              "is needed for GGUF export)")
        gguf_export.pre_tokenizer(json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")),
                                  run.cfg.model)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return tokenizer, config, folder


def _write_gguf(run: RunInfo, staging: Path, name: str, kind: str, tokenizer: Any,
                tokenizer_dir: Path) -> list[str]:
    """Merged model, adapter (where it can be) and Modelfile into ``staging``, each GGUF read
    back and compared; returns the lines the model card adds."""
    from safetensors.torch import load_file

    from lora_gui.engine.export import gguf_check, gguf_export
    from lora_gui.engine.generate import TextTrial

    merged = TextTrial(run, device="cpu").model.merge_and_unload().to(torch.float32)
    config = merged.config.to_dict()
    model_file = f"{name}-{kind}.gguf"
    meant = gguf_export.write_model(staging / model_file, merged.state_dict(), config, tokenizer,
                                    tokenizer_dir, kind, name)
    arch, _ = gguf_export.architecture(config, name)
    meta = {"general.architecture": arch, f"{arch}.context_length": config["max_position_embeddings"],
            f"{arch}.block_count": config["num_hidden_layers"], "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": gguf_export.vocabulary(tokenizer, config["vocab_size"])[0]}
    if tokenizer.chat_template:
        meta["tokenizer.chat_template"] = tokenizer.chat_template
    report = gguf_check.check_gguf(staging / model_file, meant, meta)
    lines = [f"- `{model_file}`: merged model, {kind}; read back: {report['tensors']} tensors "
             f"{report['types']}, largest difference {report['max_abs_error']:.3g}"]
    adapter_config = json.loads((run.adapter / "adapter_config.json").read_text(encoding="utf-8"))
    weights = load_file(run.adapter / "adapter_model.safetensors")
    refusal = gguf_export.adapter_refusal(adapter_config, any(".lora_" not in k for k in weights))
    adapter_file = None
    if refusal is None:
        adapter_file = f"{name}-lora-{'f16' if kind == 'q8_0' else kind}.gguf"
        meant = gguf_export.write_adapter(staging / adapter_file, weights, adapter_config, config, kind, name)
        gguf_check.check_gguf(staging / adapter_file, meant, {"general.type": "adapter",
                                                              "adapter.type": "lora"})
        lines.append(f"- `{adapter_file}`: the adapter alone (llama.cpp `--lora`, Ollama `ADAPTER`)")
    else:
        lines.append(f"- no adapter-only GGUF: {refusal}")
    (staging / "Modelfile").write_text(gguf_export.modelfile(model_file, tokenizer.chat_template,
                                                             adapter_file), encoding="utf-8")
    return lines


def export_run(run_dir: str | Path, out: str | Path, merged: bool = False, gguf: str | None = None) -> Path:
    """Exports the run in ``run_dir`` into ``out`` (a new or empty folder); returns ``out``.

    Args:
        run_dir: a finished run folder (with adapter/).
        out: destination folder.
        merged: text runs only: save the base with the adapter merged (loads with
            ``AutoModelForCausalLM.from_pretrained(out)``) instead of the adapter.
        gguf: text runs only: f16, bf16 or q8_0: the merged model as GGUF, the adapter alone as
            a GGUF LoRA where it can be, and an Ollama Modelfile.

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
    gguf_lines, tokenizer_dir = [], None
    if gguf is not None:
        _check_gguf_request(run, merged, gguf)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ExportError(f"--out {out}: exists and is not empty; choose a new folder")
        tokenizer, _, tokenizer_dir = _gguf_inputs(run)
    staging = _staging(out)
    try:
        if gguf is not None:
            gguf_lines = _write_gguf(run, staging, run.out.name, gguf, tokenizer, tokenizer_dir)
        elif merged:
            _merge_text(run, staging)
        else:
            for item in run.adapter.iterdir():
                if item.is_file():
                    shutil.copy2(item, staging / item.name)
                elif item.is_dir():  # an image run's peft folder (LoHa / LoKr)
                    shutil.copytree(item, staging / item.name)
        card = model_card(run, merged or gguf is not None)
        if gguf_lines:
            card += "\n## GGUF (llama.cpp, Ollama, LM Studio)\n\n" + "\n".join(gguf_lines) + "\n"
        (staging / "README.md").write_text(card, encoding="utf-8")
        if out.exists():
            out.rmdir()  # empty (checked above)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if tokenizer_dir is not None:
            shutil.rmtree(tokenizer_dir, ignore_errors=True)
    log.info("exported %s -> %s (%s)", run.out, out,
             f"gguf {gguf}" if gguf else "merged" if merged else "adapter")
    return out


def _check_gguf_request(run: RunInfo, merged: bool, kind: str) -> None:
    from lora_gui.engine.export.gguf_export import GGUF_TYPES

    if kind not in GGUF_TYPES:
        raise ExportError(f"--gguf {kind!r}: choose one of {', '.join(GGUF_TYPES)}")
    if run.cfg.task == "image":
        raise ExportError("--gguf: image runs cannot be written as GGUF (llama.cpp reads language "
                          "models); export the adapter instead")
    if merged:
        raise ExportError("--merged and --gguf: choose one (--gguf writes the merged model as GGUF)")


__all__ = ["ExportError", "RunDirError", "export_run", "model_card"]
