"""`WordLm`: a word unigram LM compiled to a character automaton (a lexicon prefix trie).

A hypothesis of the CTC beam search carries one integer word state: the trie node of the word
it is spelling (0 = between words, the root), or the out-of-vocabulary (OOV) state once its
current word left the lexicon. Every unit moves the state through one dense (S, V) next-state
table, and its score is one gather from a (S, V) gain table, so the word LM costs the search
the same two gathers per candidate as the char LM.

Scores are spread along the spelling by look-ahead: ``phi(node) = weight * log sum P(w)`` over
the lexicon words that start with the node's prefix (the prefix's probability mass), and a unit
from node s to node t gains ``phi(t) - phi(s)``. Closing a word (word boundary or sentence end)
at node s gains ``weight * log P(word(s)) - phi(s)``, so a finished in-lexicon word has gained
exactly ``weight * log P(w)``. A unit with no child leaves the lexicon: it gains
``phi_oov - phi(s)`` with ``phi_oov = weight * log P_min - oov_penalty`` (``P_min``: the rarest
lexicon word's probability), and the OOV state absorbs letters for free until the word ends: an
OOV word gains ``phi_oov`` in total, whatever its length. Every gain is <= 0 (look-ahead mass
only shrinks along a spelling), so partial words are never over-credited.

On disk, next to a model's ``config.json``: ``word_lm.txt`` lists ``word<TAB>log-prob`` (natural
log, the lexicon's unigram, highest first); ``word_lm.json`` is the header (format, units, the
word list's sources and licences). Loading rebuilds the trie (about a second for 100k words).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from oasr.lm.bigram import SENTENCE_START, BigramTables, WordBigrams

WORD_LM_FORMAT = "oasr-word-unigram"
WORD_LM_VERSION = 1
WORDS_FILE = "word_lm.txt"
WORD_HEADER_FILE = "word_lm.json"
BIGRAM_FILE = "word_lm.safetensors"
WORD_BOUNDARY = "\u2581"
ROOT_STATE = 0


@dataclass(frozen=True)
class WordLmHeader:
    """What a word LM file says about itself.

    Attributes:
        units: the model units, in id order (must equal the acoustic model's).
        blank_id: the CTC blank (never moves the state).
        boundary_id: the word boundary unit (closes a word).
        end_id: the sentence start / end unit (closes a word like the boundary).
        text: where the words and their frequencies came from, with licences.
        fusion: the decoder fusion weights tuned with this LM, as (name, value) pairs of
            `GpuDecoderConfig` fields (``lm_weight``, ``lm_unit_bonus``, ``word_lm_weight``,
            ``word_oov_penalty``); a decoder whose config leaves them None uses these.
    """

    units: tuple[str, ...]
    blank_id: int
    boundary_id: int
    end_id: int
    text: str
    fusion: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("blank_id", "boundary_id", "end_id"):
            if not 0 <= getattr(self, name) < len(self.units):
                raise ValueError(f"{name} {getattr(self, name)} outside {len(self.units)} units")

    @classmethod
    def for_units(cls, units: Sequence[str], text: str = "",
                  fusion: dict[str, float] | None = None) -> WordLmHeader:
        """A header for ``units`` (they must hold ``<blank>``, the boundary and ``<sos/eos>``)."""
        units = tuple(units)
        for name in ("<blank>", WORD_BOUNDARY, "<sos/eos>"):
            if name not in units:
                raise ValueError(f"units must contain {name!r} (got {len(units)} units)")
        return cls(units=units, blank_id=units.index("<blank>"),
                   boundary_id=units.index(WORD_BOUNDARY), end_id=units.index("<sos/eos>"),
                   text=text, fusion=tuple(sorted((fusion or {}).items())))


@dataclass(frozen=True)
class WordGains:
    """A `WordLm`'s tables with the fusion weights folded in (see the module docstring).

    Attributes:
        gains: (S, V) float32 what each unit adds to a prefix's fused score after each state.
        next_state: (S, V) int32 the state after each unit (int32: half the memory of a
            lexicon's table).
        end_gains: (S,) float32 what closing the sentence after each state adds.
        closers: (V,) bool the units that close a word (boundary, sentence end).
        bigram: the bigram corrections added when a word is closed (None: a unigram).
    """

    gains: torch.Tensor
    next_state: torch.Tensor
    end_gains: torch.Tensor
    closers: torch.Tensor
    bigram: BigramTables | None = None


class WordLm:
    """A word unigram over a lexicon, as a prefix trie over the model's units.

    Invariant: state 0 is the root (between words), states 1..N-1 are the trie nodes (one per
    distinct proper prefix or word of the lexicon), state N is the OOV state; ``word_log_prob``
    of a node is its word's log-prob (-inf when the prefix is not a word) and ``mass`` the log
    of the lexicon probability below it. Building is host work at load time; the search only
    gathers from `gains_for`'s tables.

    Attributes:
        header: `WordLmHeader`.
        words: the lexicon, highest probability first.
        log_probs: (W,) float64 natural-log unigram probabilities (summing to 1).
        next_state: (S, V) int64 (letters: child or OOV; boundary / end: the root).
        mass: (S,) float64 log lexicon mass below each node (0 at the root; OOV: -inf).
        word_log_prob: (S,) float64.
        node_code: (S,) int64 the code (lexicon index + 1) of the word each state closes;
            W + 1 where none (root, prefixes that are no word, OOV).
        bigrams: `WordBigrams` corrections, or None for a unigram.
    """

    def __init__(self, header: WordLmHeader, words: Sequence[str],
                 log_probs: Sequence[float] | np.ndarray,
                 bigrams: WordBigrams | None = None) -> None:
        if len(words) != len(log_probs) or not words:
            raise ValueError(f"need one log-prob per word, got {len(words)} words and "
                             f"{len(log_probs)} log-probs")
        if bigrams is not None and bigrams.num_words != len(words):
            raise ValueError(f"bigrams are over {bigrams.num_words} words, the lexicon has "
                             f"{len(words)}")
        self.header = header
        self.words = tuple(words)
        self.log_probs = np.asarray(log_probs, dtype=np.float64)
        self.bigrams = bigrams
        self._build_trie()

    @property
    def num_states(self) -> int:
        return self.next_state.shape[0]

    @property
    def vocab_size(self) -> int:
        return len(self.header.units)

    @property
    def oov_state(self) -> int:
        return self.num_states - 1

    @property
    def floor_log_prob(self) -> float:
        """The rarest lexicon word's log-prob (an OOV word scores below it)."""
        return float(self.log_probs.min())

    def _build_trie(self) -> None:
        units = {u: i for i, u in enumerate(self.header.units)}
        children: dict[tuple[int, int], int] = {}
        node_of_word = np.zeros(len(self.words), dtype=np.int64)
        pair_node, pair_word = [], []  # every (node on a word's path, word) pair
        for w, word in enumerate(self.words):
            node = ROOT_STATE
            for ch in word:
                unit = units.get(ch)
                if unit is None or unit in (self.header.boundary_id, self.header.end_id,
                                            self.header.blank_id):
                    raise ValueError(f"word {w} {word!r} has {ch!r}, not a letter unit")
                node = children.setdefault((node, unit), len(children) + 1)
                pair_node.append(node)
                pair_word.append(w)
            node_of_word[w] = node
        num_states = len(children) + 2  # root + nodes + OOV
        oov = num_states - 1
        letters = np.ones(self.vocab_size, dtype=bool)
        letters[[self.header.blank_id, self.header.boundary_id, self.header.end_id]] = False
        next_state = np.full((num_states, self.vocab_size), oov, dtype=np.int64)
        next_state[:, ~letters] = ROOT_STATE
        next_state[:, self.header.blank_id] = np.arange(num_states)
        keys = np.array(list(children.keys()), dtype=np.int64).reshape(-1, 2)
        next_state[keys[:, 0], keys[:, 1]] = np.fromiter(children.values(), dtype=np.int64)
        probs = np.zeros(num_states)
        np.add.at(probs, np.asarray(pair_node, dtype=np.int64),
                  np.exp(self.log_probs)[np.asarray(pair_word, dtype=np.int64)])
        with np.errstate(divide="ignore"):
            mass = np.log(probs)
        mass[ROOT_STATE] = 0.0
        word_log_prob = np.full(num_states, -np.inf)
        word_log_prob[node_of_word] = self.log_probs  # a duplicate word keeps its last entry
        node_code = np.full(num_states, len(self.words) + 1, dtype=np.int64)
        node_code[node_of_word] = np.arange(1, len(self.words) + 1)
        self.next_state, self.mass, self.word_log_prob = next_state, mass, word_log_prob
        self.node_code = node_code

    def gains_for(self, weight: float, oov_penalty: float,
                  device: torch.device | str = "cpu") -> WordGains:
        """The fused tables for ``weight`` (scales word log-probs) and ``oov_penalty`` (>= 0,
        subtracted once per OOV word) on ``device``.

        Raises:
            ValueError: a negative weight or penalty.
        """
        if weight < 0 or oov_penalty < 0:
            raise ValueError(f"weight and oov_penalty must be >= 0, got {weight}, {oov_penalty}")
        oov = self.oov_state
        phi = np.zeros(self.num_states)  # (S,) weighted look-ahead
        phi[1:oov] = weight * self.mass[1:oov]
        phi[oov] = weight * self.floor_log_prob - oov_penalty
        is_word = np.isfinite(self.word_log_prob)
        closed = np.full(self.num_states, phi[oov])  # (S,) a word closed at each node
        closed[is_word] = weight * self.word_log_prob[is_word]
        closing = closed - phi
        closing[[ROOT_STATE, oov]] = 0.0  # nothing to close / the OOV word has paid already
        gains = phi[self.next_state] - phi[:, None]  # (S, V) letters
        closers = self.next_state[0] == ROOT_STATE  # boundary, end (and the blank: fixed below)
        gains[:, closers] = closing[:, None]
        gains[:, self.header.blank_id] = 0.0
        closers[self.header.blank_id] = False
        gains[oov, :] = 0.0  # the OOV state absorbs letters for free
        bigram = None
        if self.bigrams is not None:
            bigram = BigramTables.build(self.bigrams, self.node_code, weight, device)
        return WordGains(
            gains=torch.from_numpy(gains).float().to(device),
            next_state=torch.from_numpy(self.next_state.astype(np.int32)).to(device),
            end_gains=torch.from_numpy(closing).float().to(device),
            closers=torch.from_numpy(closers).to(device), bigram=bigram)

    def sentence_score(self, text: str, weight: float = 1.0, oov_penalty: float = 0.0) -> float:
        """The fused word score of ``text`` (words separated by spaces) walked unit by unit
        through `gains_for`'s tables, sentence end included: the reference for tests."""
        tables = self.gains_for(weight, oov_penalty)
        units = {u: i for i, u in enumerate(self.header.units)}
        ids = [self.header.boundary_id if ch == " " else units[ch] for ch in text.strip()]
        state, prev, total = ROOT_STATE, SENTENCE_START, 0.0
        for unit in [*ids, self.header.end_id]:
            if unit == self.header.end_id:
                total += float(tables.end_gains[state])
            else:
                total += float(tables.gains[state, unit])
            if bool(tables.closers[unit]) and state != ROOT_STATE:
                code = int(self.node_code[state])
                if self.bigrams is not None:
                    total += weight * self.bigrams.correction(prev, code)
                prev = code
            state = int(tables.next_state[state, unit])
        return total

    def check_units(self, units: Sequence[str]) -> None:
        """Raises ValueError unless ``units`` are the LM's, in the same order."""
        if tuple(units) != self.header.units:
            raise ValueError(f"the word LM is over {len(self.header.units)} units "
                             f"{self.header.units[:5]}..., the model has {len(units)} "
                             f"{tuple(units)[:5]}...")

    def save(self, directory: str | Path) -> Path:
        """Write ``word_lm.txt`` + ``word_lm.json`` into ``directory``; returns the word file."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        lines = [f"{w}\t{p:.4f}" for w, p in zip(self.words, self.log_probs, strict=True)]
        (directory / WORDS_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
        if self.bigrams is not None:
            b = self.bigrams
            save_file({"prev": b.prev.astype(np.int32), "word": b.word.astype(np.int32),
                       "log_ratio": b.log_ratio.astype(np.float16),
                       "backoff": b.backoff.astype(np.float32)}, str(directory / BIGRAM_FILE))
        else:
            (directory / BIGRAM_FILE).unlink(missing_ok=True)
        header = {"format": WORD_LM_FORMAT, "version": WORD_LM_VERSION,
                  "num_words": len(self.words),
                  "num_bigrams": 0 if self.bigrams is None else len(self.bigrams.prev),
                  **asdict(self.header), "fusion": dict(self.header.fusion)}
        (directory / WORD_HEADER_FILE).write_text(json.dumps(header, indent=1) + "\n")
        return directory / WORDS_FILE


def has_word_lm(directory: str | Path) -> bool:
    """Whether ``directory`` holds a word LM (both files)."""
    d = Path(directory)
    return (d / WORDS_FILE).is_file() and (d / WORD_HEADER_FILE).is_file()


def load_word_lm(directory: str | Path) -> WordLm:
    """The word LM of a model directory.

    Raises:
        FileNotFoundError: the directory has no word LM files.
        ValueError: a header of another format or version, or a malformed line.
    """
    d = Path(directory)
    if not has_word_lm(d):
        raise FileNotFoundError(f"{d} has no {WORDS_FILE} + {WORD_HEADER_FILE}")
    raw = json.loads((d / WORD_HEADER_FILE).read_text())
    if raw.get("format") != WORD_LM_FORMAT or raw.get("version") != WORD_LM_VERSION:
        raise ValueError(f"{d / WORD_HEADER_FILE}: format {raw.get('format')!r} version "
                         f"{raw.get('version')!r}, expected {WORD_LM_FORMAT!r} {WORD_LM_VERSION}")
    header = WordLmHeader(units=tuple(raw["units"]), blank_id=int(raw["blank_id"]),
                          boundary_id=int(raw["boundary_id"]), end_id=int(raw["end_id"]),
                          text=str(raw["text"]),
                          fusion=tuple(sorted((str(k), float(v))
                                              for k, v in raw.get("fusion", {}).items())))
    words, log_probs = [], []
    for number, line in enumerate((d / WORDS_FILE).read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split("\t")
        if len(parts) != 2:
            raise ValueError(f"{d / WORDS_FILE} line {number}: expected word<TAB>log-prob")
        words.append(parts[0])
        log_probs.append(float(parts[1]))
    bigrams = None
    if (d / BIGRAM_FILE).is_file():
        t = load_file(str(d / BIGRAM_FILE))
        bigrams = WordBigrams(prev=t["prev"].astype(np.int64), word=t["word"].astype(np.int64),
                              log_ratio=t["log_ratio"].astype(np.float32),
                              backoff=t["backoff"].astype(np.float32))
    return WordLm(header, words, log_probs, bigrams)


def unigram_from_counts(counts: dict[str, float]) -> tuple[list[str], np.ndarray]:
    """Words by decreasing count and their natural-log relative frequencies.

    Raises:
        ValueError: no positive count.
    """
    kept = sorted(((c, w) for w, c in counts.items() if c > 0), key=lambda x: (-x[0], x[1]))
    if not kept:
        raise ValueError("no word has a positive count")
    total = math.fsum(c for c, _ in kept)
    return [w for _, w in kept], np.log(np.array([c for c, _ in kept]) / total)
