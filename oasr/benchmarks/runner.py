"""``oasr bench``: every benchmark in one run on the same machine and model.

``--quick`` runs the four headline measurements small enough to finish in about a minute,
and the per-op profile of a 64-stream step; the full run adds every stream count, the dense
and unlimited-history curves, the per-component step profile, the frontends' cost, the
second pass and the server load. ``--json`` prints one JSON
object on stdout (tables and progress go to stderr). Both encoder families are measured the
same way; the family comes from the model (``--model``), or ``--family`` picks a bundled
architecture (the bundled checkpoint when it is of that family, else seeded random weights).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from oasr.benchmarks.compute import ComputeResult, measure_compute
from oasr.benchmarks.features import blas_threads, measure_frontends
from oasr.benchmarks.history import history_checkpoints, measure_history
from oasr.benchmarks.memory import check_steady_state, kv_bytes
from oasr.benchmarks.profile import profile_engine_step, profile_step_ops
from oasr.benchmarks.report import format_markdown, machine_description
from oasr.benchmarks.throughput import find_max_realtime_streams, measure_throughput
from oasr.benchmarks.workload import (
    FAMILY_CHOICES,
    BenchModel,
    default_audio_dir,
    load_bench_model,
)
from oasr.engine.config import CUDA_GRAPH_MODES, EngineConfig
from oasr.engine.families.dtypes import DTYPE_NAMES
from oasr.engine.process import configure_process, freeze_startup_objects

HEADLINE_STREAMS = 64
SPEED_DTYPES = DTYPE_NAMES  # auto, float32, float16, bfloat16, int8


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run.

    Attributes:
        quick: the headline numbers only, small.
        model: model directory; None = bundled model (or a seeded random one of its shape).
        family: ``conformer`` / ``whisper_ctc`` without ``model``: that family's bundled
            architecture; None = the bundled model's family.
        tiny_model: a tiny random model (tests of this machinery; numbers mean nothing).
        audio_dir: real speech (.wav); None = the shared dev set.
        device: auto | cpu | cuda[:N].
        dtype: the model dtype of the throughput and real-time measurements (an
            `EngineConfig.dtype` name; auto = float16 on CUDA, bfloat16 for Whisper-CTC on a CPU
            with native bfloat16, else float32). The other measurements keep auto.
        threads: torch intra-op threads; 0 leaves torch's default (one per core). One thread
            by default: both ways get the same compute, and on a shared machine more threads
            than free cores make every small op stall (the quick run took 3.6 minutes and
            swung every ratio with 2 threads on the loaded 2-core box, 27 s with 1).
        stream_counts: stream counts of the throughput comparison.
        steps: timed steps per throughput point (after ``warmup``).
        warmup: untimed steps first.
        checkpoints: chunk numbers of the per-chunk cost curves (must hold 10 and 200; a
            model with a position limit stops at its last full chunk, `history_checkpoints`).
        rounds: timed rounds per curve checkpoint.
        realtime_probes: most engine runs spent finding the real-time stream count.
        server_levels: websocket client counts (empty: no server load).
        server_seconds: audio each websocket client sends.
        cuda_graphs: the engine's ``cuda_graphs`` in the throughput and real-time runs
            (auto: on for CUDA).
        beam: the CTC beam of the engine's and the dense loop's decoding; None = the
            server's for the model (16 with its directory's LMs; greedy for a model without
            them, or random weights).
        second_pass: measure the Whisper second pass too (finals decoded together,
            `measure_finals_burst`; in the full run also one segment's stages); False for a
            server run with ``--second-pass none``.
    """

    quick: bool = False
    model: str | None = None
    family: str | None = None
    tiny_model: bool = False
    audio_dir: Path | None = None
    device: str = "auto"
    dtype: str = "auto"
    threads: int = 1
    stream_counts: tuple[int, ...] = (1, 8, 32, 64, 128)
    steps: int = 4
    warmup: int = 2
    checkpoints: tuple[int, ...] = (1, 10, 50, 100, 200)
    rounds: int = 15
    realtime_probes: int = 6
    server_levels: tuple[int, ...] = (16, 32, 64, 128)
    server_seconds: float = 8.0
    cuda_graphs: str = "auto"
    beam: int | None = None
    second_pass: bool = True

    def __post_init__(self) -> None:
        if not self.stream_counts or min(self.stream_counts) < 1:
            raise ValueError(f"stream_counts must be >= 1 each, got {self.stream_counts}")
        if 10 not in self.checkpoints or 200 not in self.checkpoints:
            raise ValueError(f"checkpoints must include 10 and 200, got {self.checkpoints}")
        for name in ("steps", "rounds", "realtime_probes"):
            if getattr(self, name) < 1:
                raise ValueError(f"BenchConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.dtype not in SPEED_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(SPEED_DTYPES)}, got {self.dtype!r}")
        if self.family is not None and self.family not in FAMILY_CHOICES:
            raise ValueError(f"family must be conformer or whisper_ctc, got {self.family!r}")
        if self.cuda_graphs not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graphs must be one of {', '.join(CUDA_GRAPH_MODES)}, "
                             f"got {self.cuda_graphs!r}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0 = torch's default), got {self.threads}")
        if self.beam is not None and self.beam < 1:
            raise ValueError(f"beam must be >= 1 (1 = greedy), got {self.beam}")
        if self.warmup < 1:
            raise ValueError(f"warmup must be >= 1 (the first step admits streams), got {self.warmup}")

    @staticmethod
    def quick_defaults(**overrides: Any) -> BenchConfig:
        """The ``--quick`` run: 64 streams, the left-4 paged curve, five real-time probes (two
        past the first bracket: the count to within about a tenth), no server."""
        base = dict(quick=True, stream_counts=(HEADLINE_STREAMS,), steps=2, warmup=1,
                    checkpoints=(10, 200), rounds=15, realtime_probes=5, server_levels=())
        base.update(overrides)
        return BenchConfig(**base)  # type: ignore[arg-type]


def resolved_dtype_name(config: BenchConfig, family_name: str) -> str:
    """What ``config.dtype`` runs the speed measurements in on this machine: "bfloat16",
    "float32 + int8 linears", ... (``auto`` depends on the device, family and CPU)."""
    engine = EngineConfig(device=config.device, dtype=config.dtype)
    device = engine.resolve_device()
    name = str(engine.resolve_dtype(device, family_name)).removeprefix("torch.")
    return name + (" + int8 linears" if engine.int8_linears else "")


def _record(obj: Any, *properties: str) -> dict[str, Any]:
    out = dataclasses.asdict(obj)
    out.update({name: getattr(obj, name) for name in properties})
    return out


def _log(message: str) -> None:
    print(f"[oasr bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_benchmarks(config: BenchConfig) -> dict[str, Any]:
    """Run every benchmark ``config`` asks for; returns the JSON-ready result.

    ``config.threads`` caps torch's intra-op pool and numpy's BLAS pool alike (the causal
    log-mel's filterbank matmul runs in numpy; the server subprocess gets the same cap
    through ``OMP_NUM_THREADS``).
    """
    configure_process(config.threads or None)
    with blas_threads(config.threads or None) as blas:
        return _run(config, blas)


def _run(config: BenchConfig, blas: int | None) -> dict[str, Any]:
    bench = load_bench_model(config.model, tiny=config.tiny_model, family=config.family,
                             beam=config.beam)
    freeze_startup_objects()  # as the server does once its engine is ready
    audio_dir = config.audio_dir or default_audio_dir()
    started = time.perf_counter()
    result: dict[str, Any] = {
        "model_source": bench.source,
        "family": bench.family_name,
        "machine": machine_description(torch.device(compute_device(config.device)))
        | {"blas_threads": blas},
        "started_utc": _utc_now(),
        "quick": config.quick,
        "dtype": config.dtype,
        "dtype_resolved": resolved_dtype_name(config, bench.family_name),
        "cuda_graphs": config.cuda_graphs,
        "decoding": _decoding(bench, config.device),
    }
    _log(f"model: {bench.source} ({bench.family_name})")
    result.update(_engine_benchmarks(config, bench, audio_dir))
    if config.second_pass:
        _log("second pass: finals decoded together, as the server decodes them")
        from oasr.benchmarks.second_pass import measure_finals_burst
        from oasr.engine.second_pass.worker import second_pass_threads

        result["finals_burst"] = measure_finals_burst(
            audio_dir, config.device,
            second_pass_threads(config.threads or torch.get_num_threads()))
        if not config.quick:
            _log("second pass: Whisper on a 5 s segment")
            from oasr.benchmarks.second_pass import measure_second_pass

            result["second_pass"] = measure_second_pass(audio_dir, config.device)
    result["server"] = []
    if config.server_levels:
        _log(f"server load: {config.server_levels} clients")
        from oasr.benchmarks.server_load import measure_server_load

        result["server"] = [_record(r, "meets_target") for r in measure_server_load(
            bench, audio_dir, list(config.server_levels), config.server_seconds, config.threads,
            config.model, config.dtype)]
    result["date_utc"] = _utc_now()
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    return result


def _engine_benchmarks(config: BenchConfig, bench: BenchModel, audio_dir: Path) -> dict[str, Any]:
    """Everything but the server load, with the headline numbers drawn from it."""
    # a copy for a non-default dtype: casting the shared model back would round its weights
    speed = bench if config.dtype == "auto" else dataclasses.replace(
        bench, model=copy.deepcopy(bench.model))
    rows = []
    for n in config.stream_counts:
        _log(f"throughput: {n} streams, engine vs dense loop ({config.dtype})")
        rows.append(measure_throughput(speed, audio_dir, n, config.warmup, config.steps,
                                       config.device, config.dtype, config.cuda_graphs))
    if not bench.family.paged_kv:
        return _slot_runtime_benchmarks(config, bench, audio_dir, rows)
    history = _history(config, bench, audio_dir)
    biggest = max(rows, key=lambda r: r.num_streams)
    estimate = max(1, int(biggest.engine_rate * 0.9))
    _log(f"real-time streams: search from {estimate}")
    max_rt, probes = find_max_realtime_streams(
        speed, audio_dir, estimate, warmup=2, steps=2 if config.quick else 3,
        max_probes=config.realtime_probes, device=config.device, dtype=config.dtype,
        cuda_graphs=config.cuda_graphs)
    _log(f"compute: batch {biggest.num_streams}")
    compute = measure_compute(speed, audio_dir, biggest.num_streams, 4, 5, config.device,
                              config.dtype)
    steady = check_steady_state(bench, audio_dir, min(16, biggest.num_streams),
                                device=config.device)
    n = min(HEADLINE_STREAMS, biggest.num_streams)
    _log(f"per-op profile: {n} streams ({config.dtype})")
    ops = profile_step_ops(speed, audio_dir, n, warmup=2, steps=2 if config.quick else 4,
                           device=config.device, dtype=config.dtype)
    profile = frontends = None
    if not config.quick:
        _log(f"profile: {n} streams")
        profile = profile_engine_step(bench, audio_dir, n, device=config.device)
        frontends = measure_frontends(audio_dir)
    headline_row = next((r for r in rows if r.num_streams == HEADLINE_STREAMS), biggest)
    ceiling = realtime_ceiling(compute, bench.chunk_seconds)
    return {
        "headline": {
            "speedup_batched_vs_sequential": headline_row.speedup,
            "speedup_num_streams": headline_row.num_streams,
            "max_realtime_streams": max_rt,
            **history.pop("headline"),
            "gflops_fraction_of_peak": compute.fraction_of_peak,
            "realtime_ceiling_streams": ceiling,
            "realtime_share_of_ceiling": max_rt / ceiling if ceiling else None,
            "gemm_share": ops.gemm_share,
        },
        "throughput": [_record(r, "speedup") for r in rows],
        **history,
        "realtime_probes": [_record(p, "is_realtime") for p in probes],
        "compute": _record(compute, "gflops", "fraction_of_peak"),
        "kv_bytes": _record(kv_bytes(bench, device=config.device)),
        "steady_state": _record(steady, "allocates_no_cache_tensors"),
        "profile": _record(ops) | {
            "components": _record(profile, "shares") if profile is not None else None},
        "frontends": _record(frontends, "log_mel_vs_fbank") if frontends is not None else None,
    }


def realtime_ceiling(compute: ComputeResult, chunk_seconds: float) -> int:
    """Streams a step running at the matmul peak would serve in real time: the peak's GFLOP
    per chunk of audio over one stream-chunk's GFLOP (the counted forward's, at its history).
    What ``max_realtime_streams`` is measured against (its share of this ceiling)."""
    per_stream_chunk = compute.gflop_per_step / compute.num_streams
    return int(compute.peak_gflops * chunk_seconds / per_stream_chunk)


def _slot_runtime_benchmarks(config: BenchConfig, bench: BenchModel, audio_dir: Path,
                             rows: list[Any]) -> dict[str, Any]:
    """A slot-runtime model (no paged K/V: the Zipformer): throughput against its one-stream
    loop and the real-time stream count. The paged sections (per-chunk cost as history grows,
    K/V bytes, the paged steady state, the FLOP count and profile of the paged step) do not
    apply: its per-stream state is fixed-size by construction, reported as state bytes."""
    biggest = max(rows, key=lambda r: r.num_streams)
    n = min(HEADLINE_STREAMS, biggest.num_streams)
    _log(f"per-op profile: {n} streams ({config.dtype})")
    ops = profile_step_ops(bench, audio_dir, n, warmup=2, steps=2 if config.quick else 4,
                           device=config.device, dtype=config.dtype)
    _log(f"real-time streams: search from {max(1, int(biggest.engine_rate * 0.9))}")
    max_rt, probes = find_max_realtime_streams(
        bench, audio_dir, max(1, int(biggest.engine_rate * 0.9)), warmup=2,
        steps=2 if config.quick else 3, max_probes=config.realtime_probes,
        device=config.device, dtype=config.dtype, cuda_graphs=config.cuda_graphs)
    headline_row = next((r for r in rows if r.num_streams == HEADLINE_STREAMS), biggest)
    specs = bench.model.state_specs()  # type: ignore[operator]
    state_bytes = sum(math.prod(s.shape) * (4 if s.dtype is None else s.dtype.itemsize)
                      for s in specs)
    return {
        "headline": {
            "speedup_batched_vs_sequential": headline_row.speedup,
            "speedup_num_streams": headline_row.num_streams,
            "max_realtime_streams": max_rt,
            "slot_state_bytes_per_stream_fp32": state_bytes,
            "num_state_tensors": len(specs),
            "gemm_share": ops.gemm_share,
        },
        "throughput": [_record(r, "speedup") for r in rows],
        "history": [],
        "realtime_probes": [_record(p, "is_realtime") for p in probes],
        "profile": _record(ops) | {"components": None},
        "not_applicable": "history, compute, kv_bytes, steady_state, the profile's components: "
                          "paged-pool measurements; this family keeps no paged K/V (slot "
                          "runtime)",
    }


def _history(config: BenchConfig, bench: BenchModel, audio_dir: Path) -> dict[str, Any]:
    """The per-chunk cost curves up to the last chunk the model allows, and their headline:
    paged left-4 cost at that chunk over chunk 10 (``..._chunk200_...`` only when it is 200)."""
    checkpoints = history_checkpoints(config.checkpoints, bench.max_chunks)
    late = max(checkpoints)
    variants = [("paged", 4)] if config.quick else [
        ("dense", -1), ("paged", -1), ("dense", 4), ("paged", 4)]
    limit = "" if late == max(config.checkpoints) else f" (the model's positions end at {late})"
    _log(f"per-chunk cost up to chunk {late}{limit}: {variants}")
    curves = measure_history(bench, audio_dir, variants, checkpoints, config.rounds,
                             device=config.device)
    left4 = next(c for c in curves if c.path == "paged" and c.num_left_chunks == 4)
    ratio = left4.ratio(late, 10)
    return {
        "headline": {
            "paged_cost_ratio_chunk200_vs_chunk10_left4": ratio if late == 200 else None,
            "paged_cost_ratio_late_vs_chunk10_left4": ratio,
            "history_late_chunk": late,
        },
        "history_late_chunk": late,
        "history": [_record(c, "ms") | {"ratio_late_vs_10": c.ratio(late, 10)} for c in curves],
    }


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _decoding(bench: BenchModel, device: str) -> dict[str, object]:
    """`BenchModel.decoding`, and for a prefix beam search which one runs: ``compiled`` (the
    CPU's, `oasr.decoding.compiled_search`) or the tensor search (CUDA)."""
    decoding = bench.decoding
    if decoding["search"] != "CTC prefix beam search":
        return decoding
    config = bench.with_decoding(EngineConfig()).decoder
    return decoding | {"compiled": config.runs_compiled_search(
        torch.device(compute_device(device)).type)}


def compute_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """``oasr bench``'s flags (on ``parser`` when given, e.g. a CLI subparser)."""
    p = parser or argparse.ArgumentParser(prog="oasr bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="headline numbers only (~1 minute)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--markdown", type=Path, default=None, help="also write the tables here")
    p.add_argument("--model", default=None, help="model dir; default: the bundled model")
    p.add_argument("--family", default=None, choices=("conformer", "whisper_ctc"),
                   help="without --model: this family's bundled architecture (the bundled "
                        "checkpoint when it is of this family, else seeded random weights); "
                        "default: the bundled model's family")
    p.add_argument("--tiny-model", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--audio-dir", type=Path, default=None, help="directory of speech .wav files")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", choices=SPEED_DTYPES,
                   help="model dtype of the throughput and real-time runs and the server "
                        "load (default auto: as oasr-server picks, float16 on CUDA, bfloat16 for "
                        "Whisper-CTC on a CPU with avx512_bf16 or amx_bf16, else float32; int8: "
                        "int8 encoder linears, float32 elsewhere)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1; 0 = torch's default)")
    p.add_argument("--streams", type=int, nargs="+", default=None,
                   help="stream counts of the throughput comparison")
    p.add_argument("--realtime-probes", type=int, default=None,
                   help="most engine runs spent finding the real-time stream count")
    p.add_argument("--server-clients", type=int, nargs="*", default=None,
                   help="websocket client counts (none: skip the server load)")
    p.add_argument("--server-seconds", type=float, default=None, help="audio per client")
    p.add_argument("--cuda-graphs", default="auto", choices=CUDA_GRAPH_MODES,
                   help="graph-captured steps in the throughput and real-time runs "
                        "(auto: on for CUDA)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps before each throughput point (graph captures land here)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per throughput point")
    p.add_argument("--beam-size", dest="beam", type=int, default=None, metavar="N",
                   help="CTC beam of the engine and the dense loop (1: greedy); default: "
                        "oasr-server's for the model (16 with the model directory's LMs)")
    p.add_argument("--second-pass", default="whisper", choices=("whisper", "none"),
                   help="whisper: also time the Whisper second pass as the server runs it (a "
                        "burst of finals decoded together; a few seconds); none: the "
                        "streaming pass alone, as oasr-server --second-pass none")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    overrides: dict[str, Any] = dict(model=args.model, family=args.family,
                                     tiny_model=args.tiny_model,
                                     audio_dir=args.audio_dir, device=args.device,
                                     dtype=args.dtype, threads=args.threads,
                                     cuda_graphs=args.cuda_graphs,
                                     second_pass=args.second_pass == "whisper")
    for name in ("warmup", "steps", "beam"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.streams:
        overrides["stream_counts"] = tuple(args.streams)
    if args.realtime_probes is not None:
        overrides["realtime_probes"] = args.realtime_probes
    if args.server_clients is not None:
        overrides["server_levels"] = tuple(args.server_clients)
    if args.server_seconds is not None:
        overrides["server_seconds"] = args.server_seconds
    if args.quick:
        return BenchConfig.quick_defaults(**overrides)
    return BenchConfig(**overrides)


def run_from_args(args: argparse.Namespace) -> int:
    """Run, print (JSON on stdout with ``--json``, else tables), write ``--out``/``--markdown``;
    a flag's value out of range is said in one line (exit status 2)."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"oasr bench: {exc}", file=sys.stderr)
        return 2
    result = run_benchmarks(config)
    tables = format_markdown(result)
    print(tables, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(tables + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
