"""Milliseconds per engine decode step: greedy and beam 8 / 16 / 32, each without an LM, with
the char LM and with the char + word LM, for N pooled streams x one chunk of frames.

A step is what the engine does per chunk: ``decode_streams`` of N batch-1 states plus
``partials`` (one read-back and the texts; its share is printed too, and grows with the
transcripts: more ``--steps``). Log-probs come from a dump (``python -m recipes.lm_build
dump``: ``{"sets": {name: [(utt, (T, V) log-probs, reference)]}}``) or, without one, from the
bundled model run over the devset wavs (chunk-causal at its trained chunk), so a clean checkout
can run it. Configurations take turns within each round, so a busy machine slows them alike;
each prints the median over rounds x steps.

    nice -n 10 python bench/decode_cost.py [--dump logprobs.pt] [--beams 8 16 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from oasr.benchmarks.workload import DEVSET_DIR
from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder
from oasr.lm import DecoderLm, has_decoder_lm, load_decoder_lm
from oasr.models.bundled import BUNDLED_UNITS
from oasr.models.checkpoint import DEFAULT_MODEL_DIR
from oasr.text.tokenizer import CharTokenizer

Setup = tuple[GpuDecoderConfig, DecoderLm | None]


def dump_log_probs(path: Path) -> list[torch.Tensor]:
    """Every utterance's (T, V) log-probs of a dump, all sets in order."""
    sets = torch.load(path, weights_only=False)["sets"]
    return [lp.float() for rows in sets.values() for _, lp, _ in rows]


@torch.no_grad()
def devset_log_probs(devset: Path = DEVSET_DIR, model_dir: Path = DEFAULT_MODEL_DIR) -> list[torch.Tensor]:
    """(T, V) log-probs of every devset wav from the model in ``model_dir`` (a Whisper-CTC
    model, run chunk-causally at its trained chunk)."""
    from oasr.audio import read_audio
    from oasr.models import load_model
    from oasr.models.whisper_ctc import WhisperCtcModel, causal_log_mel

    model = load_model(model_dir)
    if not isinstance(model, WhisperCtcModel):
        raise ValueError(f"{model_dir} is not a Whisper-CTC model: pass --dump instead")
    rows = []
    for wav in sorted(devset.glob("*.wav")):
        mel = torch.from_numpy(causal_log_mel(read_audio(wav)))[None]  # (1, T, n_mels)
        log_probs, lengths = model(mel, torch.tensor([mel.shape[1]]), model.config.chunk_frames)
        rows.append(log_probs[0, : int(lengths[0])].float())
    return rows


def stream_batch(rows: list[torch.Tensor], num_streams: int, frames: int) -> torch.Tensor:
    """(num_streams, frames, V): the utterances at least ``frames`` long first, then shorter
    ones repeated to that length."""
    if not rows:
        raise ValueError("no utterances to benchmark")
    picked = [lp for lp in rows if len(lp) >= frames]
    picked += [lp.repeat(-(-frames // len(lp)), 1) for lp in rows if len(lp) < frames]
    while len(picked) < num_streams:
        picked += picked
    return torch.stack([lp[:frames] for lp in picked[:num_streams]])


SEARCHES = {"compiled": True, "tensor": False}  # name -> DecoderConfig.compiled_search


def setups(beams: list[int], lm: DecoderLm | None, searches: list[str] | None = None,
           top_k: int | None = None) -> dict[str, Setup]:
    """Greedy, then per beam and search (``searches``, `SEARCHES`' names; default the
    compiled one): no LM, the char LM alone (fusion fallbacks), char + word LM (the word LM
    file's tuned weights); LM setups only when ``lm`` has that LM. ``top_k``: the tokens a
    frame (None: the exact bound)."""
    out: dict[str, Setup] = {"greedy": (GpuDecoderConfig(beam_size=1), None)}
    searches = searches or ["compiled"]
    for beam in beams:
        for search in searches:
            config = GpuDecoderConfig(beam_size=beam, top_k=top_k,
                                      compiled_search=SEARCHES[search])
            tag = "" if len(searches) == 1 else f" {search}"
            out[f"beam{beam}{tag}"] = (config, None)
            if lm is not None and lm.char is not None:
                out[f"beam{beam}+lm{tag}"] = (config, DecoderLm(char=lm.char))
            if lm is not None and lm.word is not None:
                out[f"beam{beam}+lm+words{tag}"] = (config, lm)
    return out


class StepTimer:
    """One decoder per setup, built once; `run` times ``num_steps`` engine steps of fresh
    streams (milliseconds each)."""

    def __init__(self, setups: dict[str, Setup], units: list[str], device: str) -> None:
        tokenizer = CharTokenizer.from_units(units)
        self.decoders = {name: GpuStreamingDecoder(config, tokenizer, device=device, lm=lm)
                         for name, (config, lm) in setups.items()}
        self.device = torch.device(device)

    @torch.inference_mode()  # as the engine's step decodes
    def run(self, name: str, log_probs: torch.Tensor, chunk: int) -> list[tuple[float, float]]:
        """Milliseconds of each step of ``log_probs`` (B, steps * chunk, V) with setup
        ``name``: (whole step, its ``partials``)."""
        decoder = self.decoders[name]
        batch, frames, vocab = log_probs.shape
        states = [decoder.create_state(1, vocab) for _ in range(batch)]
        times = []
        for start in range(0, frames - chunk + 1, chunk):
            piece = log_probs[:, start:start + chunk].to(self.device)
            began = time.perf_counter()
            decoder.decode_streams(piece, states)
            decoded = time.perf_counter()
            decoder.partials(states)
            ended = time.perf_counter()
            times.append(((ended - began) * 1000, (ended - decoded) * 1000))
        return times


def measure(timer: StepTimer, log_probs: torch.Tensor, chunk: int,
            rounds: int) -> dict[str, tuple[float, float]]:
    """Median ms per step and of its ``partials``, for every setup, setups taking turns
    within each round."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in timer.decoders}
    for _ in range(rounds):
        for name in times:
            times[name] += timer.run(name, log_probs, chunk)
    return {name: (statistics.median(t[0] for t in values),
                   statistics.median(t[1] for t in values)) for name, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump", type=Path, default=None, help="dumped log-probs (default: run "
                   "the bundled model over the devset wavs)")
    p.add_argument("--lm", type=Path, default=DEFAULT_MODEL_DIR, help="dir holding the LMs")
    p.add_argument("--beams", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--searches", nargs="+", choices=list(SEARCHES), default=["compiled"],
                   help="the beam searches to time, taking turns (compiled: the CPU default)")
    p.add_argument("--top-k", type=int, default=None,
                   help="tokens a frame may extend a prefix by (default: the exact 2 x beam + 1)")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--chunk", type=int, default=32, help="encoder frames per step")
    p.add_argument("--steps", type=int, default=8, help="steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = dump_log_probs(args.dump) if args.dump else devset_log_probs()
    log_probs = stream_batch(rows, args.streams, args.chunk * args.steps)
    lm = load_decoder_lm(args.lm) if has_decoder_lm(args.lm) else None
    units = list(lm.units) if lm is not None else list(BUNDLED_UNITS)
    timer = StepTimer(setups(args.beams, lm, args.searches, args.top_k), units, args.device)
    costs = measure(timer, log_probs, args.chunk, args.rounds)
    print(f"{args.streams} streams x {args.chunk} frames per step, {args.rounds} rounds x "
          f"{args.steps} steps, {args.threads} thread(s), {args.device}")
    greedy = costs["greedy"][0]
    for name, (ms, partials) in costs.items():
        print(f"{name:>27}: {ms:7.1f} ms per step ({ms / greedy:5.1f}x greedy), "
              f"partials {partials:5.2f} ms")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "ms_per_step": {k: v[0] for k, v in costs.items()},
                                         "partials_ms": {k: v[1] for k, v in costs.items()}},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
