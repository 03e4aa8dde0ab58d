"""The benchmark report: the headline JSON keys and markdown tables (docs/benchmarks.md)."""

from __future__ import annotations

import math
import os
import platform
from typing import Any

import torch


def machine_description(device: torch.device) -> dict[str, Any]:
    """Where the numbers came from: CPU model, cores, load, torch, threads, accelerator."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu, "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "device": str(device),
        "python": platform.python_version(),
    }
    if hasattr(os, "getloadavg"):
        info["load_average_1min_at_start"] = round(os.getloadavg()[0], 2)
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def _fmt(value: float, digits: int = 1) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:,.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def format_markdown(result: dict[str, Any]) -> str:
    """Markdown tables of every section present in ``result`` (as ``run_benchmarks`` builds)."""
    dtype = result.get("dtype", "auto")
    speed_dtype = "" if dtype == "auto" else f" (throughput and real-time runs in {dtype})"
    out = [f"Model: {result['model_source']}{speed_dtype}", ""]
    h = result["headline"]
    out += _table(["headline", "value", "target"], [
        [f"speedup batched vs sequential ({h['speedup_num_streams']} streams)",
         _fmt(h["speedup_batched_vs_sequential"], 2) + "x", ">= 10x"],
        ["max real-time streams (engine)", str(h["max_realtime_streams"]), ">= 200"],
        ["paged per-chunk cost, chunk 200 / chunk 10 (left 4)",
         _fmt(h["paged_cost_ratio_chunk200_vs_chunk10_left4"], 2), "<= 1.10"],
        ["encoder GFLOP/s / matmul peak", _fmt(h["gflops_fraction_of_peak"], 2), "-"],
    ])
    out += ["Throughput (audio seconds per wall second; one chunk of every stream per step):", ""]
    out += _table(["streams", "engine (batched paged)", "dense loop (one at a time)", "speedup",
                   "engine step ms", "dense step ms"],
                  [[str(r["num_streams"]), _fmt(r["engine_rate"]), _fmt(r["dense_rate"]),
                    _fmt(r["speedup"], 2) + "x", _fmt(r["engine_step_ms"]),
                    _fmt(r["dense_step_ms"])] for r in result["throughput"]])
    curves = result["history"]
    if curves:
        checkpoints = curves[0]["checkpoints"]
        out += ["Per-chunk model-call cost as history grows (ms, fastest of the rounds; the ratio"
                " is the median over rounds of chunk 200 / chunk 10 timed moments apart):", ""]
        out += _table(["path", "history", "streams", *[f"chunk {c}" for c in checkpoints],
                       "ratio 200/10"],
                      [[c["path"], "all" if c["num_left_chunks"] < 0 else
                        f"left {c['num_left_chunks']}", str(c["num_streams"]),
                        *[_fmt(v, 2) for v in c["ms"]], _fmt(c["ratio_200_vs_10"], 2)]
                       for c in curves])
    out += ["Real-time probes (engine step vs the 640 ms of audio it decodes):", ""]
    out += _table(["streams", "step ms", "real-time"],
                  [[str(p["num_streams"]), _fmt(p["step_ms"]), "yes" if p["is_realtime"] else "no"]
                   for p in result["realtime_probes"]])
    c = result["compute"]
    out += _table(["compute", "value"], [
        ["batch (streams)", str(c["num_streams"])],
        ["GFLOP per batched chunk forward", _fmt(c["gflop_per_step"], 2)],
        ["forward ms", _fmt(c["step_ms"])], ["achieved GFLOP/s", _fmt(c["gflops"])],
        [f"matmul peak GFLOP/s ({c['matmul_size']}^3)", _fmt(c["peak_gflops"])],
        ["fraction of peak", _fmt(c["fraction_of_peak"], 2)]])
    out += _memory_tables(result)
    if result.get("profile"):
        prof = result["profile"]
        labels = {"features": "streaming fbank", "model_forward": "batched model call",
                  "conv_stem": "model call / conv2d stem", "attention":
                  "model call / attention (with position bias)", "paged_attention":
                  "model call / attention / paged_attention", "decode": "CTC decode",
                  "rest": "everything else (scheduling, bookkeeping, stats)"}
        out += [f"Where an engine step's time goes ({prof['num_streams']} streams, cProfile "
                f"over {prof['steps']} steps):", ""]
        out += _table(["part", "ms per step", "share of step"],
                      [[label, _fmt(prof["ms"][key]), f"{100 * prof['shares'][key]:.0f}%"]
                       for key, label in labels.items()]
                      + [["whole step", _fmt(prof["ms"]["step"]), "100%"]])
    if result.get("second_pass"):
        out += second_pass_table(result["second_pass"])
    if result.get("server"):
        out += ["Server: real-time websocket clients on 127.0.0.1 (separate load process):", ""]
        out += _table(["clients", "partial p50 ms", "partial p95 ms", "final p50 ms",
                       "final p95 ms", "partials (unmatched)", "clients with errors"],
                      [[str(r["num_clients"]), _fmt(r["partial_p50_ms"]),
                        _fmt(r["partial_p95_ms"]), _fmt(r["final_p50_ms"]),
                        _fmt(r["final_p95_ms"]), f"{r['num_partials']} ({r['num_unmatched']})",
                        str(r["num_errors"])] for r in result["server"]])
    return "\n".join(out)


def second_pass_table(sp: dict[str, Any]) -> list[str]:
    """The Whisper second pass's stage times for one segment."""
    out = ["Second pass (Whisper tiny.en, greedy, one 5 s real-speech segment, median):", ""]
    return out + _table(["stage", "seconds"], [
        ["log-mel frontend", _fmt(sp["frontend_s"], 3)],
        ["encoder (30 s window)", _fmt(sp["encoder_s"], 3)],
        [f"decoder ({sp['num_tokens']} tokens)", _fmt(sp["decoder_s"], 3)],
        ["total", _fmt(sp["total_s"], 3)],
        ["real-time factor", _fmt(sp["real_time_factor"], 3)]])


def _memory_tables(result: dict[str, Any]) -> list[str]:
    kv, steady = result["kv_bytes"], result["steady_state"]
    rows = [
        ["dtype", kv["dtype"]],
        ["K+V bytes per encoder frame (2 x layers x heads x head_dim x elem)",
         f"{kv['bytes_per_frame']:,}"],
        ["bytes per block (formula / real allocation)",
         f"{kv['bytes_per_block']:,} / {kv['allocator_bytes_per_block']:,}"],
        [f"bytes per stream, left {kv['num_left_chunks']} (window + in-flight block)",
         f"{kv['bytes_per_stream_left']:,}"],
        ["bytes per stream per minute, unlimited history", f"{kv['bytes_per_stream_minute']:,}"],
        ["dense path: new att_cache bytes allocated every chunk (same window)",
         f"{kv['dense_new_cache_bytes_per_chunk']:,}"],
        [f"steady state ({steady['num_streams']} streams, left {steady['num_left_chunks']}, "
         f"{steady['steps']} steps): same cache storage", str(steady["same_storage"])],
        ["used blocks after each step", ", ".join(map(str, steady["used_blocks"]))],
        ["tensor storages created and kept by those steps (bytes), decoder states aside",
         f"{steady['new_storages']} ({steady['new_storage_bytes']:,})"],
        ["CTC decoder-state storages new after those steps (bytes; one persistent storage)",
         f"{steady['decoder_state_new_bytes']:,}"],
        ["K/V and conv caches allocate nothing in steady state",
         str(steady["allocates_no_cache_tensors"])],
    ]
    return _table(["memory", "value"], rows)
