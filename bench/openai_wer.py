"""WER of the OpenAI-compatible paths against ``oasr transcribe`` on the devset's real files.

One run, one machine, one model (the bundled one with its Whisper second pass unless flags
say otherwise):

- ``transcribe``: ``oasr transcribe --json`` over the files (the reference path);
- ``http``: ``client.audio.transcriptions.create`` of the official ``openai`` SDK, per file,
  against an ``oasr-server`` started here on a free loopback port;
- ``realtime_vad`` / ``realtime_manual``: ``client.realtime.connect(extra_query={"intent":
  "transcription"})``, each file resampled to 24 kHz pcm and appended at real-time pace
  (100 ms appends, then 1.5 s of silence) with ``server_vad`` (500 ms silence) or manual
  commits; the item transcripts joined.

Texts are scored with `oasr.text.wer.ErrorCounts` after `normalize_transcript`.

    python bench/openai_wer.py --out bench/results_openai_wer.json [-- ENGINE FLAGS]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from oasr.benchmarks.realtime_client import realtime_pcm, start_feeding
from oasr.benchmarks.workload import DEVSET_DIR
from oasr.text.wer import ErrorCounts, normalize_transcript

KEY = "sk-bench"
READY = re.compile(r"oasr is ready: open http://127\.0\.0\.1:(\d+)/")


def start_server(extra: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    cmd = [sys.executable, "-c", "import sys; from backend.cli import server_main; "
           "sys.exit(server_main())", "--host", "127.0.0.1", "--port", "0", "--api-key", KEY,
           "--max-batch-size", "8", *extra]
    process = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        match = READY.search(log.read_text(errors="replace"))
        if match:
            return process, f"http://127.0.0.1:{match.group(1)}/v1"
        if process.poll() is not None:
            raise RuntimeError(f"oasr-server exited: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("oasr-server did not start")


def transcribe(files: list[Path], extra: list[str]) -> dict[str, str]:
    cmd = [sys.executable, "-m", "oasr.cli", "transcribe", "--json", "--no-progress", *extra,
           *map(str, files)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {Path(r["file"]).name: r["text"] for r in map(json.loads, out.splitlines())}


def http_text(client: openai.OpenAI, path: Path) -> str:
    with path.open("rb") as f:
        return client.audio.transcriptions.create(model="whisper-1", file=f).text


def realtime_text(client: openai.OpenAI, path: Path, manual: bool) -> str:
    pcm = realtime_pcm(path)
    texts: list[str] = []
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        conn.recv()
        conn.session.update(session={"type": "transcription", "audio": {"input": {
            "turn_detection": None if manual else {"type": "server_vad",
                                                   "silence_duration_ms": 500}}}})

        feeder = start_feeding(conn, pcm, manual)
        updates = started = committed = 0
        for event in conn:
            if event.type == "error":
                raise RuntimeError(f"{path.name}: {event.error.message}")
            updates += event.type == "session.updated"
            started += event.type == "input_audio_buffer.speech_started"
            committed += event.type == "input_audio_buffer.committed"
            if event.type.endswith("transcription.completed"):
                texts.append(event.transcript)
            if updates == 2 and len(texts) == max(started, committed):
                break
        feeder.join()
    return " ".join(t for t in texts if t)


def score(texts: dict[str, str], references: dict[str, str]) -> dict[str, Any]:
    counts = ErrorCounts()
    for name, ref in sorted(references.items()):
        counts.add(normalize_transcript(ref), normalize_transcript(texts[name]))
    return {"wer": round(counts.wer, 2), "cer": round(counts.cer, 2), "words": counts.words,
            "word_errors": counts.word_errors, "utterances": counts.utterances}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devset", type=Path, default=DEVSET_DIR)
    p.add_argument("--concurrency", type=int, default=4, help="files in flight per path")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("extra", nargs="*", help="engine flags for both the server and transcribe")
    args = p.parse_args(argv)
    references = {k: v.strip() for k, v in (
        line.split("\t", 1) for line in (args.devset / "manifest.tsv").read_text().splitlines()
        if "\t" in line) if k.startswith("real_")}
    files = [args.devset / name for name in sorted(references)]
    texts: dict[str, dict[str, str]] = {"transcribe": transcribe(files, args.extra)}
    log = Path(tempfile.mkdtemp()) / "server.log"
    process, base_url = start_server(args.extra, log)
    try:
        client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0)
        paths = {"http": lambda f: http_text(client, f),
                 "realtime_vad": lambda f: realtime_text(client, f, manual=False),
                 "realtime_manual": lambda f: realtime_text(client, f, manual=True)}
        for name, run in paths.items():
            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                texts[name] = dict(zip((f.name for f in files), pool.map(run, files),
                                       strict=True))
    finally:
        process.terminate()
        process.wait(30)
    rows = {name: score(t, references) for name, t in texts.items()}
    print(f"| path | WER % ({len(files)} real files) | CER % | word errors / words |")
    print("|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['wer']:.2f} | {r['cer']:.2f} | {r['word_errors']} / {r['words']} |")
    if args.out:
        args.out.write_text(json.dumps(
            {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "flags": args.extra, "paths": rows, "texts": texts}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
