"""Does the result come out right: the image demo's before / after, the GGUF export read by
llama.cpp against transformers."""
