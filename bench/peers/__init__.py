"""lora_gui against TRL on the same work (SFT, DPO), with the tracker's and the profiler's helpers
(diffusers' own scripts are the image peer: ``bench.peer_diffusers``)."""
