"""Benchmarks, one sub-package per question; each module runs as ``python -m bench.<package>.<module>``
and its figures land in ``bench/results/`` (the pages in docs/results/ are made from them by
``python -m bench.docs``).

- ``memory``: what a run holds and how exactly the plan predicts it (plan against run, traces
  against real steps, text, image and adapter-variant memory, what a card holds).
- ``speed``: what a step costs in time (MFU, the demo, each memory saving's time cost).
- ``peers``: lora_gui against TRL on the same work; ``peer_diffusers``: against diffusers' own
  LoRA scripts.
- ``gpu``: the GPU check (plans made on a CPU, the run on a lent card, its report, the kit).
- ``long``: long context (the switches, the longest length run for real, windowed attention).
- ``ui``: the dashboard (screenshots, a chart refresh's cost, many pages on one run).
- ``quality``: does the result come out right (the image demo, the GGUF export in llama.cpp).
- ``docs``: the figures pages generator.
"""
