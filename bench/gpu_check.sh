#!/usr/bin/env bash
# The GPU check of the CUDA-graph path (issue #22), in one go on a lent H200 (~10 minutes).
#
#   bench/gpu_check.sh OUT_DIR
#
# Needs .whl/ from bench/gpu_prepare.sh (carried with the device call). Writes
# into OUT_DIR: env.txt; tests.log (the CUDA tests, host syncs per step printed);
# throughput.jsonl (bench/gpu_throughput.py: engine vs dense loop at 1/64/256/1024 streams,
# graphs on and off, step time per width, then the real-time stream count); the quick
# `oasr bench --device cuda` as bench_quick_graphs_on.json / .md; summary.md (the numbers
# docs/benchmarks.md asks for). Each stage has its own time limit (150 + 300 + 90 s) so a
# slow one still leaves the others' files.
set -uo pipefail
OUT=${1:?usage: bench/gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# -- install: the wheels the image lacks, no network
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
# the tests and the benchmarks read the dev set in the repository (tests/data/audio/devset)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c \
  "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  git log --oneline -1 2>/dev/null; } > "$OUT/env.txt" 2>&1
python3 -c "import oasr.benchmarks.runner, oasr.engine" || { echo "oasr does not import" >&2; exit 1; }

# -- 1. the CUDA tests: graphs replay == eager, no host sync in a warm forward, syncs per step
timeout 150 python3 -m pytest -q -s -p no:cacheprovider -o addopts="" \
    tests/engine/test_cuda_graphs.py tests/engine/test_graphs.py tests/engine/test_padding.py \
    tests/decoding/test_streaming.py -k "cuda or graph or pad or Cuda" 2>&1 | tee "$OUT/tests.log"

# -- 2. engine vs dense loop at 1/64/256/1024 streams, graphs on and off, then the real-time
#       stream count with graphs on (float16, the CUDA default); one JSON line per measurement
timeout 300 python3 bench/gpu_throughput.py "$OUT/throughput.jsonl" \
    --streams 1 64 256 1024 2>&1 | tail -60 > "$OUT/throughput.log"

# -- 3. the whole quick `oasr bench --device cuda` (graphs on) in what time is left
timeout 90 python3 -m oasr.cli bench --quick --device cuda --cuda-graphs on --threads 4 \
    --out "$OUT/bench_quick_graphs_on.json" --markdown "$OUT/bench_quick_graphs_on.md" \
    2>&1 | tail -40 > "$OUT/bench_quick.log"

# -- 4. the summary docs/benchmarks.md quotes
python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, re, sys  # noqa: E401
from pathlib import Path
out = Path(sys.argv[1])
syncs = re.findall(r"host syncs per step: (\[.*?\])", (out / "tests.log").read_text()
                   if (out / "tests.log").exists() else "")
print("| graphs | streams | engine step ms | dense step ms | speedup |")
print("|---|---|---|---|---|")
lines = (out / "throughput.jsonl").read_text().splitlines() if (out / "throughput.jsonl").exists() else []
records = [json.loads(line) for line in lines]
for r in records:
    if r["kind"] == "throughput":
        print(f"| {r['cuda_graphs']} | {r['num_streams']} | {r['engine_step_ms']:.2f} | "
              f"{r['dense_step_ms']:.2f} | {r['speedup']:.1f}x |")
for r in records:
    if r["kind"] == "realtime":
        print(f"\nreal-time streams, graphs on: {r['max_realtime_streams']}")
print(f"\nhost syncs per step (graphs on, 3 warm steps): {syncs[0] if syncs else 'not measured'}")
PY
