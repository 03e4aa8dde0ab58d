"""Hotwords: per-stream terms the CTC prefix beam search is biased towards (a context graph).

A stream's hotwords (`Hotword`: a phrase and its boost) are checked once (`parse_hotwords`:
at most `MAX_HOTWORDS` terms of at most `MAX_PHRASE_CHARS` characters, boosts in
(0, `MAX_BOOST`]) and spelled in the CTC model's units (`term_tokens`: a character model writes
a phrase in lower case with its word-boundary unit between and after its words; a term with a
character the units cannot write, or with nothing speakable left, is refused by name).

`ContextGraph` compiles the terms into an automaton over the units (Aho-Corasick over the
terms' token sequences, with a word-start root and a mid-word root so that a term only starts
at the start of a word): a hypothesis carries one integer state (`DecoderState.ctx_state`),
and extending it by a token adds ``gains[state, class(token)]`` to its fused score. The score
a token sequence earns is its completed terms' boosts plus the partial credit of the match in
progress: each matched token of a term adds its boost at once (so the hypothesis survives the
beam while the term is spelled), a match that breaks takes its partial credit back, and a
completed term keeps it. A partial match therefore costs nothing in the end; the hypothesis's
end (`end_gains`) counts as a word boundary, so a term at the end of a segment is complete.

`ContextStore` keeps the graphs of every stream a decoder serves in flat tables, so one frame
of the batched search looks up every row's graph with two ``take``s (`ContextBatch.step`).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from oasr.text.tokenizer import SPACE, WORD_BOUNDARY, CharTokenizer

MAX_HOTWORDS = 100  # terms per stream
MAX_PHRASE_CHARS = 50  # characters per term
MAX_BOOST = 10.0  # a term's boost per token (log-score), (0, MAX_BOOST]
DEFAULT_BOOST = 3.0  # the boost of a term given without one (chosen on the tune sentences)
MAX_TABLE_ENTRIES = 1 << 22  # states x token classes of one stream's graph
WORD_START, MID_WORD = 0, 1  # the two roots of every graph


class HotwordError(ValueError):
    """A stream's hotwords cannot be used; the message names the term and why."""


@dataclass(frozen=True)
class Hotword:
    """A term to bias recognition towards.

    Attributes:
        phrase: the term as it should be written (one or more words).
        boost: log-score added per matched token of the term in the CTC search.
    """

    phrase: str
    boost: float = DEFAULT_BOOST

    def to_json(self) -> dict[str, Any]:
        return {"phrase": self.phrase, "boost": self.boost}


def parse_hotwords(value: object, param: str = "hotwords") -> tuple[Hotword, ...]:
    """Check a client's hotwords: a list of phrases (strings) or ``{"phrase", "boost"}``
    objects (None: none). Whitespace runs become one space; a term given twice (ignoring
    case) is kept once, with the larger boost.

    Raises:
        HotwordError: not a list, too many terms, an empty or too long phrase, an unknown
            field, a boost that is not a number in (0, `MAX_BOOST`].
    """
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise HotwordError(f"{param} must be a list of phrases or {{\"phrase\", \"boost\"}} "
                           f"objects, got {type(value).__name__}")
    if len(value) > MAX_HOTWORDS:
        raise HotwordError(f"{param}: {len(value)} terms; at most {MAX_HOTWORDS} per stream")
    terms: dict[str, Hotword] = {}
    for i, item in enumerate(value):
        where = f"{param}[{i}]"
        boost: object = DEFAULT_BOOST
        if isinstance(item, Hotword):
            phrase, boost = item.phrase, item.boost
        elif isinstance(item, str):
            phrase = item
        elif isinstance(item, Mapping):
            unknown = sorted(set(item) - {"phrase", "boost"})
            if unknown:
                raise HotwordError(f"{where}: unknown fields {unknown}; a term has 'phrase' "
                                   "and 'boost'")
            phrase_field = item.get("phrase")
            if not isinstance(phrase_field, str):
                raise HotwordError(f"{where}.phrase must be a string")
            phrase = phrase_field
            boost = item.get("boost", DEFAULT_BOOST)
        else:
            raise HotwordError(f"{where} must be a string or {{\"phrase\", \"boost\"}}, got "
                               f"{type(item).__name__}")
        phrase = " ".join(phrase.split())
        if not phrase:
            raise HotwordError(f"{where} is empty")
        if len(phrase) > MAX_PHRASE_CHARS:
            raise HotwordError(f"{where} {phrase[:20]!r}...: {len(phrase)} characters; at "
                               f"most {MAX_PHRASE_CHARS} per term")
        if isinstance(boost, bool) or not isinstance(boost, (int, float)) or not (
                math.isfinite(boost) and 0.0 < boost <= MAX_BOOST):
            raise HotwordError(f"{where} {phrase!r}: boost {boost!r}; use a number in "
                               f"(0, {MAX_BOOST:g}]")
        key = phrase.casefold()
        kept = terms.get(key)
        if kept is None or kept.boost < boost:
            terms[key] = Hotword(kept.phrase if kept is not None else phrase, float(boost))
    return tuple(terms.values())


def split_terms(text: str) -> list[str]:
    """Comma-separated terms (``--hotwords A,B``, a form field): stripped, empties dropped."""
    return [part.strip() for part in text.split(",") if part.strip()]


def _boundary_id(tokenizer: Any) -> int | None:
    units = list(getattr(tokenizer, "units", ()))
    for unit in (WORD_BOUNDARY, SPACE):
        if unit in units:
            return units.index(unit)
    return None


def _fold(text: str) -> str:
    """Lower case, accents dropped (NFKD without combining marks)."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def term_tokens(tokenizer: Any, phrase: str) -> list[int]:
    """``phrase`` in the CTC model's units: for a character model, its letters in lower case
    (accents dropped, hyphens and slashes as word breaks, other punctuation left out) with the
    boundary unit between and after its words; for a BPE model, its pieces (as written, else
    in lower or upper case, whichever the units spell without ``<unk>``).

    Raises:
        HotwordError: a character the units cannot write, or nothing speakable left.
    """
    if isinstance(tokenizer, CharTokenizer):
        units = set(tokenizer.units)
        words = []
        for raw in _fold(phrase).replace("-", " ").replace("/", " ").split():
            kept = []
            for ch in raw:
                if ch in units and not (ch.startswith("<") and len(ch) > 1):
                    kept.append(ch)
                elif unicodedata.category(ch).startswith("P") or unicodedata.category(
                        ch).startswith("S"):
                    continue  # punctuation and symbols are not spoken
                else:
                    raise HotwordError(f"hotword {phrase!r}: the model cannot write {ch!r} "
                                       "(spell numbers and symbols out in words)")
            if kept:
                words.append("".join(kept))
        if not words:
            raise HotwordError(f"hotword {phrase!r} has nothing the model can speak")
        ids = tokenizer.encode(" ".join(words), strict=True)
        boundary = _boundary_id(tokenizer)
        return ids + ([boundary] if boundary is not None else [])
    unk = getattr(tokenizer, "units", [None, None])
    unk_id = unk.index("<unk>") if "<unk>" in unk else None
    for variant in (phrase, phrase.lower(), phrase.upper()):
        ids = list(tokenizer.encode(variant))
        if ids and unk_id not in ids:
            return ids
    raise HotwordError(f"hotword {phrase!r}: the model's units cannot spell it")


@dataclass
class _Trie:
    """The terms' prefix tree over token classes (state 0: word start, 1: mid-word)."""

    children: list[dict[int, int]] = field(default_factory=lambda: [{}, {}])
    parent: list[int] = field(default_factory=lambda: [-1, -1])
    boost: list[float] = field(default_factory=lambda: [0.0, 0.0])  # the token into a state
    is_end: list[bool] = field(default_factory=lambda: [False, False])

    def add(self, classes: Sequence[int], boost: float) -> None:
        state = WORD_START
        for c in classes:
            child = self.children[state].get(c)
            if child is None:
                child = len(self.parent)
                self.children[state][c] = child
                self.children.append({})
                self.parent.append(state)
                self.boost.append(boost)
                self.is_end.append(False)
            else:
                self.boost[child] = max(self.boost[child], boost)
            state = child
        self.is_end[state] = True


@dataclass(frozen=True, eq=False)
class ContextGraph:
    """A stream's hotwords compiled for the CTC search (see the module docstring).

    States are relative to the graph: 0 is the word start (a hypothesis's first state),
    1 is inside a word no term starts at. Tokens are mapped to classes first: class 0 is every
    token no term uses.

    Attributes:
        terms: the hotwords.
        tokens: each term's token sequence.
        vocab_size: the units of the model it was built for.
        class_of: (V,) int64 each token's class.
        goto: (S, U) int64 the state after each class.
        gains: (S, U) float32 what taking that step adds to a hypothesis's fused score.
        end_gains: (S,) float32 what ending the hypothesis there adds (a match in progress:
            its partial credit taken back, or the term completed where the end is a word's).
        pending: (S,) float32 the partial credit of the match in progress at each state.
        boundary_id: the word-boundary unit (character models), else None.
    """

    terms: tuple[Hotword, ...]
    tokens: tuple[tuple[int, ...], ...]
    vocab_size: int
    class_of: np.ndarray
    goto: np.ndarray
    gains: np.ndarray
    end_gains: np.ndarray
    pending: np.ndarray
    boundary_id: int | None = None
    _device_tables: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict,
                                                                repr=False)

    @property
    def num_states(self) -> int:
        return int(self.goto.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.goto.shape[1])

    @classmethod
    def build(cls, terms: Sequence[Hotword], tokenizer: Any, vocab_size: int | None = None
              ) -> ContextGraph:
        """The graph of ``terms`` in ``tokenizer``'s units.

        Raises:
            HotwordError: a term the units cannot spell (`term_tokens`), or tables too big.
        """
        tokens = [tuple(term_tokens(tokenizer, t.phrase)) for t in terms]
        vocab = vocab_size if vocab_size is not None else len(tokenizer.units)
        return cls.from_tokens(terms, tokens, vocab, _boundary_id(tokenizer)
                               if isinstance(tokenizer, CharTokenizer) else None)

    @classmethod
    def from_tokens(cls, terms: Sequence[Hotword], tokens: Sequence[Sequence[int]],
                    vocab_size: int, boundary_id: int | None = None) -> ContextGraph:
        """The graph of terms already spelled in ``vocab_size`` units (``tokens[i]`` is term
        ``i``'s; ``boundary_id``: the word-boundary unit, which ends every term of a
        character model and starts none)."""
        if len(terms) != len(tokens):
            raise ValueError(f"{len(terms)} terms but {len(tokens)} token sequences")
        seqs = []
        for term, seq in zip(terms, tokens, strict=True):
            seq = [int(t) for t in seq]
            while seq and seq[0] == boundary_id:
                seq = seq[1:]
            if not seq:
                raise HotwordError(f"hotword {term.phrase!r} has nothing the model can speak")
            if not all(0 <= t < vocab_size for t in seq):
                raise ValueError(f"hotword {term.phrase!r}: token ids outside 0..{vocab_size - 1}")
            seqs.append(tuple(seq))
        used = sorted({t for seq in seqs for t in seq} | (
            {boundary_id} if boundary_id is not None else set()))
        class_of = np.zeros(vocab_size, dtype=np.int64)
        class_of[used] = np.arange(1, len(used) + 1)
        trie = _Trie()
        for term, seq in zip(terms, seqs, strict=True):
            trie.add([int(class_of[t]) for t in seq], term.boost)
        num_states, num_classes = len(trie.parent), len(used) + 1
        if num_states * num_classes > MAX_TABLE_ENTRIES:
            raise HotwordError(f"the hotwords make a graph of {num_states} states x "
                               f"{num_classes} units; use fewer or shorter terms")
        boundary = int(class_of[boundary_id]) if boundary_id is not None else None
        goto, fail, order = _goto_table(trie, num_classes, boundary)
        node_score = np.zeros(num_states)
        end_anchor = np.zeros(num_states, dtype=np.int64)  # the nearest end at or above
        for s in order:  # parents come first
            p = trie.parent[s]
            node_score[s] = node_score[p] + trie.boost[s]
            end_anchor[s] = s if trie.is_end[s] else end_anchor[p]
        pending = node_score - node_score[end_anchor]
        out = np.zeros(num_states)  # completed terms' credit on reaching a state
        for s in order:  # fail targets come first
            own = node_score[s] - node_score[end_anchor[trie.parent[s]]] if trie.is_end[s] else 0.0
            out[s] = own + out[fail[s]]
        gains = out[goto] + pending[goto] - pending[:, None]
        # the end of a hypothesis: terms completed by a word boundary there count, the match
        # still in progress is abandoned
        end_gains = (out[goto[:, boundary]] if boundary is not None else 0.0) - pending
        return cls(tuple(terms), tuple(seqs), vocab_size, class_of, goto,
                   gains.astype(np.float32), end_gains.astype(np.float32),
                   pending.astype(np.float32), boundary_id)

    def tables(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The tables as tensors on ``device`` (made once per device)."""
        key = str(device)
        tables = self._device_tables.get(key)
        if tables is None:
            tables = {name: torch.from_numpy(np.ascontiguousarray(getattr(self, name))).to(device)
                      for name in ("class_of", "goto", "gains", "end_gains", "pending")}
            self._device_tables[key] = tables
        return tables

    def score(self, tokens: Sequence[int]) -> float:
        """What a whole hypothesis of ``tokens`` earns (its steps plus its end): the boosts of
        the terms it contains; for tests and diagnostics."""
        state, total = WORD_START, 0.0
        for token in tokens:
            c = int(self.class_of[token])
            total += float(self.gains[state, c])
            state = int(self.goto[state, c])
        return total + float(self.end_gains[state])


def _goto_table(trie: _Trie, num_classes: int, boundary: int | None
                ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(S, U) next state of every state and class (Aho-Corasick: a child, else the fail
    state's next), the fail states and a breadth-first order of the trie's states.

    A term starts only at a word start: state 0's row leads a class no term starts with to
    1 (mid-word), the boundary to 0; state 1 stays until a boundary. A broken match falls back
    to the longest suffix of what it read that starts a word and is a prefix of a term."""
    num_states = len(trie.parent)
    goto = np.zeros((num_states, num_classes), dtype=np.int64)
    fail = np.zeros(num_states, dtype=np.int64)
    if boundary is not None:
        goto[WORD_START, :] = MID_WORD
        goto[MID_WORD, :] = MID_WORD
        goto[:2, boundary] = WORD_START
    for c, child in trie.children[WORD_START].items():
        goto[WORD_START, c] = child
        fail[child] = WORD_START if boundary is None or c == boundary else MID_WORD
    order = list(trie.children[WORD_START].values())
    i = 0
    while i < len(order):
        s = order[i]
        i += 1
        goto[s] = goto[fail[s]]
        for c, child in trie.children[s].items():
            goto[s, c] = child
            fail[child] = goto[fail[s], c]
            order.append(child)
    return goto, fail, order


@dataclass(frozen=True)
class ContextBatch:
    """The context graphs of one search's rows, as views into a `ContextStore`'s tables.

    Attributes:
        class_of, goto, gains: the store's flat tables.
        class_base: (B,) int64 where each row's class map starts in ``class_of``.
        base: (B,) int64 where each row's (S, U) tables start in ``goto`` / ``gains``.
        width: (B,) int64 each row's number of classes U.
    """

    class_of: torch.Tensor
    goto: torch.Tensor
    gains: torch.Tensor
    class_base: torch.Tensor
    base: torch.Tensor
    width: torch.Tensor

    def step(self, ctx_state: torch.Tensor, tokens: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, K, C) the gain and next state of each hypothesis (``ctx_state`` (B, K))
        extended by each candidate token (``tokens`` (B, C))."""
        cls = torch.take(self.class_of, self.class_base[:, None] + tokens)  # (B, C)
        row = self.base[:, None] + ctx_state * self.width[:, None]  # (B, K)
        index = row.unsqueeze(2) + cls.unsqueeze(1)
        return torch.take(self.gains, index), torch.take(self.goto, index)


class ContextStore:
    """Every stream's context graph of one decoder, in flat tables on its device.

    A graph is stored once however many states use it (``add`` / ``remove`` count them);
    the tables are rebuilt when a graph comes or goes (hotwords change rarely), and a
    search's rows look theirs up through a `ContextBatch`. Rows with no graph use an
    empty one (no classes, no gains).
    """

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.empty = ContextGraph.from_tokens((), (), vocab_size)
        self._users: dict[int, tuple[ContextGraph, int]] = {}  # id -> (graph, states using it)
        self._offsets: dict[int, tuple[int, int, int]] = {}  # id -> (class base, base, width)
        self._flat: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._batch_cache: tuple[tuple[int, ...], ContextBatch] | None = None

    @property
    def in_use(self) -> bool:
        """Whether some state has a graph."""
        return bool(self._users)

    def add(self, graph: ContextGraph) -> None:
        if graph.vocab_size != self.vocab_size:
            raise ValueError(f"a context graph of {graph.vocab_size} units for a "
                             f"{self.vocab_size}-unit model")
        found = self._users.get(id(graph))
        self._users[id(graph)] = (graph, 1 if found is None else found[1] + 1)
        if found is None:
            self._flat = None

    def remove(self, graph: ContextGraph) -> None:
        graph_, count = self._users[id(graph)]
        if count > 1:
            self._users[id(graph)] = (graph_, count - 1)
        else:
            del self._users[id(graph)]
            self._flat = None

    def batch(self, graphs: Sequence[ContextGraph | None]) -> ContextBatch | None:
        """The lookup of a search whose row ``b`` has ``graphs[b]`` (None: none); None when
        no row has one."""
        if not any(g is not None for g in graphs):
            return None
        if self._flat is None:
            self._rebuild()
        key = tuple(0 if g is None else id(g) for g in graphs)
        cached = self._batch_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        rows = [self._offsets[k] for k in key]
        offsets = torch.tensor(rows, dtype=torch.int64).to(self.device)  # (B, 3)
        assert self._flat is not None
        batch = ContextBatch(*self._flat, class_base=offsets[:, 0].contiguous(),
                             base=offsets[:, 1].contiguous(), width=offsets[:, 2].contiguous())
        self._batch_cache = (key, batch)
        return batch

    def _rebuild(self) -> None:
        graphs = [(0, self.empty)] + [(k, g) for k, (g, _) in self._users.items()]
        classes, gotos, gains = [], [], []
        class_base = base = 0
        self._offsets = {}
        for key, graph in graphs:
            self._offsets[key] = (class_base, base, graph.num_classes)
            classes.append(graph.class_of)
            gotos.append(graph.goto.reshape(-1))
            gains.append(graph.gains.reshape(-1))
            class_base += graph.vocab_size
            base += graph.goto.size
        self._flat = tuple(torch.from_numpy(np.concatenate(parts)).to(self.device)
                           for parts in (classes, gotos, gains))  # type: ignore[assignment]
        self._batch_cache = None


MAX_PROMPT_CHARS = 1000  # a stream's own prompt text (Whisper's previous-text prompt)


@dataclass(frozen=True, eq=False)
class Hotwords:
    """What a stream asked to be biased towards, ready for both passes.

    Attributes:
        terms: its hotwords (`parse_hotwords`).
        graph: their context graph for the CTC search; None without terms or where the
            first pass cannot use one (greedy search, a transducer model).
        prompt: free text for the second pass's previous-text prompt (OpenAI's ``prompt``),
            before the terms.
    """

    terms: tuple[Hotword, ...] = ()
    graph: ContextGraph | None = None
    prompt: str = ""

    @classmethod
    def build(cls, value: object, tokenizer: Any = None, prompt: str = "",
              param: str = "hotwords") -> Hotwords:
        """A stream's hotwords from a client's ``value`` (`parse_hotwords`) and ``prompt``;
        with ``tokenizer`` (the CTC model's, when its search can use a graph) their graph.

        Raises:
            HotwordError: bad terms (`parse_hotwords`, `term_tokens`) or a prompt too long.
        """
        terms = parse_hotwords(value, param)
        prompt = " ".join(str(prompt or "").split())
        if len(prompt) > MAX_PROMPT_CHARS:
            raise HotwordError(f"prompt of {len(prompt)} characters; at most "
                               f"{MAX_PROMPT_CHARS}")
        graph = ContextGraph.build(terms, tokenizer) if terms and tokenizer is not None else None
        return cls(terms, graph, prompt)

    @property
    def phrases(self) -> tuple[str, ...]:
        return tuple(t.phrase for t in self.terms)

    def whisper_prompt(self) -> str:
        """The text Whisper is prompted with: the stream's prompt, then its terms as a
        glossary ("Glossary: Brenvik, Taloria."; a bare list of names made tiny.en write the
        transcript itself as a list of capitalised words on the tune sentences)."""
        glossary = f"Glossary: {', '.join(self.phrases)}." if self.phrases else ""
        return " ".join(p for p in (self.prompt, glossary) if p)

    def to_json(self) -> list[dict[str, Any]]:
        return [t.to_json() for t in self.terms]

    def __bool__(self) -> bool:
        return bool(self.terms or self.prompt)
