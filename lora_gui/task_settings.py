"""The task, base model and training data of a run: a group of :class:`lora_gui.config.RunConfig`'s
fields (declared here as :mod:`lora_gui.objective` declares the objective's), the bundled demo
data and models, and where a run's data is read from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lora_gui.options import READS, TEXT, option

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BUILTIN_MODEL_DIR = ASSETS / "base-model"
BUILTIN_DATA = {"builtin": ASSETS / "corpus" / "finetune.txt",
                "builtin:finetune": ASSETS / "corpus" / "finetune.txt",
                "builtin:pretrain": ASSETS / "corpus" / "pretrain.txt",
                "builtin:chat": ASSETS / "chat" / "demo.jsonl",  # lora_gui.data.build_chat_demo
                "builtin:pairs": ASSETS / "pairs" / "demo.jsonl",  # lora_gui.data.build_pairs_demo
                "builtin:stars": ASSETS / "drawing-stars"}  # image folder (lora_gui.data.drawings)
BUILTIN_IMAGES = ASSETS / "images"  # data=builtin when task=image (lora_gui.data.build_images)
BUILTIN_CLIPS = ASSETS / "video-clips"  # data=builtin when task=video (lora_gui.data.build_clips)


@dataclass
class TaskSettings:
    """What to train, on which base model and data (mixed into RunConfig)."""

    # -- task and model ----------------------------------------------------------------------
    task: str = option("text", "What to train: a causal language model (text), a diffusion "
                       "model's UNet (image) or a text-to-video transformer (video: Wan, LTX-Video).",
                       "task", choices=("text", "image", "video"))
    model: str = option("builtin", "Base model: 'builtin' (text: bundled 4M-parameter Llama; image: "
                        "bundled small SD-style pipeline), 'builtin:drawing' (image: bundled SD3-style "
                        "pipeline that draws shapes at 64 px), a Hugging Face id (needs network) or a "
                        "local directory saved with save_pretrained (image: SD 1.x, SDXL, SD3 / "
                        "SD3.5 or Flux.1).", "task", path=READS)
    data: str = option("builtin", "Training data: 'builtin' (text: bundled fine-tune corpus; image: "
                       "bundled demo pictures), a .txt / .jsonl / .csv file (text) or an image "
                       "folder with .txt captions or metadata.jsonl (image).", "task", path=READS)
    eval_fraction: float = option(0.05, "Share of documents held out for eval_loss.", "task",
                                  low=0.0, high=0.5)
    # -- instruction and chat data (lora_gui.data.chat) --------------------------------------------
    data_format: str = option("auto", "Text data format; auto detects it from the first record: messages "
                              "(role/content), sharegpt (conversations from/value), alpaca (instruction/"
                              "input/output), prompt_response, text.", "task",
                              choices=("auto", "messages", "sharegpt", "alpaca", "prompt_response", "text"),
                              tasks=TEXT)
    chat_template: str = option("auto", "Conversations: auto uses the tokenizer's chat template (ChatML "
                                "when it has none, with a warning); chatml forces ChatML.", "task",
                                choices=("auto", "chatml"), tasks=TEXT)
    train_on_prompt: bool = option(False, "Conversations: also take the loss on system and user turns "
                                   "(default: on the assistant answers and their end of turn only).", "task",
                                   tasks=TEXT)

    def data_path(self) -> Path:
        """The data file (or image folder): a bundled name resolved to its path, or the given path."""
        if self.task == "image" and self.data == "builtin":
            return BUILTIN_IMAGES
        if self.task == "video" and self.data == "builtin":
            return BUILTIN_CLIPS
        return BUILTIN_DATA.get(self.data, Path(self.data))
