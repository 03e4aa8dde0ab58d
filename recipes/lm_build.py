"""LMs for the Whisper-CTC model (a char n-gram and a word lexicon LM): build, dump, tune, report.

Stages (``python -m recipes.lm_build STAGE``):

- ``build``: count the LM text (``<data>/text/train.txt``, the acoustic training sentences;
  optionally WordNet glosses / lemmas), drop every sentence sharing a 6-word sequence with test
  material (`recipes.lm_text`), smooth, prune and write ``char_lm.safetensors`` + ``char_lm.json``.
- ``words``: the word LM (`oasr.lm.word`): a lexicon (the LM text's words + wordfreq's top
  English words) with a mixed unigram and the LM text's word bigrams, written as ``word_lm.txt``
  + ``word_lm.safetensors`` + ``word_lm.json`` (with the tuned fusion weights, `WORD_SETTINGS`).
- ``package``: a model dir (the bundled model's files + both LMs) that ``--lm auto`` loads.
- ``dump``: chunk-32 streaming log-probs of a checkpoint on the test sets (heldout_sentences,
  heldout_voices, devset tts / real), saved once so tuning never reruns the encoder.
- ``tune``: WER / CER over a grid of `FusionSettings` on the dumped ``heldout_sentences``
  log-probs (the only set used for choosing settings).
- ``report``: greedy / beam / beam + char LM / beam + char + word LM on every set.
- ``cost``: one engine decode step of 64 streams x 32 frames, every setup in turns.

The shipped LMs (``<data>/lm/words_v1``, 9.5 MB), built by
``build --order 7 --min-context-count 10 --glosses`` (186,738 states, 7.3 MB) and
``words --bigram-min-count 1`` (57,791 words, 140,950 trie states, 135,022 bigrams, 2.6 MB);
tuned on heldout_sentences only: lm_weight 0.5, unit bonus 2.0, word weight 0.5, OOV penalty
2.0. Default model (top-2, step 4,114) log-probs ``<data>/lm/logprobs_top2.pt``; WER (CER):

| set | greedy | beam 8 | + char LM (bundled) | + char + word LM | beam 16 + char LM | beam 16 + char + word |
|---|---|---|---|---|---|---|
| heldout_sentences (300) | 61.9 (19.4) | 60.3 (18.6) | 30.3 (11.3) | 27.3 (10.7) | 28.9 (10.8) | 25.8 (9.9) |
| heldout_voices (200) | 72.0 (25.3) | 71.6 (24.5) | 42.0 (16.8) | 42.8 (17.1) | 39.5 (15.9) | 39.2 (15.5) |
| devset tts (12) | 47.2 (14.5) | 48.1 (13.9) | 19.8 (7.1) | 16.0 (6.2) | 15.1 (5.4) | 16.0 (6.4) |
| devset real (16) | 79.1 (30.7) | 77.1 (29.4) | 45.1 (20.3) | 43.8 (21.5) | 46.4 (21.2) | 45.1 (20.8) |

Choices (heldout_sentences, beam 8; about 150 settings in all): the word LM alone as a lexicon
(weight 0) or unigram gained ~1 point over the char LM at weight 1.0; lowering the char weight
to 0.5 while the word LM carries 0.5 gained ~3 (27.1-27.5 over a broad plateau); WordNet glosses
in the char LM text 0.3-1 point (30.0 char-only); a 138k-word lexicon with the SCOWL list, a
per-unit OOV penalty, a blank penalty or a word bonus changed nothing beyond noise (+-0.5).
Decode cost (64 streams x 32 frames, one thread, idle-ish machine): beam 8 + char LM ~23 ms,
+ word LM ~31 ms. The earlier char-only choices: Kneser-Ney over Witten-Bell, order 7, contexts
seen >= 5 (10 with glosses), 1-byte quantisation (<= 0.7 WER points).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from recipes.lm_text import WordLmConfig
from recipes.paths import DATA_ROOT

if TYPE_CHECKING:
    from oasr.decoding import GpuDecoderConfig

LM_DIR = DATA_ROOT / "lm"
TRAIN_TEXT = DATA_ROOT / "text/train.txt"
SETS = ("heldout_sentences", "heldout_voices", "devset_tts", "devset_real")


def dump_log_probs(ckpt: Path, out: Path, heldout_limit: int = 1000,
                   feats: Path | None = None) -> None:
    """Save {set: [(name, (T, V) float32 log-probs, reference)]} of chunk-32 streaming; the
    held-out splits' features come from ``feats`` (default ``<data>/wctc/feats``)."""
    from recipes.whisper_ctc.evaluate import DEVSET, chunked_rows, load_for_eval, test_sets
    from recipes.whisper_ctc.train import DATA

    model, state = load_for_eval(ckpt)
    sets = test_sets(DEVSET, feats if feats is not None else DATA / "feats", heldout_limit)
    dumped: dict[str, list] = {}
    for name, utts in sets.items():
        dumped[name] = chunked_rows(model, utts)
        print(f"{name}: {len(dumped[name])} utterances", flush=True)
    torch.save({"ckpt": str(ckpt), "step": state.get("step"), "sets": dumped}, out)


def read_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def wordnet_lemmas(wordnet_dir: Path = Path("/usr/share/wordnet")) -> list[str]:
    """WordNet's lemmas (index.noun/verb/adj/adv), lowercase letters and apostrophes only,
    underscores as spaces; one per line."""
    import re

    keep = re.compile(r"^[a-z' ]+$")
    lemmas = set()
    for pos in ("noun", "verb", "adj", "adv"):
        for line in (wordnet_dir / f"index.{pos}").read_text(encoding="latin-1").splitlines():
            if line and not line.startswith(" "):
                lemma = line.split(" ", 1)[0].replace("_", " ")
                if keep.match(lemma):
                    lemmas.add(lemma)
    return sorted(lemmas)


def lm_sentences(text: Path = TRAIN_TEXT, with_lemmas: bool = False,
                 with_glosses: bool = False) -> tuple[list[str], str]:
    """The LM text (``text`` + optional WordNet lemmas and glosses) with every sentence that
    overlaps test material removed (`recipes.lm_text.ExclusionFilter`), and its provenance."""
    from recipes.lm_text import ExclusionFilter, forbidden_texts, wordnet_glosses

    texts = read_lines(text)
    source = f"{text.name}: {len(texts)} WordNet example sentences"
    if with_glosses:
        glosses = wordnet_glosses()
        texts += glosses
        source += f" + {len(glosses)} WordNet glosses"
    if with_lemmas:
        lemmas = wordnet_lemmas()
        texts += lemmas
        source += f" + {len(lemmas)} WordNet lemmas"
    texts, dropped = ExclusionFilter.from_texts(forbidden_texts()).filter(texts)
    source += (f" (WordNet 3.0 licence, Princeton University); {dropped} sentences sharing a "
               "6-word sequence with test transcripts removed")
    return texts, source


def build(order: int, min_context_count: int, smoothing: str, with_lemmas: bool,
          out: Path, text: Path = TRAIN_TEXT, with_glosses: bool = False) -> Path:
    """Build the char LM from ``text`` (+ WordNet lemmas / glosses) and write it to ``out``."""
    from oasr.lm import LmBuildConfig, build_char_lm, encode_sentences
    from oasr.models.bundled import BUNDLED_UNITS

    texts, source = lm_sentences(text, with_lemmas, with_glosses)
    config = LmBuildConfig(order=order, smoothing=smoothing, min_context_count=min_context_count,
                           text=source)
    lm = build_char_lm(encode_sentences(texts, BUNDLED_UNITS), BUNDLED_UNITS, config)
    path = lm.save(out)
    print(f"{path}: order {order}, {lm.num_states} states, {path.stat().st_size / 1e6:.2f} MB")
    return path


def build_words(config: WordLmConfig, out: Path, text: Path = TRAIN_TEXT,
                with_glosses: bool = False) -> Path:
    """Build the word LM (lexicon unigram + optional bigrams) and write it to ``out``."""
    from oasr.models.bundled import BUNDLED_UNITS
    from recipes.lm_text import build_word_lm

    texts, source = lm_sentences(text, False, with_glosses)
    lm = build_word_lm(BUNDLED_UNITS, texts, config)
    header = dataclasses.replace(lm.header, text=f"{lm.header.text}; LM text: {source}",
                                 fusion=tuple(sorted(WORD_SETTINGS.header_fusion().items())))
    lm = type(lm)(header, lm.words, lm.log_probs, lm.bigrams)
    path = lm.save(out)
    size = sum(f.stat().st_size for f in out.glob("word_lm.*")) / 1e6
    print(f"{path}: {len(lm.words)} words, {lm.num_states} trie states, "
          f"{0 if lm.bigrams is None else len(lm.bigrams.prev)} bigrams, {size:.2f} MB")
    return path


@dataclass(frozen=True)
class FusionSettings:
    """The fusion knobs of a decode (see `GpuDecoderConfig`)."""

    lm_weight: float = 1.0
    unit_bonus: float = 2.0
    word_bonus: float = 0.0
    word_weight: float = 0.0
    oov_penalty: float = 0.0
    blank_penalty: float = 0.0

    def header_fusion(self) -> dict[str, float]:
        """The weights a word LM header carries (`WordLmHeader.fusion`), which a decoder whose
        config leaves them None uses."""
        return {"lm_weight": self.lm_weight, "lm_unit_bonus": self.unit_bonus,
                "word_lm_weight": self.word_weight, "word_oov_penalty": self.oov_penalty}

    def decoder_config(self, beam: int) -> GpuDecoderConfig:
        from oasr.decoding import GpuDecoderConfig

        return GpuDecoderConfig(beam_size=beam, lm_weight=self.lm_weight,
                                lm_unit_bonus=self.unit_bonus, lm_word_bonus=self.word_bonus,
                                word_lm_weight=self.word_weight,
                                word_oov_penalty=self.oov_penalty,
                                blank_penalty=self.blank_penalty)


# Tuned on heldout_sentences (see the module docstring): the char LM alone, and char + word.
CHAR_SETTINGS = FusionSettings(lm_weight=1.0, unit_bonus=2.0)
WORD_SETTINGS = FusionSettings(lm_weight=0.5, unit_bonus=2.0, word_weight=0.5, oov_penalty=2.0)


def decode_set(rows: list, beam: int, lm: object | None = None, lm_weight: float = 0.0,
               unit_bonus: float = 0.0, word_bonus: float = 0.0,
               settings: FusionSettings | None = None) -> tuple[float, float]:
    """(WER, CER) of one dumped set: greedy (beam 1) or beam search, with an optional LM
    (`CharNgramLm` or `DecoderLm`); all utterances in one batched decoder call. ``settings``
    replaces the three weights when given."""
    from oasr.decoding import GpuStreamingDecoder
    from oasr.models.bundled import BUNDLED_UNITS
    from oasr.text.tokenizer import CharTokenizer
    from oasr.text.wer import ErrorCounts

    if settings is None:
        settings = FusionSettings(lm_weight, unit_bonus, word_bonus)
    decoder = GpuStreamingDecoder(settings.decoder_config(beam),
                                  CharTokenizer.from_units(list(BUNDLED_UNITS)),
                                  device="cpu", lm=lm if beam > 1 else None)  # type: ignore[arg-type]
    lengths = torch.tensor([len(lp) for _, lp, _ in rows])
    padded = torch.nn.utils.rnn.pad_sequence([lp for _, lp, _ in rows], batch_first=True)
    state = decoder.create_state(len(rows), padded.shape[-1])
    decoder.decode_chunk(padded, state, lengths)
    counts = ErrorCounts()
    for b, (_, _, ref) in enumerate(rows):
        counts.add(ref, decoder.finalize_stream(state, b)[0].text)
    return counts.wer, counts.cer


def measure_cost(rows: list, lm: object, num_streams: int = 64, chunk: int = 32,
                 num_steps: int = 8, rounds: int = 5, beams: tuple[int, ...] = (4, 8, 16),
                 word_lm: object | None = None) -> dict[str, float]:
    """Median milliseconds of one engine decode step (``decode_streams`` + ``partials``) of
    ``num_streams`` pooled streams x ``chunk`` frames: greedy, each beam, each beam + LM
    (and each beam + ``word_lm``, a `DecoderLm` with a word LM, at `WORD_SETTINGS`).

    Configurations take turns within each round, so a busy machine slows them alike.
    """
    import statistics

    from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder
    from oasr.models.bundled import BUNDLED_UNITS
    from oasr.text.tokenizer import CharTokenizer

    frames = chunk * num_steps
    long_rows = [lp for _, lp, _ in rows if len(lp) >= frames][:num_streams]
    if len(long_rows) < num_streams:
        long_rows += [lp.repeat(-(-frames // len(lp)), 1) for _, lp, _ in rows]
    log_probs = torch.stack([lp[:frames] for lp in long_rows[:num_streams]])  # (B, T, V)
    tokenizer = CharTokenizer.from_units(list(BUNDLED_UNITS))
    setups: dict[str, tuple[GpuDecoderConfig, object]] = {
        "greedy": (GpuDecoderConfig(beam_size=1), None)}
    for beam in beams:
        setups[f"beam{beam}"] = (GpuDecoderConfig(beam_size=beam), None)
        setups[f"beam{beam}+lm"] = (CHAR_SETTINGS.decoder_config(beam), lm)
        if word_lm is not None:
            setups[f"beam{beam}+lm+words"] = (WORD_SETTINGS.decoder_config(beam), word_lm)
    times: dict[str, list[float]] = {name: [] for name in setups}
    for _ in range(rounds):
        for name, (config, model) in setups.items():
            decoder = GpuStreamingDecoder(config, tokenizer, device="cpu",
                                          lm=model)  # type: ignore[arg-type]
            states = [decoder.create_state(1, log_probs.shape[-1]) for _ in range(num_streams)]
            for step in range(num_steps):
                start = time.perf_counter()
                decoder.decode_streams(log_probs[:, step * chunk:(step + 1) * chunk], states)
                decoder.partials(states)
                times[name].append((time.perf_counter() - start) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def tune(dump: Path, lm_dir: Path, beams: tuple[int, ...], grid: dict[str, tuple[float, ...]],
         samples: int = 0, seed: int = 0) -> list[dict]:
    """WER / CER of every beam x combination of ``grid`` (`FusionSettings` field -> values)
    on heldout_sentences only (``samples`` > 0: that many random combinations), best first."""
    import itertools
    import random

    from oasr.lm import load_decoder_lm

    rows = torch.load(dump, weights_only=False)["sets"]["heldout_sentences"]
    lm = load_decoder_lm(lm_dir)
    names = list(grid)
    combos = list(itertools.product(beams, *(grid[n] for n in names)))
    if samples:
        combos = random.Random(seed).sample(combos, min(samples, len(combos)))
    results = []
    for beam, *values in combos:
        settings = FusionSettings(**dict(zip(names, values, strict=True)))
        wer, cer = decode_set(rows, int(beam), lm, settings=settings)
        results.append({"beam": int(beam), **dataclasses.asdict(settings), "wer": wer, "cer": cer})
        print(json.dumps(results[-1]), flush=True)
    return sorted(results, key=lambda r: (r["wer"], r["cer"]))


def report(dump: Path, char_dir: Path, lm_dir: Path, beam: int,
           settings: FusionSettings) -> str:
    """Markdown table: greedy / beam / beam + char LM (``char_dir`` at `CHAR_SETTINGS`) /
    beam + char + word LM (``lm_dir`` at ``settings``) WER (CER) on every dumped set."""
    from oasr.lm import load_char_lm, load_decoder_lm

    payload = torch.load(dump, weights_only=False)
    char, both = load_char_lm(char_dir), load_decoder_lm(lm_dir)
    lines = [f"checkpoint {payload['ckpt']} step {payload['step']}, chunk 32 streaming; char "
             f"LM {char_dir} at {CHAR_SETTINGS}; char + word LM {lm_dir} at {settings}", "",
             f"| set | utts | greedy | beam {beam} | beam {beam} + char LM | beam {beam} + "
             "char + word LM |", "|---|---|---|---|---|---|"]
    for name in SETS:
        rows = payload["sets"][name]
        cells = [decode_set(rows, 1), decode_set(rows, beam),
                 decode_set(rows, beam, char, settings=CHAR_SETTINGS),
                 decode_set(rows, beam, both, settings=settings)]
        text = " | ".join(f"{wer:.1f} ({cer:.1f})" for wer, cer in cells)
        lines.append(f"| {name} | {len(rows)} | {text} |")
    return "\n".join(lines)


def package(lm_dir: Path, out: Path, model_dir: Path | None = None) -> Path:
    """A model directory the engine loads with ``--lm auto``: the model's files (the bundled
    model by default) + the char and word LM files of ``lm_dir``."""
    from oasr.models.checkpoint import DEFAULT_MODEL_DIR

    source = DEFAULT_MODEL_DIR if model_dir is None else model_dir
    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and not item.name.startswith(("char_lm.", "word_lm.")):
            shutil.copy(item, out / item.name)
    for item in sorted(lm_dir.glob("char_lm.*")) + sorted(lm_dir.glob("word_lm.*")):
        shutil.copy(item, out / item.name)
    return out


def floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def settings_from(args: argparse.Namespace) -> FusionSettings:
    return FusionSettings(*(float(getattr(args, f.name)) for f in dataclasses.fields(FusionSettings)))


def add_settings_arguments(p: argparse.ArgumentParser) -> None:
    """The fusion knobs (comma lists for tune); defaults: `WORD_SETTINGS`."""
    for f in dataclasses.fields(FusionSettings):
        p.add_argument(f"--{f.name.replace('_', '-')}", default=str(getattr(WORD_SETTINGS, f.name)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    b = sub.add_parser("build", help="build the char LM from the training text")
    b.add_argument("--order", type=int, default=6)
    b.add_argument("--min-context-count", type=int, default=2)
    b.add_argument("--smoothing", default="kneser_ney", choices=("kneser_ney", "witten_bell"))
    b.add_argument("--lemmas", action="store_true", help="add WordNet lemmas to the text")
    b.add_argument("--glosses", action="store_true", help="add WordNet glosses to the text")
    b.add_argument("--out", type=Path, default=LM_DIR / "char_lm")
    b.add_argument("--text", type=Path, default=TRAIN_TEXT, help="training sentences")
    w = sub.add_parser("words", help="build the word LM (lexicon unigram + bigrams)")
    for f in dataclasses.fields(WordLmConfig):
        w.add_argument(f"--{f.name.replace('_', '-')}", default=f.default,
                       type=(lambda x: x.lower() in ("1", "true", "yes")) if f.type == "bool"
                       else type(f.default))
    w.add_argument("--glosses", action="store_true", help="add WordNet glosses to the text")
    w.add_argument("--out", type=Path, default=LM_DIR / "char_lm")
    w.add_argument("--text", type=Path, default=TRAIN_TEXT, help="training sentences")
    d = sub.add_parser("dump", help="chunk-32 log-probs of a checkpoint on the test sets")
    d.add_argument("--ckpt", type=Path, required=True, help="a copy of a training .pt")
    d.add_argument("--out", type=Path, default=LM_DIR / "logprobs.pt")
    d.add_argument("--feats", type=Path, default=None,
                   help="held-out features dir (default <data>/wctc/feats)")
    k = sub.add_parser("package", help="a model dir with the LM files (--lm auto loads them)")
    k.add_argument("--lm", type=Path, required=True)
    k.add_argument("--out", type=Path, required=True)
    for name in ("tune", "report", "cost"):
        p = sub.add_parser(name)
        p.add_argument("--dump", type=Path, default=LM_DIR / "logprobs.pt")
        p.add_argument("--lm", type=Path, default=LM_DIR / "char_lm")
        p.add_argument("--char-lm", type=Path, default=LM_DIR / "char_lm")
        p.add_argument("--beam", default="8")
        p.add_argument("--samples", type=int, default=0)
        add_settings_arguments(p)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.time()
    if args.stage == "build":
        build(args.order, args.min_context_count, args.smoothing, args.lemmas, args.out,
              text=args.text, with_glosses=args.glosses)
    elif args.stage == "words":
        config = WordLmConfig(**{f.name: getattr(args, f.name)
                                 for f in dataclasses.fields(WordLmConfig)})
        build_words(config, args.out, text=args.text, with_glosses=args.glosses)
    elif args.stage == "dump":
        dump_log_probs(args.ckpt, args.out, feats=args.feats)
    elif args.stage == "package":
        print(package(args.lm, args.out))
    elif args.stage == "tune":
        grid = {f.name: floats(getattr(args, f.name)) for f in dataclasses.fields(FusionSettings)}
        best = tune(args.dump, args.lm, tuple(int(x) for x in args.beam.split(",")), grid,
                    args.samples)
        print("best:", json.dumps(best[:5], indent=1))
    elif args.stage == "report":
        print(report(args.dump, args.char_lm, args.lm, int(args.beam), settings_from(args)))
    else:
        from oasr.lm import load_char_lm, load_decoder_lm

        sets = torch.load(args.dump, weights_only=False)["sets"]
        costs = measure_cost(sets["heldout_sentences"] + sets["heldout_voices"],
                             load_char_lm(args.char_lm), word_lm=load_decoder_lm(args.lm))
        for name, ms in costs.items():
            print(f"{name}: {ms:.1f} ms per step of 64 streams x 32 frames, "
                  f"{ms / costs['greedy']:.1f}x greedy")
    print(f"{args.stage}: {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
