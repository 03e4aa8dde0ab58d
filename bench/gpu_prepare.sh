#!/usr/bin/env bash
# Prepare what bench/gpu_check.sh needs on a GPU machine that reaches no network: run HERE,
# in the repository root, on a machine with pip access, before the device run.
#
#   bench/gpu_prepare.sh            # -> .whl/ (wheels) and .gpu_audio/ (dev-set speech)
#
# Both folders are git-ignored through .git/info/exclude and travel with the device call's
# `carry: [".whl", ".gpu_audio"]`. The device image has torch (CUDA), numpy, safetensors,
# sentencepiece, tokenizers, pyyaml, tqdm, rich, prometheus-client, threadpoolctl, pytest and
# hypothesis already (/work/.library/device/KINDS.md); these are the rest of oasr's imports.
set -euo pipefail
cd "$(dirname "$0")/.."
EXCLUDE=$(git rev-parse --git-path info/exclude)
for path in /.whl/ /.gpu_audio/; do grep -qx "$path" "$EXCLUDE" 2>/dev/null || echo "$path" >> "$EXCLUDE"; done
mkdir -p .whl .gpu_audio
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64)
for pkg in kaldi-native-fbank soxr soundfile cffi pycparser rapidfuzz whisper-normalizer \
           more-itertools starlette websockets pytest-timeout; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp "${PLATFORMS[@]}" -d .whl "$pkg"
done
# a few minutes of real speech for the benchmarks and the engine tests (files < 1 MiB each)
AUDIO=../shared/audio/devset
cp "$AUDIO"/manifest.tsv .gpu_audio/ 2>/dev/null || true
for f in tts_00 tts_01 real_jfk real_george_0; do cp "$AUDIO/$f.wav" .gpu_audio/; done
ls "$AUDIO"/*.wav | head -24 | xargs -I{} cp {} .gpu_audio/
du -sh .whl .gpu_audio
