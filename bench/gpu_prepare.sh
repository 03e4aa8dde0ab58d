#!/usr/bin/env bash
# Prepare what bench/gpu_check.sh needs on a GPU machine that reaches no network: run HERE,
# in the repository root, on a machine with pip access, before the device run.
#
#   bench/gpu_prepare.sh            # -> .whl/ (wheels)
#
# The folder is git-ignored through .git/info/exclude and travels with the device call's
# `carry: [".whl"]`; the dev-set speech is part of the repository (tests/data/audio/devset).
# The device image has torch (CUDA), numpy, safetensors, sentencepiece, tokenizers, pyyaml, tqdm,
# rich, prometheus-client, threadpoolctl, pytest and hypothesis already; these are the rest of
# oasr's imports.
set -euo pipefail
cd "$(dirname "$0")/.."
EXCLUDE=$(git rev-parse --git-path info/exclude)
for path in /.whl/; do grep -qx "$path" "$EXCLUDE" 2>/dev/null || echo "$path" >> "$EXCLUDE"; done
mkdir -p .whl
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64)
for pkg in kaldi-native-fbank soxr soundfile cffi pycparser rapidfuzz whisper-normalizer \
           more-itertools starlette websockets pytest-timeout; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp "${PLATFORMS[@]}" -d .whl "$pkg"
done
du -sh .whl
