"""OFT's closed-form estimate against the trace of its real peft layers (tiny Llama, bf16, batch
2, CPU, source: predicted both): estimate / trace - 1 per length and block size (lora_rank).

    PYTHONPATH=. .venv/bin/python bench/memory/oft_estimate.py
"""

from __future__ import annotations

from lora_gui.memory.predict.estimate import estimate_text_step
from lora_gui.memory.predict.trace import trace_text_step
from lora_gui.models.adapters import AdapterSpec
from tests.memory.test_estimate import tiny_llama


def main() -> None:
    print(f"{'tokens':>7}{'rank':>6}{'estimate':>12}{'trace':>12}{'error':>9}")
    for seq in (64, 256, 512):
        for rank in (4, 8):
            kw = {"adapter": AdapterSpec("oft"), "batch_size": 2, "seq_len": seq, "lora_rank": rank,
                  "dtype": "bf16", "device": "cpu"}
            est = estimate_text_step(tiny_llama(), **kw).traced_peak_bytes
            tr = trace_text_step(tiny_llama(), **kw).traced_peak_bytes
            print(f"{seq:>7}{rank:>6}{est:>12,}{tr:>12,}{est / tr - 1:>+9.2%}")


if __name__ == "__main__":
    main()
