"""Whisper's output projection, ``logits = h @ E^T`` with the tied token embedding E (tiny.en:
51,864 x 384, 80 MB in float32), through whichever CPU BLAS does a decode step's few rows faster.

A beam-5 step multiplies 5 rows by all of E; that product is a third to a half of a final's
decode on CPU. Its speed depends on the BLAS, the CPU and the thread count: on a 2-vCPU AVX2
AMD EPYC torch's GEMM takes 27-44 ms for 5-8 rows against 17-23 ms for numpy's OpenBLAS on one
thread reading the same (d, V) storage, and whole beam-5 finals of read speech were 1.16-1.17x
faster with it (torch on one thread or on two; the same texts). On another CPU torch's BLAS may
be the faster, so ``LogitsProjection`` times both the first time it projects a given number of
rows on a given thread count, and keeps the faster. OpenBLAS always runs on one thread (with
its own pool beside torch's, the two fought over the cores: whole decodes 1.5x slower); anything
else (a GPU, another dtype, a prefill's many rows, a layout numpy cannot read without a copy)
goes through torch.

The "int8" backend stores E as int8 with one scale per token (symmetric, absmax / 127) and
quantizes each product's rows on the fly (`Int8Weight`): a quarter of the bytes per step, and
on the same EPYC 5 rows took 4-7 ms against 24-30 ms for torch's float32. Two int8 kernels
serve it, timed against each other when the weight is packed (`pack_int8`): oneDNN's int8
matmul (the matrix units' int8 on a CPU with AMX: 40 rows, eight segments' beams searched
together, in 1.8 ms against 6.5 ms on a Sapphire Rapids core) and fbgemm's dynamic int8
linear (torch's quantized ``linear_dynamic``). On an x86 CPU without AMX only fbgemm is
packed (`int8_kernels`). Those logits are off by ~1.5% of their range, enough to
re-rank close candidates (alone, they cost the finals 7 more word errors in 2,500), so each
row's best ``RESCORED`` tokens by them are computed again in float32 from E (a gather of 64
columns per beam; with it the finals over 2,500 words had float32's 192 errors, 3 of 137
texts a word apart): the candidates a beam or greedy step picks from carry float32 logits.
It applies on CPU to a float32 or bfloat16 weight (a bfloat16 model's: its int8 copy is
quantized from the bfloat16 values, the rescoring multiplies them in float32) where this torch
has the quantized ops; elsewhere (a GPU, a torch without them) it falls back to "auto".

A beam step needs only each beam's best few tokens and their log-probabilities
(`LogitsProjection.top_log_probs`): the suppressed tokens are set to -inf before the 64 are
chosen, the step's candidates are the best of the rescored 64, and the normaliser is one
``log_softmax`` pass. Ranking the vocabulary a second time and adding the suppression mask to
every logit are gone: on a Sapphire Rapids core batched beam-5 finals took 6-14 % less time,
with the same texts (`bench/beam_batches.py`, docs/benchmarks.md).

For int8 logits (and a bfloat16 model's) the weight is best stored contiguous (V, d), as
`load_for_decoding` stores it: the rescoring then gathers 64 rows per beam, 1 ms for 30 rows (a
beam of 5 over 6 segments) on a Sapphire Rapids core against 11 ms for 64 columns of the
(d, V) storage. A beam step's whole `LogitsProjection.top_log_probs` for those 30 rows took
7.5 ms with the oneDNN int8 kernel and the two-pass top-64 (`top_indices`) against 12.5 ms
with fbgemm's kernel and one ``topk`` over the vocabulary (same core, 2026-12-06); for 5
rows, 2.3 against 2.7 ms.
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from threadpoolctl import ThreadpoolController

from oasr import cpu

logger = logging.getLogger(__name__)

LOGITS_BACKENDS = ("auto", "torch", "blas", "int8")
INT8_MAX = 127  # symmetric int8 weights: [-127, 127]
RESCORED = 64  # per row, the int8 logits' best this many are computed again in float32
MAX_BLAS_ROWS = 16  # a beam step's rows, or a greedy batch's; a prefill's many rows stay in torch
ROW_BUCKETS = (1, 2, 4, 8, MAX_BLAS_ROWS)  # rows are timed per bucket (the bucket's size)
BLAS_MARGIN = 0.9  # OpenBLAS is kept only when it takes at most this share of torch's time
TIMED_ROUNDS = 5  # alternated rounds per choice, after one untimed call of each
TOP_GROUP = 32  # vocabulary entries per group of `top_indices`' first pass

Timer = Callable[[str, Callable[[], object]], float]  # (backend, one call) -> seconds


def _seconds(backend: str, fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _median_seconds(runs: dict[str, Callable[[], object]], timer: Timer) -> dict[str, float]:
    """Each run's median seconds over ``TIMED_ROUNDS`` rounds, the runs alternated within a
    round, after one untimed call of each; ``timer`` times one call."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():
        fn()
    for _ in range(TIMED_ROUNDS):
        for name, fn in runs.items():
            seconds[name].append(timer(name, fn))
    return {name: statistics.median(values) for name, values in seconds.items()}


def _bucket(rows: int) -> int:
    return next(b for b in ROW_BUCKETS if rows <= b)


def _check_backend(backend: str) -> None:
    if backend not in LOGITS_BACKENDS:
        raise ValueError(f"logits backend must be one of {LOGITS_BACKENDS}, got {backend!r}")


class LogitsProjection:
    """``h`` (B, T, d) -> logits (B, T, V) float32 against the embedding ``weight`` (V, d).

    ``backend``: "torch" always uses ``F.linear``; "blas" uses numpy's BLAS wherever it can
    read the weight without a copy (CPU, float32, stored as the transpose of a contiguous
    (d, V) matrix, as ``transpose_embedding_storage`` leaves it) and the step has at most
    ``MAX_BLAS_ROWS`` rows; "auto" does the same only where its timing chose it. The choices
    are kept per (torch's thread count, row bucket) for the weight's current storage. numpy's
    BLAS is held to one thread for each product (and given back its pool size after).
    ``timer`` times one call of a backend (tests pass their own). "int8" multiplies in int8
    wherever `int8_applies` (the weight packed once per storage, `pack_int8`: an in-place
    change of the weight is not seen), else as "auto".
    """

    def __init__(self, weight: torch.Tensor, backend: str = "auto",
                 timer: Timer = _seconds) -> None:
        _check_backend(backend)
        self.weight = weight
        self.backend = backend
        self.timer = timer
        self.choices: dict[tuple[int, int], str] = {}  # (threads, bucket) -> "torch" | "blas"
        self._storage: int | None = None  # the weight's data_ptr the choices and view are of
        self._view: np.ndarray | None = None  # the weight's (d, V) storage, as numpy reads it
        self._blas_pool: ThreadpoolController | None = None  # numpy's BLAS pools
        self._int8_storage: int | None = None  # the weight's data_ptr the packed int8 is of
        self._int8: Int8Weight | None = None  # the packed int8 weight (None: not here)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if self.backend == "int8" and self.int8_applies(h):
            packed = self._packed_int8()
            if packed is not None:
                return self._int8_logits(h, packed)
        rows = h.shape[0] * h.shape[1]
        if self.backend != "torch" and self._blas_applies(h, rows) and self._pick(rows) == "blas":
            return self._blas(h)
        return F.linear(h, self.weight).float()

    def int8_applies(self, h: torch.Tensor) -> bool:
        """Whether an int8 product serves ``h``: on CPU, the weight int8's, no grad."""
        return h.device.type == "cpu" and self._int8_weight() and not torch.is_grad_enabled()

    def _int8_weight(self) -> bool:
        """Whether the weight is one to pack in int8: float32 or bfloat16, on CPU."""
        return (self.weight.device.type == "cpu"
                and self.weight.dtype in (torch.float32, torch.bfloat16))

    def _int8_logits(self, h: torch.Tensor, packed: Int8Weight) -> torch.Tensor:
        """Every token's logit in int8, then each row's best ``RESCORED`` again in float32:
        the candidates a search ranks get float32 logits; the int8 rest only add to the
        softmax's normaliser, where their error is a small share of a small mass."""
        logits, _, _ = self._int8_rescored(h.reshape(-1, h.shape[-1]), packed, None)
        return logits.view(*h.shape[:-1], -1)

    def _int8_rescored(self, h: torch.Tensor, packed: Int8Weight, suppressed: torch.Tensor | None,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h (N, d) -> logits (N, V) float32, int8 products but for each row's best
        ``RESCORED`` tokens (N, M), whose float32 logits (N, M) are also returned. The
        ``suppressed`` ids are -inf before the best are chosen, so all of them are tokens a
        search may pick."""
        rows = h.float().contiguous()  # (N, d)
        logits = packed(rows)  # (N, V)
        if suppressed is not None:
            logits.index_fill_(-1, suppressed, float("-inf"))
        top = top_indices(logits, min(RESCORED, logits.shape[-1]))  # (N, M)
        exact = self._exact(rows, top)
        if suppressed is not None:  # fewer than M tokens left: the suppressed stay -inf
            exact.masked_fill_(logits.gather(-1, top).isneginf(), float("-inf"))
        return logits.scatter_(-1, top, exact), top, exact

    def top_log_probs(self, h: torch.Tensor, suppressed: torch.Tensor,
                      k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's ``k`` likeliest next tokens, best first: their log-probabilities (N, k)
        float32 and their ids (N, k), for decoder states ``h`` (N, d), with the ``suppressed``
        ids (int64) out of the vocabulary.

        The softmax is over every token, as ``log_softmax`` of the logits (this projection's,
        the suppressed at -inf) gives it; only its ``k`` best are returned, so a beam step
        ranks ``k`` candidates per row, not the vocabulary. With int8 products (``k`` within
        ``RESCORED``) they are the best of the float32-rescored tokens (no second top-k over
        the vocabulary).
        """
        if self.backend == "int8" and k <= RESCORED and self.int8_applies(h):
            packed = self._packed_int8()
            if packed is not None:
                logits, top, exact = self._int8_rescored(h, packed, suppressed)
                place = exact.topk(k, dim=-1).indices
                ids = top.gather(-1, place)
                return torch.log_softmax(logits, dim=-1).gather(-1, ids), ids
        logits = self(h.unsqueeze(1)).squeeze(1)  # (N, V) float32
        logits.index_fill_(-1, suppressed, float("-inf"))
        best, ids = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
        return best, ids

    def _exact(self, rows: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        """(N, M) float32 logits of the ``top`` (N, M) tokens of each of ``rows`` (N, d)."""
        weight = self.weight
        if weight.t().is_contiguous():  # stored (d, V), as on CPU: gather its columns
            columns = weight.t().index_select(1, top.flatten()).float()  # (d, N * M)
            return torch.einsum("nd,dnm->nm", rows, columns.view(weight.shape[1], *top.shape))
        picked = weight.index_select(0, top.flatten()).view(*top.shape, -1)  # (N, M, d) rows
        return torch.bmm(picked.float(), rows.unsqueeze(-1)).squeeze(-1)

    def _packed_int8(self) -> Int8Weight | None:
        if self._int8_storage != self.weight.data_ptr():
            self._int8_storage = self.weight.data_ptr()
            self._int8 = pack_int8(self.weight, self.timer)
        return self._int8

    def serve(self, backend: str, beam_size: int) -> None:
        """Serve with ``backend`` from now on, its choices made (or its int8 weight packed)
        now for a greedy row and a beam's rows, not on a live decode."""
        _check_backend(backend)
        self.backend = backend
        self.prepare(tuple(sorted({1, beam_size})))

    @torch.inference_mode()
    def prepare(self, row_counts: tuple[int, ...]) -> None:
        """Make the choices for these row counts on the current thread count now, or pack the
        int8 weight (a decoder about to serve calls it, so that no decode waits for either)."""
        if self.backend == "int8" and self._int8_weight() and self._packed_int8() is not None:
            return  # every product is int8's: nothing to time
        if self.backend not in ("auto", "int8"):
            return
        for rows in row_counts:
            h = torch.zeros(rows, 1, self.weight.shape[1], dtype=self.weight.dtype,
                            device=self.weight.device)
            if self._blas_applies(h, rows):
                self._pick(rows)

    def _blas_applies(self, h: torch.Tensor, rows: int) -> bool:
        weight = self.weight
        return (rows <= MAX_BLAS_ROWS and h.device.type == "cpu" and h.dtype == torch.float32
                and weight.dtype == torch.float32 and weight.device.type == "cpu"
                and weight.t().is_contiguous() and not torch.is_grad_enabled())

    def _pick(self, rows: int) -> str:
        if self.backend == "blas":
            return "blas"
        self._weight_view()  # a weight stored anew drops the choices made for the old one
        key = (torch.get_num_threads(), _bucket(rows))
        choice = self.choices.get(key)
        if choice is None:
            choice = self.choices[key] = self._time(*key)
        return choice

    def _time(self, threads: int, rows: int) -> str:
        """Time both on ``rows`` rows, alternated; "blas" only when clearly faster."""
        h = torch.randn(rows, 1, self.weight.shape[1])
        times = _median_seconds({"torch": lambda: F.linear(h, self.weight),
                                 "blas": lambda: self._blas(h)}, self.timer)
        torch_s, blas_s = times["torch"], times["blas"]
        choice = "blas" if blas_s <= BLAS_MARGIN * torch_s else "torch"
        logger.info("whisper logits, %d rows on %d threads: torch %.1f ms, OpenBLAS %.1f ms: %s",
                    rows, threads, torch_s * 1e3, blas_s * 1e3, choice)
        return choice

    def _weight_view(self) -> np.ndarray:
        """The weight as numpy's (d, V) view; a weight stored anew is read, and timed, again."""
        if self._view is None or self._storage != self.weight.data_ptr():
            self._view = self.weight.detach().t().numpy()
            self._storage = self.weight.data_ptr()
            self.choices.clear()
        return self._view

    def _blas(self, h: torch.Tensor) -> torch.Tensor:
        view = self._weight_view()
        if self._blas_pool is None:
            self._blas_pool = ThreadpoolController().select(user_api="blas")
        rows = h.reshape(-1, h.shape[-1]).contiguous().numpy()  # (B*T, d)
        with self._blas_pool.limit(limits=1):
            logits = np.matmul(rows, view)  # (B*T, V)
        return torch.from_numpy(logits).view(*h.shape[:-1], -1)  # (B, T, V)


def best_indices(logits: torch.Tensor) -> torch.Tensor:
    """Each row's index of its largest entry over the last dim, the first of equal ones (and
    a NaN's), as ``argmax`` gives it: through ``max``'s indices, which torch computes about 3x
    faster on CPU (8 rows of 51,864: 0.2 against 0.6 ms on a Sapphire Rapids core)."""
    return logits.max(dim=-1).indices


def top_indices(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The indices (N, k) of each row's ``k`` largest ``logits`` (N, V), largest first, as
    ``topk`` gives them (equal values in either's order), in two passes over a small share:
    the maximum of each group of ``TOP_GROUP`` consecutive entries, the ``k`` best groups,
    then the best ``k`` of those groups' entries (and of the few past the last whole group).
    A row's ``k`` largest lie in its ``k`` groups of largest maxima (a group holding one has a
    maximum at least as large), so this is exact. ``topk`` over the whole vocabulary took 4 ms
    for 40 rows of 51,864 on a Sapphire Rapids core, this 2.6 ms."""
    rows, vocab = logits.shape
    groups = vocab // TOP_GROUP
    if groups < k:
        return logits.topk(k, dim=-1).indices
    whole = groups * TOP_GROUP
    maxima = logits[:, :whole].reshape(rows, groups, TOP_GROUP).amax(dim=-1)  # (N, groups)
    best = maxima.topk(k, dim=-1).indices  # (N, k)
    within = torch.arange(TOP_GROUP, device=logits.device)
    columns = (best.unsqueeze(-1) * TOP_GROUP + within).reshape(rows, k * TOP_GROUP)
    if whole < vocab:
        rest = torch.arange(whole, vocab, device=logits.device).expand(rows, -1)
        columns = torch.cat([columns, rest], dim=1)
    place = logits.gather(1, columns).topk(k, dim=-1).indices  # (N, k)
    return columns.gather(1, place)


INT8_KERNELS = ("onednn", "fbgemm")
INT8_MAX_ERROR = 0.05  # a kernel's products off by more than this share of a row's range: refused
INT8_TIMED_ROWS = (5, 40)  # a beam's rows, and eight segments' beams searched together


def int8_kernels() -> tuple[str, ...]:
    """The int8 kernels `pack_int8` packs and times on this CPU: both, except oneDNN's on an
    x86 CPU without AMX tiles, where its int8 product is not the fast one and can be very slow:
    on a 2-vCPU AMD EPYC with AVX512-VNNI and no AMX (2026-12-07, one thread) it took 2.6 s
    for 5 rows and 21 s for 40 against fbgemm's 2 and 6-9 ms, and its packing 4.6 s, so timing
    it made each second-pass process start about two minutes late; on a Sapphire Rapids Xeon
    held to AVX2 it took 26-37 ms for 40 rows against fbgemm's 5-7."""
    if cpu.is_x86() and not cpu.has_amx_tiles():
        return ("fbgemm",)
    return INT8_KERNELS


class Int8Weight:
    """The embedding E (V, d) in int8, one scale per token (symmetric, absmax / 127), packed
    for one int8 GEMM kernel; ``int8_weight(rows)`` is the product of float32 rows (N, d) with
    it, (N, V) float32.

    ``onednn``: oneDNN's int8 matmul (the matrix units' int8 where the CPU has AMX, VNNI
    elsewhere); each row is quantized by its own absmax, so a row's logits do not depend on
    the rows multiplied beside it. ``fbgemm``: torch's dynamic int8 linear, whose rows share
    one uint8 range per product. Building one runs a product and checks it against float32
    (`_check`), so a kernel that packs but cannot multiply, or multiplies wrongly, fails here.

    Raises:
        AttributeError, NotImplementedError, RuntimeError: the kernel is not in this torch or
            cannot run on this CPU.
    """

    def __init__(self, weight: torch.Tensor, kernel: str) -> None:
        if kernel not in INT8_KERNELS:
            raise ValueError(f"int8 kernel must be one of {INT8_KERNELS}, got {kernel!r}")
        w = weight.detach().float().contiguous()
        scales = w.abs().amax(dim=1).clamp_min(1e-12) / INT8_MAX  # (V,)
        zero_points = torch.zeros(w.shape[0], dtype=torch.long)
        self.kernel = kernel
        self._scales = scales
        self._zero_points = zero_points
        if kernel == "onednn":
            q = torch.round(w / scales[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
            self._packed = torch.ops.onednn.qlinear_prepack(q, None)
        else:
            with warnings.catch_warnings():  # torch marks its quantized tensors as deprecated
                warnings.simplefilter("ignore", UserWarning)
                q = torch.quantize_per_channel(w, scales.double(), zero_points, 0, torch.qint8)
                self._packed = torch.ops.quantized.linear_prepack(q, None)
        self._check(w)

    def _check(self, w: torch.Tensor) -> None:
        """One product now, against float32's on rows like a decoder's states (near some
        tokens' embeddings): a kernel that cannot multiply here, or whose results are off by
        more than ``INT8_MAX_ERROR`` of a row's range (an int8 path that saturates on this
        CPU), is refused here, not found in a live decode."""
        picks = torch.linspace(0, w.shape[0] - 1, 8).long()
        rows = (w[picks] * 3.0).contiguous()  # (8, d)
        exact = rows @ w.t()
        spread = (exact.amax(-1) - exact.amin(-1)).clamp_min(1e-12)
        error = ((self(rows) - exact).abs().amax(-1) / spread).max().item()
        if not error <= INT8_MAX_ERROR:
            raise RuntimeError(f"{self.kernel} int8 products are off by {error:.1%} of a row's "
                               f"range here (at most {INT8_MAX_ERROR:.0%} kept)")

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (N, d) float32, contiguous -> logits (N, V) float32."""
        if self.kernel == "fbgemm":
            return torch.ops.quantized.linear_dynamic(rows, self._packed, True)
        absmax = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)  # (N, 1)
        q = torch.round(rows * (INT8_MAX / absmax)).to(torch.int8)
        logits = torch.ops.onednn.qlinear_pointwise(
            q, 1.0 / INT8_MAX, 0, self._packed, self._scales, self._zero_points, None, 1.0, 0,
            torch.float32, "none", [], "")
        return logits.mul_(absmax)


def pack_int8(weight: torch.Tensor, timer: Timer = _seconds,
              candidates: tuple[str, ...] | None = None) -> Int8Weight | None:
    """``weight`` (V, d) packed for the faster int8 kernel this torch and CPU run (`Int8Weight`:
    the ``candidates``, default `int8_kernels`, are timed on a beam's rows and on eight beams'
    rows, alternated, ``timer`` timing one call); None (logged) where none runs.

    On a Sapphire Rapids core (AMX-int8) oneDNN took 1.8 ms for 40 rows against fbgemm's
    6.5 ms, and 1.1 against 1.2 ms for 5 rows; the choice is made per machine, not assumed."""
    kernels = []
    for kernel in candidates if candidates is not None else int8_kernels():
        try:
            kernels.append(Int8Weight(weight, kernel))
        except (AttributeError, NotImplementedError, RuntimeError) as exc:
            logger.info("whisper logits: the %s int8 kernel is not available here (%s)", kernel, exc)
    if not kernels:
        logger.warning("whisper logits: int8 is not available in this torch; float32")
        return None
    if len(kernels) == 1:
        return kernels[0]
    times: dict[str, float] = {k.kernel: 0.0 for k in kernels}
    for rows in INT8_TIMED_ROWS:
        h = torch.randn(rows, weight.shape[1])
        medians = _median_seconds({k.kernel: functools.partial(k, h) for k in kernels}, timer)
        for name, seconds in medians.items():
            times[name] += seconds
    chosen = min(kernels, key=lambda k: times[k.kernel])
    logger.info("whisper logits, int8 kernels (%s rows): %s; %s kept",
                " + ".join(map(str, INT8_TIMED_ROWS)),
                ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in times.items()), chosen.kernel)
    return chosen
