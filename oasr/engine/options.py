"""The engine's command-line options: the flags every command that builds an engine takes
(``oasr transcribe``, ``oasr-server``), and the `EngineConfig` they make.

A flag's default is the value its field has in the command's base config (`command_engine_config`
for the commands, ``ServerConfig().engine`` for ``oasr-server``), so every default is written
once, in a dataclass; a flag left out leaves that field as the base has it. Two defaults depend
on the model and are resolved from it: the CTC beam (`default_beam_size`) and, for an icefall
Zipformer, the attention history (`default_num_left_chunks`).

``--help`` shows the flags marked ``common``; ``--help-all`` shows every flag, grouped.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from oasr.decoding.endpoint import EndpointConfig
from oasr.engine.config import CUDA_GRAPH_MODES, EngineConfig
from oasr.engine.live.quiet_tail import QuietTail
from oasr.engine.live.refine import RefineConfig
from oasr.models.whisper.logits import LOGITS_BACKENDS
from oasr.models.whisper.transcriber import DECODE_DTYPES
from oasr.models.whisper.window import WINDOW_MODES, EncoderWindow

# The CTC prefix beam's width when a char LM is fused and no --beam-size is given (greedy
# decoding without an LM); docs/model.md has the accuracy per beam width.
DEFAULT_LM_BEAM_SIZE = 16

# The commands' attention history, in chunks (8 x 640 ms = 5.1 s of K/V per stream; older
# blocks are evicted, so a chunk's cost stays flat however long a segment runs). EngineConfig
# itself keeps -1 (all history).
DEFAULT_NUM_LEFT_CHUNKS = 8

# oasr transcribe's --final-context, in seconds: offline nothing waits on a final, so every
# segment is decoded after its predecessor's text.
OFFLINE_FINAL_CONTEXT_S = 10.0


def command_engine_config(**changes: Any) -> EngineConfig:
    """The engine ``oasr transcribe`` and ``oasr-server`` build when no flag is given:
    `EngineConfig`'s defaults with the Whisper second pass on and `DEFAULT_NUM_LEFT_CHUNKS`
    chunks of attention history, plus ``changes``."""
    return EngineConfig(**{"second_pass": "whisper",
                           "num_left_chunks": DEFAULT_NUM_LEFT_CHUNKS, **changes})


def field_reader(dotted: str) -> Callable[[Any], Any]:
    """Reads a (nested) field of a config: ``field_reader("decoder.lm_weight")(config)``."""
    def read(config: Any) -> Any:
        for name in dotted.split("."):
            config = getattr(config, name)
        return config
    return read


@dataclass(frozen=True, eq=False)
class Flag:
    """One command-line flag.

    Attributes:
        flag: the option string.
        help: what it sets and in what unit (the default is appended from ``read``).
        group: the ``--help-all`` section it is listed in.
        read: the flag's value in a config (its default is ``read(base)``); None: the flag
            has no single field (``default`` says what happens without it).
        common: listed by ``--help`` (else only by ``--help-all``).
        none: what a field's None means, shown as the default.
        default: the default's text when it is not just the field's value (it depends on the
            model, or on other flags); ``{}`` in it stands for the field's value.
        kwargs: argparse's (type, choices, metavar, action).
    """

    flag: str
    help: str
    group: str
    read: Callable[[Any], Any] | None = None
    common: bool = False
    none: str = "none"
    default: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def default_text(self, base: Any) -> str:
        """The default as ``--help`` and docs/configuration.md show it."""
        if self.read is None:
            return self.default or ""
        value = format_value(self.read(base), self.none)
        return value if self.default is None else self.default.format(value)


def format_value(value: object, none: str = "none") -> str:
    """A default as people write it: on/off, 0.25, 64, none."""
    if value is None:
        return none
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list):
        return ", ".join(map(str, value)) or none
    return str(value)


OFF = "off"


def _seconds_or_off(value: str) -> float | str:
    """A flag's value in seconds (>= 0), or `OFF`."""
    if value == OFF:
        return OFF
    seconds = float(value)
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds or 'off', got {value}")
    return seconds


def _refine_interval(config: EngineConfig) -> float:
    return config.refine.interval_s if config.refine is not None else 0.0


def _refine(name: str) -> Callable[[EngineConfig], Any]:
    def read(config: EngineConfig) -> Any:
        return getattr(config.refine if config.refine is not None else RefineConfig(), name)
    return read


MODEL = "model and compute"
STREAMS = "streams and K/V pool"
DECODING = "CTC decoding and language models"
ENDPOINTS = "endpoints (where a segment ends)"
SECOND_PASS = "second pass (Whisper finals)"
LIVE_TEXT = "live text (partials and finals of live streams)"
ENGINE_GROUPS = (MODEL, STREAMS, DECODING, ENDPOINTS, SECOND_PASS, LIVE_TEXT)

ENGINE_FLAGS: tuple[Flag, ...] = (
    # -- model and compute
    Flag("--model", "model directory: oasr's format (Conformer-CTC or Whisper-CTC), a WeNet "
         "experiment dir, or an icefall Zipformer experiment dir", MODEL, field_reader("model"),
         common=True, none="the bundled model", kwargs={"metavar": "DIR"}),
    Flag("--device", "auto (CUDA when present, else CPU) | cpu | cuda | cuda:N", MODEL,
         field_reader("device"), common=True),
    Flag("--dtype", "the encoder's arithmetic: auto | float32 | float16 | bfloat16 | int8 "
         "(int8 encoder linears, float32 elsewhere). auto: float16 on CUDA; on CPU bfloat16 "
         "for Whisper-CTC where the CPU has native bfloat16 (avx512_bf16 or amx_bf16), else "
         "float32", MODEL, field_reader("dtype"), common=True),
    Flag("--threads", "torch CPU threads of the engine process (the second pass takes half)",
         MODEL, field_reader("num_threads"), common=True,
         none="torch's default, a thread per core; 1 on a machine of two cores or fewer whose "
              "second pass runs in processes of its own (oasr-server's)",
         kwargs={"type": int, "metavar": "N"}),
    Flag("--cuda-graphs", "capture the encoder step as one CUDA graph per batch width and "
         "replay it: on | off | auto (on for a CUDA device, off on CPU)", MODEL,
         field_reader("cuda_graphs"), kwargs={"choices": CUDA_GRAPH_MODES}),
    # -- streams and K/V pool
    Flag("--max-batch-size", "stream slots: streams decoded at once; more streams wait for a "
         "free slot or are refused 'busy'", STREAMS, field_reader("max_batch_size"),
         common=True, kwargs={"type": int, "metavar": "N"}),
    Flag("--chunk-size", "encoder frames per chunk, the step's unit of audio (Conformer: 40 ms "
         "frames, Whisper-CTC: 20 ms frames)", STREAMS, field_reader("chunk_size"), common=True,
         none="the model's trained chunk, 640 ms", kwargs={"type": int, "metavar": "FRAMES"}),
    Flag("--num-left-chunks", "attention history per stream, in chunks; older K/V blocks are "
         "evicted; -1 keeps all (until the segment ends)", STREAMS, field_reader("num_left_chunks"),
         common=True, default="{}; an icefall Zipformer: its own left context", kwargs={"type": int, "metavar": "N"}),
    Flag("--max-num-blocks", "K/V pool size in blocks (one block holds one chunk of one "
         "stream's K/V)", STREAMS, field_reader("max_num_blocks"),
         none="every slot's window (max-batch-size x (num-left-chunks + 1)), or with -1 "
         "history a share of free memory", kwargs={"type": int, "metavar": "N"}),
    Flag("--prefill-kv-window", "give each stream its whole --num-left-chunks window, zeroed, "
         "at admission (for models trained with a fixed attention window)", STREAMS,
         field_reader("prefill_kv_window"), kwargs={"action": "store_true"}),
    Flag("--streaming-cohort-admit", "admit waiting streams shortest audio first (within "
         "--max-wait) instead of oldest first", STREAMS, field_reader("streaming_cohort_admit"),
         kwargs={"action": "store_true"}),
    # -- CTC decoding
    Flag("--beam-size", "CTC decoding: 1 = greedy, N > 1 = prefix beam search of width N "
         "(needed for an LM)", DECODING, field_reader("decoder.beam_size"), common=True,
         default=f"{DEFAULT_LM_BEAM_SIZE} when a char LM is used (see --lm), else 1",
         kwargs={"type": int, "metavar": "N"}),
    Flag("--ctc-top-k", "CTC prefix beam search: the tokens per frame that may extend a "
         "prefix, the frame's N most likely; 2 x the beam width + 1 or more searches every "
         "extension that can enter the beam (without LMs: the exact beam)", DECODING,
         field_reader("decoder.top_k"), default="the beam width",
         kwargs={"type": int, "metavar": "N"}),
    Flag("--compiled-ctc-search", "CTC prefix beam search on a CPU: compiled machine code "
         "searching stream by stream (numba); --no-compiled-ctc-search runs the batched tensor "
         "search (the reference, and what CUDA runs)", DECODING,
         field_reader("decoder.compiled_search"),
         kwargs={"action": argparse.BooleanOptionalAction}),
    Flag("--lm", "LMs fused into the beam search: auto (the model dir's char_lm.* and, when "
         "present, word_lm.*), none, or a directory holding char_lm.safetensors + char_lm.json "
         "(+ word_lm.txt + word_lm.json)", DECODING, field_reader("lm"), common=True,
         kwargs={"metavar": "auto|none|DIR"}),
    Flag("--lm-weight", "weight of the char LM's log-probability in the beam's score",
         DECODING, field_reader("decoder.lm_weight"), none="the value in the LM's char_lm.json",
         kwargs={"type": float, "metavar": "X"}),
    Flag("--lm-unit-bonus", "score added per emitted unit (character) when an LM is used",
         DECODING, field_reader("decoder.lm_unit_bonus"), none="the value in the LM's char_lm.json",
         kwargs={"type": float, "metavar": "X"}),
    Flag("--lm-word-bonus", "score added per word boundary when an LM is used", DECODING,
         field_reader("decoder.lm_word_bonus"), none="the value in the LM's char_lm.json",
         kwargs={"type": float, "metavar": "X"}),
    Flag("--lm-word-weight", "weight of the word LM's log-probability (with word_lm.*)",
         DECODING, field_reader("decoder.word_lm_weight"), none="the value in the LM's word_lm.json",
         kwargs={"type": float, "metavar": "X"}),
    Flag("--lm-oov-penalty", "score subtracted per word outside the word LM's lexicon",
         DECODING, field_reader("decoder.word_oov_penalty"),
         none="the value in the LM's word_lm.json", kwargs={"type": float, "metavar": "X"}),
    # -- endpoints
    Flag("--endpoint-pause", "switch to sentence-pause endpointing: a pause (CTC blank "
         "frames) this many seconds long after 3 or more words ends a segment; 0.8 when only "
         "--max-segment is given", ENDPOINTS,
         default="off, WeNet's rules: a segment ends after 1 s of silence after speech",
         kwargs={"type": float, "metavar": "S"}),
    Flag("--max-segment", "switch to sentence-pause endpointing with this longest segment, in "
         "seconds (15 when only --endpoint-pause is given); a segment that reaches it ends at "
         "the quietest point of its last 3 s", ENDPOINTS,
         default="off, WeNet's rules: 20 s, cut the same way",
         kwargs={"type": float, "metavar": "S"}),
    Flag("--endpoint-between-chunks", "count the quiet audio after a stream's last chunk as "
         "the endpoint's silence, so a segment ends when its silence is there rather than at "
         "the next chunk (only while at most --light-load-streams streams are live)",
         ENDPOINTS, lambda c: c.endpoint_quiet is not None,
         kwargs={"action": argparse.BooleanOptionalAction}),
    # -- second pass
    Flag("--second-pass", "whisper: each finished segment is decoded again by Whisper tiny.en "
         "and its text is the final (and refines the partials); none: finals are the CTC text",
         SECOND_PASS, field_reader("second_pass"), common=True,
         kwargs={"choices": ("whisper", "none")}),
    Flag("--second-pass-process", "run the second pass in processes of their own, at a lower "
         "CPU priority (--second-pass-nice), instead of on a thread of the engine's process",
         SECOND_PASS, field_reader("second_pass_process"),
         kwargs={"action": argparse.BooleanOptionalAction}),
    Flag("--second-pass-processes", "with --second-pass-process: how many processes decode "
         "side by side (each job goes to the one with the fewest outstanding)", SECOND_PASS,
         field_reader("second_pass_processes"), kwargs={"type": int, "metavar": "N"}),
    Flag("--second-pass-nice", "with --second-pass-process: CPU priority steps (nice, 0-19) "
         "below the server at which the second pass runs; 0 on a machine that also runs the "
         "browser", SECOND_PASS, field_reader("second_pass_nice"),
         kwargs={"type": int, "metavar": "N"}),
    Flag("--second-pass-yield", "the second pass waits while a live stream has more than a "
         "chunk plus this many seconds of audio waiting to be decoded; off: it never waits",
         SECOND_PASS, field_reader("second_pass_yield_s"), none="off",
         kwargs={"type": _seconds_or_off, "metavar": "S|off"}),
    Flag("--second-pass-beam", "Whisper's beam width at temperature 0 (1 = greedy)",
         SECOND_PASS, field_reader("second_pass_decode.beam_size"),
         kwargs={"type": int, "metavar": "N"}),
    Flag("--second-pass-logits", "how Whisper's output projection is computed on CPU: int8 "
         "(int8 weights, each row's best 64 tokens again in float32), auto (float32 through "
         "torch's or numpy's BLAS, whichever a timing at start finds faster), torch, blas",
         SECOND_PASS, field_reader("second_pass_decode.logits"), kwargs={"choices": LOGITS_BACKENDS}),
    Flag("--second-pass-dtype", "Whisper's dtype: auto (bfloat16 on a CPU that multiplies it "
         "natively, AVX512-BF16 or AMX, its linears fused on the matrix units; float32 "
         "elsewhere), float32, bfloat16", SECOND_PASS,
         field_reader("second_pass_decode.dtype"), kwargs={"choices": DECODE_DTYPES}),
    Flag("--second-pass-window", "audio Whisper's encoder runs on for a final: fit (the segment "
         "plus 2 s, rounded up to 0.5 s; the rest of the 30 s window is silence's states, "
         "computed once), full (the whole 30 s window)", SECOND_PASS,
         field_reader("second_pass_decode.encoder_window.mode"), kwargs={"choices": WINDOW_MODES}),
    Flag("--quantization-option", "second-pass decoder K/V format: kv_cache=fp8_e4m3 (float8 "
         "with a scale per token and head); repeatable", SECOND_PASS, field_reader("quantization"),
         kwargs={"action": "append", "metavar": "KEY=VALUE"}),
    Flag("--decode-kv-budget-gib", "second-pass decoder K/V pool size, in GiB", SECOND_PASS,
         field_reader("decode_kv_budget_gib"), none="--max-decode-slots rows at their full length",
         kwargs={"type": float, "metavar": "GIB"}),
    Flag("--max-decode-slots", "second-pass rows (segments) decoded at once", SECOND_PASS,
         lambda c: c.resolved_max_decode_slots, kwargs={"type": int, "metavar": "N"}),
    # -- live text
    Flag("--final-context", "a segment's second pass also decodes the previous segment when it "
         "is at most this many seconds long, continuing the previous final's text; 0 decodes "
         f"each segment alone (oasr transcribe: {OFFLINE_FINAL_CONTEXT_S:g})", LIVE_TEXT,
         field_reader("final_context_s"), kwargs={"type": float, "metavar": "S"}),
    Flag("--light-load-context", "as --final-context, only while at most --light-load-streams "
         "streams are live; 0: only --final-context", LIVE_TEXT, field_reader("light_load_context_s"),
         kwargs={"type": float, "metavar": "S"}),
    Flag("--light-load-streams", "while at most this many streams are live, segments end "
         "between chunks and finals start decoding at a pause (--early-final, "
         "--endpoint-between-chunks, --light-load-context); above it both wait for chunks",
         LIVE_TEXT, field_reader("light_load_streams"), none="2 per second-pass process",
         kwargs={"type": int, "metavar": "N"}),
    Flag("--early-final", "a pause this many seconds long after the last word starts the "
         "segment's final decode before the endpoint; the decode is the final when nothing was "
         "said since; 0 waits for the endpoint", LIVE_TEXT, field_reader("early_final_s"),
         kwargs={"type": float, "metavar": "S"}),
    Flag("--sentence-end", "end a segment after this many seconds of pause, instead of the "
         "endpoint's silence, when its early final decode ends a sentence (., ?, ! after 3 "
         "words); 0: only the endpoint rules", LIVE_TEXT, field_reader("sentence_end_s"),
         kwargs={"type": float, "metavar": "S"}),
    Flag("--refine-interval", "refined partials: Whisper re-decodes an open segment after "
         "this many seconds of new audio, in spare capacity; 0 turns refinement off", LIVE_TEXT,
         _refine_interval, kwargs={"type": float, "metavar": "S"}),
    Flag("--refine-agreeing", "refined partials: words this many refinements in a row agree "
         "on become stable (never change again)", LIVE_TEXT, _refine("agreeing"),
         kwargs={"type": int, "metavar": "N"}),
    Flag("--refine-min-word-prob", "refined partials: ... and only words whose every token "
         "each of those refinements generated with at least this probability (0-1; default "
         "0.8); 0: agreement alone", LIVE_TEXT, _refine("min_word_prob"),
         kwargs={"type": float, "metavar": "P"}),
    Flag("--refine-hold-words", "refined partials: ... and not the last N words the oldest of "
         "those refinements heard; 0: none held", LIVE_TEXT, _refine("hold_words"),
         kwargs={"type": int, "metavar": "N"}),
    Flag("--refine-max-streams", "refined partials: with more live streams than this, "
         "nothing is refined (a busy server's partials are the CTC pass's)", LIVE_TEXT,
         _refine("max_streams"), kwargs={"type": int, "metavar": "N"}),
)


class _HelpAll(argparse.Action):
    """``--help-all``: every flag, grouped, with its help; then exit."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        for action in parser._actions:
            full = getattr(action, "full_help", None)
            if full is not None:
                action.help = full
        parser.print_help()
        parser.exit()


def add_help_all(parser: argparse.ArgumentParser) -> None:
    """Adds ``--help-all`` (once)."""
    if "--help-all" not in parser._option_string_actions:
        parser.add_argument("--help-all", action=_HelpAll,
                            help="show every flag, grouped, with its help, and exit")


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[Flag], base: Any,
              groups: Mapping[str, argparse._ArgumentGroup]) -> None:
    """Adds ``flags`` to their groups; each flag's default (argparse's) is None, meaning "as
    ``base`` has it", and its help ends with that default. A flag that is not ``common`` is
    left out of ``--help`` and listed by ``--help-all``."""
    for f in flags:
        default = f.default_text(base)
        text = f"{f.help} (default: {default})" if default else f.help
        action = groups[f.group].add_argument(f.flag, default=None, help=text, **f.kwargs)
        if not f.common:
            action.full_help = text  # type: ignore[attr-defined]
            action.help = argparse.SUPPRESS


def add_groups(parser: argparse.ArgumentParser,
               titles: Iterable[str]) -> dict[str, argparse._ArgumentGroup]:
    return {title: parser.add_argument_group(title) for title in titles}


def add_engine_arguments(parser: argparse.ArgumentParser, base: EngineConfig | None = None,
                         exclude: Iterable[str] = ()) -> None:
    """The flags shared by every command that builds an engine, with ``--help-all``.

    Args:
        base: the config whose fields are the defaults (`command_engine_config()` when None).
        exclude: flags the command leaves out (its own flags set those fields).
    """
    base = command_engine_config() if base is None else base
    add_help_all(parser)
    skip = set(exclude)
    add_flags(parser, [f for f in ENGINE_FLAGS if f.flag not in skip], base,
              add_groups(parser, ENGINE_GROUPS))


def default_beam_size(model: str | None, lm: str) -> int:
    """The beam width when none is given: `DEFAULT_LM_BEAM_SIZE` when a char LM will be used
    (``lm`` names a directory, or is "auto" and the model directory has one), else 1."""
    from oasr.lm import has_char_lm
    from oasr.models.checkpoint import DEFAULT_MODEL_DIR

    if lm == "none":
        return 1
    if lm != "auto":
        return DEFAULT_LM_BEAM_SIZE
    model_dir = DEFAULT_MODEL_DIR if model is None else Path(model)
    return DEFAULT_LM_BEAM_SIZE if has_char_lm(model_dir) else 1


def default_ctc_top_k(beam_size: int) -> int:
    """The tokens per frame that may extend a prefix when no ``--ctc-top-k`` is given: the
    beam width. The exact bound, 2 x beam + 1, holds only without LMs, whose scores rank
    extensions in another order anyway; with the bundled model's char and word LMs the beam
    width gave the same texts over 2,541 words and a tenth less search time at 256 streams
    (docs/benchmarks.md, "CTC decoding cost")."""
    return beam_size


def endpoint_config_from_args(args: argparse.Namespace) -> EndpointConfig:
    """The endpoint rules: WeNet's silence rules (1 s of silence after speech) with 20 s
    segments cut at their quietest point (`EndpointConfig.wenet_quiet_cut`, EngineConfig's
    default), unless ``--endpoint-pause`` / ``--max-segment`` ask for the sentence-pause rules
    (`EndpointConfig()`) with the values given."""
    pause = getattr(args, "endpoint_pause", None)
    longest = getattr(args, "max_segment", None)
    if pause is None and longest is None:
        return EndpointConfig.wenet_quiet_cut()
    config = EndpointConfig()
    if pause is not None and config.rule2 is not None:
        config = replace(config, rule2=replace(config.rule2, min_trailing_silence_s=pause))
    if longest is not None and config.rule3 is not None:
        config = replace(config, rule3=replace(config.rule3, min_utterance_length_s=longest),
                         max_cut_window_s=min(config.max_cut_window_s, longest / 2))
    return config


def default_num_left_chunks(model: str | None, base: int = DEFAULT_NUM_LEFT_CHUNKS) -> int:
    """The history when none is given: ``base`` for the paged families; an icefall Zipformer
    directory keeps EngineConfig's -1 (the slot runtime then uses its own left context)."""
    from oasr.models.zipformer.checkpoint import is_icefall_dir

    if model is not None and is_icefall_dir(Path(model)):
        return EngineConfig.num_left_chunks
    return base


# EngineConfig fields set by the flag of the same name (``--max-batch-size`` -> max_batch_size)
SAME_NAME_FIELDS = ("model", "device", "dtype", "max_batch_size", "chunk_size",
                    "prefill_kv_window", "max_num_blocks", "lm", "cuda_graphs", "second_pass",
                    "streaming_cohort_admit", "decode_kv_budget_gib", "max_decode_slots",
                    "light_load_streams", "second_pass_process", "second_pass_processes",
                    "second_pass_nice")
# EngineConfig fields set by a flag of another name
RENAMED_FIELDS = {"threads": "num_threads", "final_context": "final_context_s",
                  "light_load_context": "light_load_context_s", "early_final": "early_final_s",
                  "sentence_end": "sentence_end_s"}


def engine_config_from_args(args: argparse.Namespace, base: EngineConfig | None = None,
                            **overrides: object) -> EngineConfig:
    """The `EngineConfig` the flags of `add_engine_arguments` describe: ``base``
    (`command_engine_config()` when None) with the fields of the flags given, then
    ``overrides`` (fields a command sets itself, e.g. ``oasr transcribe``'s unbounded waits).

    Raises:
        ValueError: a value out of range (EngineConfig's message names it).
    """
    from oasr.models.whisper.quantization import parse_quantization_options

    base = command_engine_config() if base is None else base

    def given(name: str) -> Any:
        return getattr(args, name, None)

    changes: dict[str, Any] = {name: given(name) for name in SAME_NAME_FIELDS
                               if given(name) is not None}
    changes.update({name: given(dest) for dest, name in RENAMED_FIELDS.items()
                    if given(dest) is not None})
    model = changes.get("model", base.model)
    if given("num_left_chunks") is not None:
        changes["num_left_chunks"] = given("num_left_chunks")
    else:
        changes["num_left_chunks"] = default_num_left_chunks(model, base.num_left_chunks)
    beam_size = given("beam_size")
    if beam_size is None:
        beam_size = default_beam_size(model, changes.get("lm", base.lm))
    decoder_fields = {"lm_weight": "lm_weight", "lm_unit_bonus": "lm_unit_bonus",
                      "lm_word_bonus": "lm_word_bonus", "lm_word_weight": "word_lm_weight",
                      "lm_oov_penalty": "word_oov_penalty",
                      "compiled_ctc_search": "compiled_search"}
    top_k = given("ctc_top_k")
    if top_k is None:  # resolved with the beam; greedy search has no candidates
        top_k = default_ctc_top_k(beam_size) if beam_size > 1 else base.decoder.top_k
    changes["decoder"] = replace(base.decoder, beam_size=beam_size, top_k=top_k,
                                 **{name: given(dest) for dest, name in decoder_fields.items()
                                    if given(dest) is not None})
    if given("endpoint_pause") is not None or given("max_segment") is not None:
        changes["endpoint"] = endpoint_config_from_args(args)
    if given("endpoint_between_chunks") is not None:
        changes["endpoint_quiet"] = (base.endpoint_quiet or QuietTail()
                                     if given("endpoint_between_chunks") else None)
    if given("second_pass_yield") is not None:
        changes["second_pass_yield_s"] = (None if given("second_pass_yield") == OFF
                                          else given("second_pass_yield"))
    if given("second_pass_process") is False and given("second_pass_processes") is None:
        changes["second_pass_processes"] = 1  # on a thread the second pass has one decoder
    decode = base.second_pass_decode
    if given("second_pass_beam") is not None:
        decode = replace(decode, beam_size=given("second_pass_beam"))
    if given("second_pass_logits") is not None:
        decode = replace(decode, logits=given("second_pass_logits"))
    if given("second_pass_dtype") is not None:
        decode = replace(decode, dtype=given("second_pass_dtype"))
    if given("second_pass_window") is not None:
        decode = replace(decode, encoder_window=EncoderWindow(given("second_pass_window")))
    changes["second_pass_decode"] = decode
    if given("quantization_option"):
        changes["quantization"] = parse_quantization_options(given("quantization_option"))
    refine = base.refine or RefineConfig()
    refine_fields = {"refine_agreeing": "agreeing", "refine_min_word_prob": "min_word_prob",
                     "refine_hold_words": "hold_words", "refine_max_streams": "max_streams"}
    refine = replace(refine, **{name: given(dest) for dest, name in refine_fields.items()
                                if given(dest) is not None})
    interval = given("refine_interval")
    if interval is not None:
        changes["refine"] = replace(refine, interval_s=interval) if interval > 0 else None
    elif base.refine is not None:
        changes["refine"] = refine
    return replace(base, **{**changes, **overrides})
