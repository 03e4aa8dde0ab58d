"""The benchmark report: the headline JSON keys and markdown tables (docs/benchmarks.md)."""

from __future__ import annotations

import math
import os
import platform
from typing import Any

import torch

from oasr import cpu


def machine_description(device: torch.device) -> dict[str, Any]:
    """Where the numbers came from: CPU model and features (`oasr.cpu.describe`), cores, load,
    torch, threads, accelerator."""
    info: dict[str, Any] = {
        **cpu.describe(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
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
    resolved = result.get("dtype_resolved", dtype)
    speed_dtype = (f" (throughput, real-time and server runs: dtype {dtype} = {resolved})"
                   if dtype != "auto" or resolved != "float32" else "")
    family = result.get("family", "conformer_ctc")
    out = [f"Model: {result['model_source']} [{family}]{speed_dtype}"]
    decoding = result.get("decoding")
    if decoding is not None:
        lms = "" if decoding["lms"] == "none" else f" with the {decoding['lms']} LMs"
        width = ""
        if decoding["beam"] > 1:
            width = f", beam {decoding['beam']}"
            if "tokens_per_frame" in decoding:
                width += f" ({decoding['tokens_per_frame']} tokens a frame)"
            if "compiled" in decoding:
                width += ", compiled" if decoding["compiled"] else ", tensor search"
        out.append(f"Decoding (engine and dense loop): {decoding['search']}{width}{lms}")
    machine = result.get("machine")
    if machine is not None:
        out.append(f"Machine: {machine['cpu_count']} vCPU {cpu.summary(machine)}, torch "
                   f"{machine['torch']}, {machine['torch_threads']} intra-op thread(s)")
    out.append("")
    h = result["headline"]
    if "not_applicable" in result:
        burst = finals_burst_table(result["finals_burst"]) if result.get("finals_burst") else []
        return "\n".join(out + _slot_runtime_tables(result) + burst)
    late = h.get("history_late_chunk", 200)
    left4 = h.get("paged_cost_ratio_late_vs_chunk10_left4",
                  h.get("paged_cost_ratio_chunk200_vs_chunk10_left4"))
    limit = "" if late == 200 else f"; the model's positions end at chunk {late}"
    out += _table(["headline", "value", "target"], [
        [f"speedup batched vs sequential ({h['speedup_num_streams']} streams)",
         _fmt(h["speedup_batched_vs_sequential"], 2) + "x", ">= 10x"],
        ["max real-time streams (engine)", str(h["max_realtime_streams"]), ">= 200"],
        [f"paged per-chunk cost, chunk {late} / chunk 10 (left 4{limit})", _fmt(left4, 2),
         "<= 1.10 (at chunk 200)"],
        ["encoder GFLOP/s / matmul peak", _fmt(h["gflops_fraction_of_peak"], 2), ">= 0.50"],
        *([["real-time streams / compute ceiling "
            f"({h['max_realtime_streams']} / {h['realtime_ceiling_streams']:,})",
            _fmt(h["realtime_share_of_ceiling"], 2), ">= 0.45"]]
          if h.get("realtime_share_of_ceiling") is not None else []),
        *([["matrix multiplies' share of the step's op time", _fmt(h["gemm_share"], 2),
            ">= 0.60"]] if h.get("gemm_share") is not None else []),
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
        late = max(checkpoints)
        out += ["Per-chunk model-call cost as history grows (ms, fastest of the rounds; the ratio"
                f" is the median over rounds of chunk {late} / chunk 10 timed moments apart):", ""]
        out += _table(["path", "history", "streams", *[f"chunk {c}" for c in checkpoints],
                       f"ratio {late}/10"],
                      [[c["path"], "all" if c["num_left_chunks"] < 0 else
                        f"left {c['num_left_chunks']}", str(c["num_streams"]),
                        *[_fmt(v, 2) for v in c["ms"]],
                        _fmt(c.get("ratio_late_vs_10", c.get("ratio_200_vs_10")), 2)]
                       for c in curves])
    out += ["Real-time probes (engine step vs the 640 ms of audio it decodes):", ""]
    out += _table(["streams", "step ms", "real-time"],
                  [[str(p["num_streams"]), _fmt(p["step_ms"]), "yes" if p["is_realtime"] else "no"]
                   for p in result["realtime_probes"]])
    out += _compute_table(result["compute"])
    out += _memory_tables(result)
    prof = result.get("profile")
    if prof and prof.get("ops"):
        out += ops_table(prof)
    components = prof.get("components", prof if "ms" in prof else None) if prof else None
    if components:
        out += _profile_table(components, family)
    if result.get("frontends"):
        out += frontends_table(result["frontends"])
    if result.get("finals_burst"):
        out += finals_burst_table(result["finals_burst"])
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


def _compute_table(c: dict[str, Any]) -> list[str]:
    rows = [["batch (streams)", str(c["num_streams"])],
            ["GFLOP per batched chunk forward (counted)", _fmt(c["gflop_per_step"], 2)]]
    if c.get("formula_gflop_per_step") is not None:
        rows += [["GFLOP per batched chunk forward (formula)",
                  _fmt(c["formula_gflop_per_step"], 2)],
                 ["GFLOP per stream-chunk (formula)",
                  _fmt(c["formula_gflop_per_step"] / c["num_streams"], 3)]]
    rows += [["forward ms", _fmt(c["step_ms"])], ["achieved GFLOP/s", _fmt(c["gflops"])],
             [f"matmul peak GFLOP/s ({c['matmul_size']}^3)", _fmt(c["peak_gflops"])],
             ["fraction of peak", _fmt(c["fraction_of_peak"], 2)]]
    return _table(["compute", "value"], rows)


PROFILE_LABELS = {
    "conformer_ctc": {"features": "features (streaming fbank + windows)",
                      "frontend": "features / kaldi fbank", "model_forward": "batched model call",
                      "conv_stem": "model call / conv2d stem",
                      "attention": "model call / attention (with position bias)",
                      "paged_attention": "model call / attention / paged_attention"},
    "whisper_ctc": {"features": "features (causal log-mel + windows)",
                    "frontend": "features / causal log-mel", "model_forward": "batched model call",
                    "conv_stem": "model call / causal conv stem",
                    "attention": "model call / encoder blocks (attention + FFN)",
                    "paged_attention": "model call / blocks / paged_attention"},
}


def ops_table(prof: dict[str, Any]) -> list[str]:
    """The per-op profile: each top op's share of the step's op CPU time."""
    out = [f"Where a {prof['num_streams']}-stream step's time goes, by torch op "
           f"({prof['dtype']}, torch.profiler over {prof['steps']} steps; ops "
           f"{_fmt(prof['ops_ms'])} of {_fmt(prof['step_ms'])} ms per step, "
           f"matrix multiplies {100 * prof['gemm_share']:.0f}% of the ops', fused attention "
           f"{100 * prof.get('attention_share', 0.0):.0f}%):", ""]
    return out + _table(["op", "share", "ms per step", "calls per step"],
                        [[f"`{op['name']}`", f"{100 * op['share']:.1f}%",
                          _fmt(op["ms_per_step"], 2), _fmt(op["calls_per_step"], 0)]
                         for op in prof["ops"]])


def _profile_table(prof: dict[str, Any], family: str) -> list[str]:
    labels = PROFILE_LABELS.get(family, PROFILE_LABELS["conformer_ctc"]) | {
        "decode": "CTC decode", "rest": "everything else (scheduling, bookkeeping, stats)"}
    out = [f"Where an engine step's time goes ({prof['num_streams']} streams, cProfile "
           f"over {prof['steps']} steps):", ""]
    return out + _table(["part", "ms per step", "share of step"],
                        [[label, _fmt(prof["ms"][key]), f"{100 * prof['shares'][key]:.0f}%"]
                         for key, label in labels.items() if key in prof["ms"]]
                        + [["whole step", _fmt(prof["ms"]["step"]), "100%"]])


def frontends_table(fc: dict[str, Any]) -> list[str]:
    """Both frontends' ms per stream-chunk (640 ms of audio)."""
    out = [f"Frontends, ms per stream-chunk of 640 ms (median of {fc['num_streams']} streams x "
           f"{fc['num_chunks']} chunks, interleaved):", ""]
    rows = [["kaldi fbank (Conformer-CTC), stream by stream", _fmt(fc["fbank_ms"], 2),
             str(fc["fbank_frames"])],
            ["causal log-mel (Whisper-CTC), one stream alone", _fmt(fc["log_mel_ms"], 2),
             str(fc["log_mel_frames"])]]
    if "log_mel_batched_ms" in fc:  # runs before the batched log-mel lack it
        rows.append([f"causal log-mel (Whisper-CTC), {fc['num_streams']} streams in one call",
                     _fmt(fc["log_mel_batched_ms"], 2), str(fc["log_mel_frames"])])
    rows.append(["log-mel as the engine feeds it / fbank", _fmt(fc["log_mel_vs_fbank"], 2) + "x",
                 ""])
    return out + _table(["frontend", "ms per stream-chunk", "frames"], rows)


def _second_pass_rows(sp: dict[str, Any], name: str) -> list[list[str]]:
    window = sp.get("encoder_window_s", sp.get("encoder_frames", 3000) * 0.01)
    return [[f"{name}: log-mel frontend", _fmt(sp["frontend_s"], 3)],
            [f"{name}: encoder ({window:g} s window, {sp.get('encoder_frames', 3000)} mel frames)",
             _fmt(sp["encoder_s"], 3)],
            [f"{name}: decoder ({sp['num_tokens']} tokens)", _fmt(sp["decoder_s"], 3)],
            [f"{name}: total", _fmt(sp["total_s"], 3)],
            [f"{name}: real-time factor", _fmt(sp["real_time_factor"], 3)]]


def finals_burst_table(burst: dict[str, Any]) -> list[str]:
    """Finals decoded together by one second-pass process, beam-searched (an idle server's)
    and greedy (a busy one's): seconds per burst and audio seconds cleared per second."""
    out = [f"Finals decoded together by the second pass (Whisper tiny.en, the server's "
           f"settings): {burst['segments']} segments of {burst['segment_s']:g} s submitted at "
           f"once to one second-pass process ({burst['threads']} thread(s), "
           f"{burst['dtype'].removeprefix('torch.')}); a server runs --second-pass-processes "
           "of them (two on two cores or more). The real-time streams above are the streaming "
           "pass's alone.", ""]
    rows = [[name, _fmt(burst[key]["seconds"], 3), _fmt(burst[key]["audio_s_per_s"], 1)]
            for key, name in (("beam", "beam 5 (an idle server)"),
                              ("greedy", "greedy, own windows (a busy server)"))]
    return out + _table(["decoding", "seconds", "audio s per s"], rows)


def second_pass_table(sp: dict[str, Any]) -> list[str]:
    """The Whisper second pass's stage times for one segment: the encoder on the segment's
    window (the default) and, when measured, on the whole 30 s window."""
    out = ["Second pass (Whisper tiny.en, greedy, one 5 s real-speech segment, median):", ""]
    rows = _second_pass_rows(sp, "segment window")
    if sp.get("full_window"):
        rows += _second_pass_rows(sp["full_window"], "30 s window")
    return out + _table(["stage", "seconds"], rows)


def _slot_runtime_tables(result: dict[str, Any]) -> list[str]:
    """A slot-runtime model's report: headline, throughput, real-time probes."""
    h = result["headline"]
    out = _table(["headline", "value"], [
        [f"speedup batched vs one stream at a time ({h['speedup_num_streams']} streams)",
         _fmt(h["speedup_batched_vs_sequential"], 2) + "x"],
        ["max real-time streams (engine)", str(h["max_realtime_streams"])],
        [f"slot state per stream ({h['num_state_tensors']} tensors, float32)",
         f"{h['slot_state_bytes_per_stream_fp32']:,} bytes"],
    ])
    out += ["Throughput (audio seconds per wall second; one chunk of every stream per step):", ""]
    out += _table(["streams", "engine (batched slots)", "one stream at a time", "speedup",
                   "engine step ms", "one-at-a-time step ms"],
                  [[str(r["num_streams"]), _fmt(r["engine_rate"]), _fmt(r["dense_rate"]),
                    _fmt(r["speedup"], 2) + "x", _fmt(r["engine_step_ms"]),
                    _fmt(r["dense_step_ms"])] for r in result["throughput"]])
    out += ["Real-time probes (engine step vs the audio of one chunk):", ""]
    out += _table(["streams", "step ms", "real-time"],
                  [[str(p["num_streams"]), _fmt(p["step_ms"]), "yes" if p["is_realtime"] else "no"]
                   for p in result["realtime_probes"]])
    if result.get("profile"):
        out += ops_table(result["profile"])
    return out + [f"Not measured: {result['not_applicable']}.", ""]


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
        [f"bytes per stream, {kv['history_seconds']:g} s of unlimited history",
         f"{kv['bytes_per_stream_history']:,}"],
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
