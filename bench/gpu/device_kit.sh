#!/usr/bin/env bash
# Prepares what the GPU check needs on a lent GPU machine that has torch but not this project's
# versions of transformers / peft / diffusers / bitsandbytes (nothing can be installed there from
# a registry). Writes .devsite/ (ignored by git; about 35 MB, and the Unsloth site's wheels): the
# three wheels, TRL's, Liger-Kernel's (for the peers section) and accelerate's at the versions in
# .venv and bench/requirements.txt, Unsloth's at bench/requirements-unsloth.txt's, bitsandbytes with
# only its CUDA 13.0 and CPU libraries, and in .devsite/peer/ torchvision for diffusers' scripts
# (image_peers; only their processes put bench/.peer_deps on their path). Then, on the machine,
# with .devsite carried:
#
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .devsite/*.whl \
#     && python3 -m pip install -q --no-index --no-deps --target /tmp/site-unsloth .devsite/unsloth/*.whl \
#     && python3 -m pip install -q --no-index --no-deps --target bench/.peer_deps .devsite/peer/*.whl \
#     && cp -r .devsite/pkgs/* /tmp/site/ && export PYTHONPATH=/tmp/site:$PWD UNSLOTH_SITE=/tmp/site-unsloth \
#     && python3 -m bench.gpu.check --out "$OUT" --plans bench/results/gpu_plans.json
#
# The video rows (bench/gpu/video.py) need nothing beyond these: clips are random latents, not
# files PyAV would decode.
#
# The plans file comes from `python -m bench.gpu.check --plan-only --plans bench/results/gpu_plans.json
# --out /tmp/x` on this machine (about 5 minutes), so the card spends its minutes measuring.
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root (this script is bench/gpu/device_kit.sh)
PY=.venv/bin/python
SP=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
version() { $PY -c "import importlib.metadata as m; print(m.version('$1'))"; }
# the torchvision release that pairs with the lent machines' torch (2.11, bench/results/gpu_h200);
# if its C++ ops cannot load there, bench/peer_diffusers/launch.py declares their schemas so the
# pure-Python transforms the scripts use still import
TORCHVISION=0.26.0
rm -rf .devsite && mkdir -p .devsite/pkgs .devsite/peer
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .devsite \
  "transformers==$(version transformers)" "peft==$(version peft)" "diffusers==$(version diffusers)" \
  "trl==$(version trl)" \
  "accelerate==$(version accelerate)" \
  "$(grep -m1 '^liger-kernel==' bench/requirements.txt)"  # the peers section's baselines (bench-only)
# the Unsloth peer: its own site (it pins older transformers / trl / datasets), run in a process
# of its own with .devsite/unsloth first on PYTHONPATH (bench/gpu/peers_tuned.py)
mkdir -p .devsite/unsloth
grep -v '^#' bench/requirements-unsloth.txt | grep . | xargs $PY -m pip download -q --no-deps \
  --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 -d .devsite/unsloth
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d .devsite/peer "torchvision==$TORCHVISION"
BNB=$(version bitsandbytes)
cp -r "$SP/bitsandbytes" "$SP/bitsandbytes-$BNB.dist-info" .devsite/pkgs/
find .devsite/pkgs -name '*.so' ! -name libbitsandbytes_cuda130.so ! -name libbitsandbytes_cpu.so -delete
find .devsite -name __pycache__ -prune -exec rm -rf {} +
grep -qx '/.devsite/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
  || echo '/.devsite/' >> "$(git rev-parse --git-common-dir)/info/exclude"
du -sh .devsite
