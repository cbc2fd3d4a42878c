#!/usr/bin/env bash
# Prepares what the GPU check needs on a lent GPU machine that has torch but not this project's
# versions of transformers / peft / diffusers / bitsandbytes (nothing can be installed there from
# a registry). Writes .devsite/ (ignored by git; about 25 MB): the three wheels and TRL's (for
# the peers section) at the versions in .venv, and bitsandbytes with only its CUDA 13.0 and CPU
# libraries. Then, on the machine, with .devsite carried:
#
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .devsite/*.whl \
#     && cp -r .devsite/pkgs/* /tmp/site/ && export PYTHONPATH=/tmp/site:$PWD \
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
rm -rf .devsite && mkdir -p .devsite/pkgs
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .devsite \
  "transformers==$(version transformers)" "peft==$(version peft)" "diffusers==$(version diffusers)" \
  "trl==$(version trl)"  # the peers section's baseline (bench-only, bench/requirements.txt)
BNB=$(version bitsandbytes)
cp -r "$SP/bitsandbytes" "$SP/bitsandbytes-$BNB.dist-info" .devsite/pkgs/
find .devsite/pkgs -name '*.so' ! -name libbitsandbytes_cuda130.so ! -name libbitsandbytes_cpu.so -delete
find .devsite -name __pycache__ -prune -exec rm -rf {} +
grep -qx '/.devsite/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
  || echo '/.devsite/' >> "$(git rev-parse --git-common-dir)/info/exclude"
du -sh .devsite
