"""Server-level load: a real ``oasr-server`` on 127.0.0.1 and a separate load-generator
process with N real-time websocket clients; partial latency p50/p95, final latency, errors.

Everything is bounded: the server is started once per benchmark run and stopped (by its own
pid) when the run ends, whatever happens; each load run sends a fixed amount of audio and is
cut at a deadline.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from oasr.benchmarks.workload import BenchModel, load_speech
from oasr.engine import EngineConfig
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.engine import ASREngine
from oasr.engine.events import Partial, StreamEvent
from oasr.engine.runner.streams import StreamResources
from oasr.models import save_model


@dataclass(frozen=True)
class ServerLoadRow:
    """One load level.

    Attributes:
        num_clients: concurrent real-time websocket clients.
        partial_p50_ms, partial_p95_ms: latency of matched partials.
        final_p50_ms, final_p95_ms: "end" sent -> "done" received.
        num_partials: partials received; num_unmatched: of those, not matched to a chunk.
        num_errors: clients with any error (error message, bad close, no done, deadline).
        error_samples: up to three error strings.
    """

    num_clients: int
    partial_p50_ms: float
    partial_p95_ms: float
    final_p50_ms: float
    final_p95_ms: float
    num_partials: int
    num_unmatched: int
    num_errors: int
    error_samples: tuple[str, ...]

    @property
    def meets_target(self) -> bool:
        return self.num_errors == 0 and self.partial_p95_ms <= 1000.0


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def expected_partials(bench: BenchModel, audio_dir: Path, num_streams: int,
                      seconds: float, config: EngineConfig) -> list[list[tuple[str, int]]]:
    """Each stream's partials as the server will emit them, with the samples each needed.

    One offline engine run with every stream's whole audio, the server's endpoint and chunk
    settings; a partial after ``n`` decoded encoder frames needed
    ``bench.samples_for_frames(n)``.
    """
    resources = StreamResources.build(config, bench.model)
    engine = ASREngine(config, resources)
    timelines: list[list[tuple[str, int]]] = [[] for _ in range(num_streams)]

    def sink_for(stream: int):  # noqa: ANN202 - a closure per stream
        def sink(event: StreamEvent) -> None:
            if isinstance(event, Partial):
                frames = engine.requests[stream].num_frames_decoded
                timelines[stream].append((event.text, bench.samples_for_frames(frames)))
        return sink

    for stream, audio in enumerate(load_speech(audio_dir, num_streams, seconds)):
        engine.submit(OpenStream(stream, sink_for(stream)))
        engine.submit(AppendAudio(stream, audio))
        engine.submit(EndStream(stream))
    while True:
        engine.step()
        if not engine.requests:
            return timelines


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_server(model_dir: Path | None, max_streams: int, max_num_blocks: int,
                   log_path: Path, threads: int | None, dtype: str = "auto",
                   beam: int | None = None) -> Iterator[str]:
    """``oasr-server`` on 127.0.0.1 in a child process (``beam``: its ``--beam-size``, None
    for its default); yields its host:port; stops it."""
    flags = ["--max-connections", str(max_streams + 8), "--max-batch-size", str(max_streams),
             "--max-num-blocks", str(max_num_blocks), "--idle-timeout", "30",
             "--num-left-chunks", "-1",  # unlimited history, as the EngineConfig reference run
             "--second-pass", "none",  # the streaming path under test; no Whisper re-decode
             "--dtype", dtype]
    if beam is not None:
        flags += ["--beam-size", str(beam)]
    if model_dir is not None:
        flags += ["--model", str(model_dir)]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with server_process(flags, log_path, env) as address:
        yield address


@contextlib.contextmanager
def server_process(flags: Sequence[str], log_path: Path,
                   env: dict[str, str] | None = None) -> Iterator[str]:
    """``oasr-server`` with ``flags`` on a free 127.0.0.1 port in a child process (its output
    in ``log_path``); yields host:port once ``/readyz`` answers 200; stops it at the end."""
    port = _free_port()
    cmd = [sys.executable, "-c", "import sys; from backend.cli import server_main; "
           "sys.exit(server_main(sys.argv[1:]))", "--host", "127.0.0.1", "--port", str(port),
           *flags]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=env if env is not None else dict(os.environ))
        try:
            address = f"127.0.0.1:{port}"
            _wait_ready(address, proc, log_path)
            yield address
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _wait_ready(address: str, proc: subprocess.Popen, log_path: Path,
                timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"oasr-server exited with {proc.returncode}: "
                               f"{log_path.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://{address}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"oasr-server not ready after {timeout_s:.0f} s: "
                       f"{log_path.read_text(errors='replace')[-2000:]}")


def run_load_level(address: str, num_clients: int, audio_dir: Path, seconds: float,
                   expected: list[list[tuple[str, int]]], workdir: Path) -> ServerLoadRow:
    """One load-generator process with ``num_clients`` clients; its numbers aggregated."""
    spec = {"url": f"ws://{address}/ws/asr", "num_clients": num_clients,
            "audio_dir": str(audio_dir), "seconds": seconds, "deadline_s": seconds + 45.0,
            "expected": expected[:num_clients]}
    spec_path, out_path = workdir / f"spec{num_clients}.json", workdir / f"out{num_clients}.json"
    spec_path.write_text(json.dumps(spec))
    subprocess.run([sys.executable, "-m", "oasr.benchmarks.loadgen", str(spec_path),
                    str(out_path)], check=True, timeout=seconds + 90.0)
    clients = json.loads(out_path.read_text())["clients"]
    partials = [x for c in clients for x in c["partial_latencies"]]
    finals = [c["final_latency"] for c in clients if c["final_latency"] is not None]
    errors = [e for c in clients for e in c["errors"]]
    return ServerLoadRow(
        num_clients, 1e3 * percentile(partials, 0.5), 1e3 * percentile(partials, 0.95),
        1e3 * percentile(finals, 0.5), 1e3 * percentile(finals, 0.95),
        sum(c["num_partials"] for c in clients), sum(c["num_unmatched"] for c in clients),
        sum(1 for c in clients if c["errors"]), tuple(errors[:3]))


def save_bench_model(bench: BenchModel, out_dir: Path) -> Path:
    """Write the benchmark's model where ``oasr-server --model`` loads it, weights exact
    (float32), so the server runs the very model the expected partials come from, with the
    LMs of the directory it came from (the server decodes as the bench does)."""
    if bench.family_name == "whisper_ctc":
        from oasr.models.whisper_ctc import save_whisper_ctc

        saved = save_whisper_ctc(bench.model, out_dir, dtype=torch.float32)  # type: ignore[arg-type]
    else:
        saved = save_model(bench.model, out_dir)  # type: ignore[arg-type]
    if bench.model_dir is not None:
        for lm_file in sorted(bench.model_dir.glob("*_lm.*")):  # char_lm.*, word_lm.*
            shutil.copyfile(lm_file, Path(saved) / lm_file.name)
    return saved


def measure_server_load(bench: BenchModel, audio_dir: Path, levels: list[int],
                        seconds: float, threads: int | None,
                        model_path: str | None = None, dtype: str = "auto") -> list[ServerLoadRow]:
    """Start one server sized for the largest level, run each level, stop the server; both
    it and the expected partials run the model in ``dtype`` (an `EngineConfig.dtype` name)."""
    top = max(levels)
    chunks = math.ceil(seconds / bench.chunk_seconds) + 4
    with tempfile.TemporaryDirectory(prefix="oasr-bench-") as tmp:
        workdir = Path(tmp)
        # the server loads exactly the model the expected partials come from
        model_dir = (Path(model_path) if model_path
                     else save_bench_model(bench, workdir / "model"))
        config = EngineConfig(dtype=dtype, max_batch_size=top, max_num_blocks=top * chunks,
                              max_wait_time_s=math.inf, idle_timeout_s=math.inf,
                              max_session_s=math.inf, max_pending_audio_s=math.inf)
        # the expected partials decode as the server will (the bench's beam and LMs)
        expected = expected_partials(bench, audio_dir, top, seconds, bench.with_decoding(config))
        with running_server(model_dir, top, top * chunks, workdir / "server.log",
                            threads, dtype, bench.beam) as address:
            return [run_load_level(address, n, audio_dir, seconds, expected, workdir)
                    for n in levels]
