"""`CharNgramLm`: a character n-gram LM compiled to dense tables, and its file format.

On disk, next to a model's ``config.json``: ``char_lm.safetensors`` holds ``codes`` (S,) int64
context codes and ``neg_log_probs`` (S, V) uint8, each context's distribution over the model's
units (back-off already resolved) as -log-prob in steps of ``LOG_PROB_STEP`` nats (255: never,
the blank); ``char_lm.json`` is the header (format, order, units, smoothing, pruning, the
build text and its licence). Loading dequantises and renormalises each row, and recomputes the
next-state table (a function of the codes): the file holds 1 byte per (state, unit).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from oasr.lm.automaton import compile_next_state

LM_FORMAT = "oasr-char-ngram"
LM_VERSION = 1
TENSORS_FILE = "char_lm.safetensors"
HEADER_FILE = "char_lm.json"
# Log-prob of units the model never predicts (the blank): finite, so a weight of 0 times it
# is 0 and not NaN.
LOG_PROB_FLOOR = -99.0
LOG_PROB_STEP = 0.1  # nats per quantisation level on disk (levels 0..254; 255 = never)


@dataclass(frozen=True)
class CharLmHeader:
    """What a char LM file says about itself.

    Attributes:
        order: n-gram order N (contexts of up to N - 1 units).
        units: the model units the LM is over, in id order (must equal the acoustic model's).
        blank_id: the CTC blank (never predicted).
        end_id: the sentence start / end unit (``<sos/eos>``).
        smoothing: "kneser_ney" or "witten_bell".
        min_context_count: per context length, the pruning threshold the build used.
        text: where the build text came from and its licence.
    """

    order: int
    units: tuple[str, ...]
    blank_id: int
    end_id: int
    smoothing: str
    min_context_count: tuple[int, ...]
    text: str

    def __post_init__(self) -> None:
        if self.order < 2:
            raise ValueError(f"order must be >= 2 (a sentence-start context), got {self.order}")
        for name in ("blank_id", "end_id"):
            if not 0 <= getattr(self, name) < len(self.units):
                raise ValueError(f"{name} {getattr(self, name)} outside {len(self.units)} units")


class CharNgramLm:
    """A character n-gram LM as a deterministic automaton over dense tables.

    Invariant: state 0 is the sentence start; ``log_probs[s]`` is a distribution over the
    units (sums to 1 in probability, blank at the floor) and ``next_state[s, u]`` is the state
    after unit u (the longest kept context ending the extended history; the end unit leads to
    state 0). Scoring a unit is two gathers, so a beam search scores every candidate of every
    hypothesis of every stream at once.

    Attributes:
        header: `CharLmHeader`.
        codes: (S,) int64 context code of each state (see `oasr.lm.ngram`).
        log_probs: (S, V) float32.
        next_state: (S, V) int64.
    """

    def __init__(self, header: CharLmHeader, codes: torch.Tensor, log_probs: torch.Tensor,
                 next_state: torch.Tensor | None = None) -> None:
        v = len(header.units)
        if log_probs.dim() != 2 or log_probs.shape != (codes.shape[0], v):
            raise ValueError(f"log_probs must be ({codes.shape[0]}, {v}), "
                             f"got {tuple(log_probs.shape)}")
        self.header = header
        self.codes = codes.to(torch.int64)
        self.log_probs = log_probs.float().clamp(min=LOG_PROB_FLOOR)
        if next_state is None:
            next_state = torch.from_numpy(compile_next_state(
                self.codes.cpu().numpy(), header.order, v, header.end_id))
        self.next_state = next_state.to(device=self.log_probs.device, dtype=torch.int64)

    @property
    def num_states(self) -> int:
        return self.codes.shape[0]

    @property
    def vocab_size(self) -> int:
        return len(self.header.units)

    @property
    def start_state(self) -> int:
        return 0

    @property
    def device(self) -> torch.device:
        return self.log_probs.device

    def to(self, device: torch.device | str) -> CharNgramLm:
        """This LM with its tables on ``device`` (self when already there)."""
        if torch.device(device) == self.device:
            return self
        return CharNgramLm(self.header, self.codes.to(device), self.log_probs.to(device),
                           self.next_state.to(device))

    def score_sequence(self, ids: Sequence[int], end: bool = True) -> float:
        """Natural-log probability of ``ids`` from the sentence start (+ the end unit)."""
        state, total = self.start_state, 0.0
        for unit in [*ids, self.header.end_id] if end else ids:
            total += float(self.log_probs[state, unit])
            state = int(self.next_state[state, unit])
        return total

    def check_units(self, units: Sequence[str]) -> None:
        """Raises ValueError unless ``units`` are the LM's, in the same order."""
        if tuple(units) != self.header.units:
            diff = next((i for i, (a, b) in enumerate(zip(units, self.header.units, strict=False))
                         if a != b), min(len(units), len(self.header.units)))
            raise ValueError(f"the LM is over {len(self.header.units)} units, the model has "
                             f"{len(units)}; first difference at id {diff}")

    def save(self, directory: str | Path) -> Path:
        """Write ``char_lm.safetensors`` + ``char_lm.json`` into ``directory``; returns the
        tensors file."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        log_probs = self.log_probs.cpu()
        levels = (-log_probs / LOG_PROB_STEP).round().clamp(max=254)
        levels[log_probs <= LOG_PROB_FLOOR] = 255
        tensors = {"codes": self.codes.cpu().contiguous(),
                   "neg_log_probs": levels.to(torch.uint8).contiguous()}
        save_file(tensors, str(directory / TENSORS_FILE))
        header = {"format": LM_FORMAT, "version": LM_VERSION, "num_states": self.num_states,
                  "log_prob_step": LOG_PROB_STEP, **asdict(self.header)}
        (directory / HEADER_FILE).write_text(json.dumps(header, indent=1) + "\n")
        return directory / TENSORS_FILE


def has_char_lm(directory: str | Path) -> bool:
    """Whether ``directory`` holds a char LM (both files)."""
    d = Path(directory)
    return (d / TENSORS_FILE).is_file() and (d / HEADER_FILE).is_file()


def load_char_lm(directory: str | Path, device: torch.device | str = "cpu") -> CharNgramLm:
    """The char LM of a model directory.

    Raises:
        FileNotFoundError: the directory has no LM files.
        ValueError: a header of another format or version.
    """
    d = Path(directory)
    if not has_char_lm(d):
        raise FileNotFoundError(f"{d} has no {TENSORS_FILE} + {HEADER_FILE}")
    raw = json.loads((d / HEADER_FILE).read_text())
    if raw.get("format") != LM_FORMAT or raw.get("version") != LM_VERSION:
        raise ValueError(f"{d / HEADER_FILE}: format {raw.get('format')!r} version "
                         f"{raw.get('version')!r}, expected {LM_FORMAT!r} {LM_VERSION}")
    header = CharLmHeader(
        order=int(raw["order"]), units=tuple(raw["units"]), blank_id=int(raw["blank_id"]),
        end_id=int(raw["end_id"]), smoothing=str(raw["smoothing"]),
        min_context_count=tuple(raw["min_context_count"]), text=str(raw["text"]))
    tensors = load_file(str(d / TENSORS_FILE))
    lm = CharNgramLm(header, tensors["codes"],
                     dequantize(tensors["neg_log_probs"], float(raw["log_prob_step"])))
    return lm.to(device)


def dequantize(levels: torch.Tensor, step: float) -> torch.Tensor:
    """(S, V) uint8 levels -> (S, V) float32 log-probs, each row renormalised (level 255 is
    the floor and carries no probability)."""
    never = levels == 255
    log_probs = levels.float() * -step
    log_probs = log_probs - log_probs.masked_fill(never, float("-inf")).logsumexp(1, keepdim=True)
    return log_probs.masked_fill(never, LOG_PROB_FLOOR)


def lm_from_dense(header: CharLmHeader, codes: np.ndarray, probs: np.ndarray) -> CharNgramLm:
    """A `CharNgramLm` from smoothed (S, V) probabilities (see `oasr.lm.ngram.smooth`)."""
    with np.errstate(divide="ignore"):
        log_probs = np.log(probs)
    return CharNgramLm(header, torch.from_numpy(codes.astype(np.int64)),
                       torch.from_numpy(log_probs).float())  # the constructor floors them


def perplexity(lm: CharNgramLm, sentences: Sequence[Sequence[int]]) -> float:
    """Per-unit perplexity (end units included) of ``sentences``."""
    total = sum(lm.score_sequence(s) for s in sentences)
    units = sum(len(s) + 1 for s in sentences)
    return math.exp(-total / units)
