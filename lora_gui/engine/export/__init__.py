"""A finished run's adapter in the formats other tools read: peft, diffusers and kohya files or
a merged text model (``run_export.py``), and GGUF for llama.cpp / Ollama (``gguf_export.py``),
each GGUF file read back and compared with what was meant before it is published
(``gguf_check.py``)."""
