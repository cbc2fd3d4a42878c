"""Try a trained adapter against its base: text generation streamed side by side, or base and
adapter pictures from the same prompt and seed (the CLI ``generate`` and the dashboard's Try tab).

One model is loaded per run: the adapter is switched off (peft ``disable_adapter``, diffusers
``disable_lora``) for the base output, so trying a run costs one copy of the base weights.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lora_gui.config import RunConfig
from lora_gui.engine.core.rundir import RunDirError, load_run_config

log = logging.getLogger(__name__)
TEXT_ADAPTER_FILE = "adapter_config.json"
IMAGE_ADAPTER_FILE = "pytorch_lora_weights.safetensors"
START_ADAPTER = "start"  # peft name of the adapter a run started from (init_adapter)


@dataclass(frozen=True)
class RunInfo:
    """A finished run folder: its settings and its adapter."""

    out: Path
    cfg: RunConfig
    adapter: Path

    @property
    def is_chat(self) -> bool:
        """Chat runs save their tokenizer (with the chat template) beside the adapter."""
        return (self.adapter / "tokenizer_config.json").is_file()


def open_run(run_dir: str | Path) -> RunInfo:
    """The run in ``run_dir`` with its adapter.

    Raises:
        RunDirError: the folder is not a run, or holds no adapter yet (nothing is written).
    """
    out = Path(run_dir)
    if not (out / "config.json").is_file():
        raise RunDirError(f"{out}: not a run folder (no config.json)")
    cfg = load_run_config(out)
    adapter = out / "adapter"
    diffusion = cfg.task in ("image", "video")  # a diffusers pipeline's adapter file
    needed = IMAGE_ADAPTER_FILE if diffusion else TEXT_ADAPTER_FILE
    if diffusion and (adapter / "peft" / TEXT_ADAPTER_FILE).is_file():
        needed = f"peft/{TEXT_ADAPTER_FILE}"  # LoHa / LoKr: a peft folder (diffusers cannot load them)
    if not (adapter / needed).is_file():
        raise RunDirError(f"{out}: has no trained adapter (no adapter/{needed}); train it to the end "
                          "or stop it so that it saves one")
    return RunInfo(out, cfg, adapter)


def device_name() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class TextTrial:
    """A text run's base model with its adapter attached, ready to generate from both."""

    def __init__(self, run: RunInfo, device: str | None = None) -> None:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        from lora_gui.models import text as text_models

        self.run = run
        self.device = device or device_name()
        source = text_models.resolve_model_source(run.cfg.model)
        self.tokenizer = text_models.load_tokenizer(str(run.adapter) if run.is_chat else source)
        dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        base = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        text_models.fit_embeddings(base, self.tokenizer)  # rows of the chat tokens, then the adapter's
        self.model = PeftModel.from_pretrained(base, str(run.adapter)).to(self.device).eval()
        self.start = self._load_start_adapter()

    def _load_start_adapter(self) -> Path | None:
        """The adapter the run started from (init_adapter, e.g. the sft run before a dpo run),
        loaded beside the trained one; None when the run started fresh or it is gone."""
        if not self.run.cfg.init_adapter:
            return None
        from lora_gui.engine.text.preference import start_adapter_dir
        from lora_gui.errors import USER_ERRORS

        try:
            folder = start_adapter_dir(self.run.cfg.init_adapter)
            self.model.load_adapter(str(folder), adapter_name=START_ADAPTER)
        except USER_ERRORS as err:
            log.warning("the adapter this run started from is not shown: %s", err)
            return None
        self.model.set_adapter("default")
        self.model.eval()
        return folder

    def prompt_ids(self, prompt: str) -> torch.Tensor:
        """The prompt as the run trained: through the chat template for chat runs, else BOS + text."""
        if self.run.is_chat:
            ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                     add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"]
        else:
            bos = [self.tokenizer.bos_token_id] if self.tokenizer.bos_token_id is not None else []
            ids = bos + self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return torch.tensor([ids], device=self.device)

    def stream(self, prompt: str, *, adapter: bool | str, max_new_tokens: int = 64, temperature: float = 0.7,
               seed: int = 0) -> Iterator[str]:
        """Yields the growing answer text (base when ``adapter`` is False; the adapter the run
        started from when it is ``"start"``), token by token."""
        from transformers import TextIteratorStreamer

        from lora_gui.data.chat_template import end_of_turn_ids

        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        kwargs: dict[str, Any] = dict(
            input_ids=self.prompt_ids(prompt), max_new_tokens=int(max_new_tokens), streamer=streamer,
            eos_token_id=end_of_turn_ids(self.tokenizer), pad_token_id=self.tokenizer.pad_token_id,
            do_sample=temperature > 0, use_cache=True)
        if temperature > 0:
            kwargs.update(temperature=float(temperature), top_k=0, top_p=1.0)
        failure: list[BaseException] = []

        def work() -> None:
            torch.manual_seed(int(seed))  # base and adapter sample from the same stream
            try:
                with torch.no_grad():
                    if adapter == START_ADAPTER:
                        self.model.set_adapter(START_ADAPTER)
                        try:
                            self.model.generate(**kwargs)
                        finally:
                            self.model.set_adapter("default")
                    elif adapter:
                        self.model.generate(**kwargs)
                    else:
                        with self.model.disable_adapter():
                            self.model.generate(**kwargs)
            except BaseException as err:  # surfaced in the caller's thread below
                failure.append(err)
                streamer.on_finalized_text("", stream_end=True)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        text = ""
        for piece in streamer:
            text += piece
            yield text
        thread.join()
        if failure:
            raise failure[0]


class ImageTrial:
    """An image run's pipeline with its adapter loaded; base pictures with the LoRA switched off."""

    def __init__(self, run: RunInfo, device: str | None = None) -> None:
        from lora_gui.models import diffusion as dm
        from lora_gui.models.diffusion_files import load_pipeline

        self.run = run
        self.device = device or device_name()
        self.pipe = load_pipeline(dm.resolve_pipeline_source(run.cfg.model), run.adapter, self.device)

    def pictures(self, prompt: str, *, seed: int = 0, scale: float = 1.0, steps: int | None = None):
        """(base, adapter) PIL images from the same prompt and seed; ``scale`` weighs the LoRA."""
        from lora_gui.engine.image.samples import pipeline_kwargs

        size = self.run.cfg.resolution
        common = dict(num_inference_steps=int(steps or self.run.cfg.sample_steps), height=size,
                      width=size, **pipeline_kwargs(self.pipe, self.run.cfg))
        # SD3 / Flux take the LoRA scale as joint_attention_kwargs, UNet pipelines as cross_attention_kwargs
        scale_arg = "joint_attention_kwargs" if "max_sequence_length" in common else "cross_attention_kwargs"
        self.pipe.disable_lora()
        base = self.pipe(prompt, generator=torch.Generator("cpu").manual_seed(int(seed)), **common).images[0]
        self.pipe.enable_lora()
        tuned = self.pipe(prompt, generator=torch.Generator("cpu").manual_seed(int(seed)),
                          **{scale_arg: {"scale": float(scale)}}, **common).images[0]
        return base, tuned


class VideoTrial:
    """A video run's pipeline (Wan or LTX-Video) with its adapter loaded; base clips with the LoRA
    switched off, written as mp4 files the Try tab plays."""

    def __init__(self, run: RunInfo, device: str | None = None) -> None:
        from lora_gui.models import diffusion as dm
        from lora_gui.models.diffusion_files import load_pipeline

        self.run = run
        self.device = device or device_name()
        source = dm.resolve_pipeline_source(run.cfg.model)
        self.kind = dm.pipeline_kind(source)
        self.pipe = load_pipeline(source, run.adapter, self.device)

    def clips(self, prompt: str, folder: Path, *, seed: int = 0, scale: float = 1.0,
              steps: int | None = None) -> tuple[Path, Path]:
        """(base, adapter) mp4 clips from the same prompt and seed at the run's size and longest
        frame bucket, written into ``folder``; ``scale`` weighs the LoRA."""
        from lora_gui.data import video_batches, videos
        from lora_gui.models.video import text_length_for

        width, height = video_batches.clip_size(self.run.cfg)
        common = dict(num_inference_steps=int(steps or self.run.cfg.sample_steps), height=height, width=width,
                      num_frames=self.run.cfg.video_frames, output_type="np",
                      max_sequence_length=text_length_for(self.kind, self.run.cfg.text_max_length))
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, lora in (("base", None), ("adapter", float(scale))):
            if lora is None:
                self.pipe.disable_lora()
            else:
                self.pipe.enable_lora()
            frames = self.pipe(prompt, generator=torch.Generator("cpu").manual_seed(int(seed)),
                               attention_kwargs=None if lora is None else {"scale": lora}, **common).frames[0]
            array = (frames.clip(0, 1) * 255).round().astype("uint8")  # (F, H, W, 3)
            path = folder / f"{name}-seed{int(seed)}-scale{float(scale):g}.mp4"
            paths.append(videos.write_clip(path, array))
        return paths[0], paths[1]
