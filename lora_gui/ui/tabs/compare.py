"""Compare tab: traditional vs optimized, measured. The comparison runner (issue 7) has not landed
yet, so this tab shows the measured benchmark table that is in the repository and says so."""

from __future__ import annotations

import gradio as gr

from lora_gui.ui import handlers


def build() -> None:
    gr.Markdown("**Not built yet:** running a comparison from this page (grouped bars per length, "
                "ablation waterfall) arrives with `python -m lora_gui compare`. Below: the measured "
                "table from docs/BENCHMARKS.md (source: tracker, this project's 2-core CPU), "
                "reproduced by `python -m bench.text_memory`.")
    gr.Markdown(handlers.benchmark_table(), elem_id="compare-table")
