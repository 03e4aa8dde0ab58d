"""The second-pass worker's scheduling: finals that carry the previous segment as context
(``EngineConfig.final_context_s``), and which finals a backlog decodes fast.

The worker decodes a segment together with the previous segment's audio, forcing that
segment's final text as the transcript so far; the final is what follows it. A segment whose
previous final is still being decoded waits for it. Driven here through a scripted decoder
(the worker's side) and through the engine with Whisper (the whole path).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import Collector, live_stream, run_until_idle_with_finals, stream_all

from oasr.audio import FrameEnergy
from oasr.decoding import EndpointConfig, EndpointRule, Hypothesis
from oasr.engine import ASREngine, EngineConfig
from oasr.engine.commands import AppendAudio, EndStream, OpenStream
from oasr.engine.events import Final, Partial
from oasr.engine.families.base import FrameTiming
from oasr.engine.live.agreement import RefineState
from oasr.engine.live.finals import FinalPublisher, NoiseCut
from oasr.engine.live.quiet_tail import QuietTail
from oasr.engine.live.refine import RefineConfig
from oasr.engine.live.state import HeardPause, LiveStream, SegmentAudio, SpokenContext
from oasr.engine.second_pass.guard import FirstPassGuard, GuardVerdict
from oasr.engine.second_pass.worker import (
    RefineDone,
    RefineJob,
    SecondPassDone,
    SecondPassJob,
    SecondPassWorker,
)
from oasr.engine.snapshot import SecondPassSnapshot
from oasr.models.whisper.no_speech import NoSpeechRule
from oasr.text.wer import normalize_transcript

RATE = 16_000


class ScriptedDecoder:
    """Words as tokens (one id per distinct word); each request "decodes" to its prefix and
    then the words scripted for it, once ``release(job_id)`` lets it finish."""

    max_new_tokens = 100

    def __init__(self, scripts: dict[int, str]) -> None:
        self.scripts = scripts
        self.vocab: dict[str, int] = {}
        self.submitted: dict[int, tuple[int, tuple[int, ...]]] = {}  # id -> (samples, prefix)
        self.fast: dict[int, bool] = {}
        self.drafts: dict[int, tuple[int, ...]] = {}
        self.released: set[int] = set()
        self._pending: list[int] = []
        self._lock = threading.Lock()
        self.gate = threading.Event()  # the worker's loop waits here while it is clear
        self.gate.set()

    def release(self, job_id: int) -> None:
        with self._lock:
            self.released.add(job_id)

    def text_tokens(self, text: str) -> list[int]:
        return [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]

    def text_of(self, tokens: tuple[int, ...]) -> str:
        words = {i: w for w, i in self.vocab.items()}
        return " ".join(words[t] for t in tokens)

    def submit(self, job_id: int, audio: np.ndarray, prefix: tuple[int, ...] = (),
               background: bool = False, fast: bool = False,
               draft: tuple[int, ...] = ()) -> None:
        self.submitted[job_id] = (len(audio), tuple(prefix))
        self.fast[job_id] = fast
        self.drafts[job_id] = tuple(draft)
        self._pending.append(job_id)

    def has_work(self) -> bool:
        self.gate.wait()
        return bool(self._pending)

    def abort(self, job_id: int) -> bool:
        if job_id in self._pending:
            self._pending.remove(job_id)
        return True

    def step(self) -> list[object]:
        with self._lock:
            ready = [j for j in self._pending if j in self.released]
        results = []
        for job_id in ready:
            self._pending.remove(job_id)
            tokens = self.submitted[job_id][1] + tuple(self.text_tokens(self.scripts[job_id]))
            results.append(_Result(job_id, tokens, self.text_of(tokens)))
        return results


class _Result:
    def __init__(self, request_id: int, tokens: tuple[int, ...], text: str) -> None:
        self.request_id, self.tokens, self.text = request_id, tokens, text
        self.no_speech_prob, self.avg_log_prob, self.failed = 0.01, -0.2, False


def _voice(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def _job(job_id: int, segment: np.ndarray, context: np.ndarray | None = None,
         context_job: int | None = None, context_text: str = "") -> SecondPassJob:
    before = np.zeros(0, np.float32) if context is None else context
    return SecondPassJob(job_id, 1, job_id - 1, np.concatenate([before, segment]), 0.0,
                         ctc_text=f"ctc {job_id}", context=context_text,
                         context_samples=len(before), context_job=context_job)


def _worker(decoder: ScriptedDecoder) -> tuple[SecondPassWorker, queue.Queue[SecondPassDone]]:
    out: queue.Queue[SecondPassDone] = queue.Queue()
    return SecondPassWorker.on_thread(decoder, out.put, max_backlog=8), out


def test_a_segment_waits_for_the_previous_final_and_continues_its_text() -> None:
    decoder = ScriptedDecoder({1: "The first sentence.", 2: "And the second."})
    worker, out = _worker(decoder)
    first, second = _voice(2.0), _voice(1.5)
    worker.try_submit(_job(1, first))
    worker.try_submit(_job(2, second, context=first, context_job=1))
    with pytest.raises(queue.Empty):
        out.get(timeout=0.3)
    assert 2 not in decoder.submitted  # waits for segment 1's text
    decoder.release(1)
    assert out.get(timeout=5).text == "The first sentence."
    decoder.release(2)
    done = out.get(timeout=5)
    worker.stop()
    assert done.text == "And the second."  # what follows the context, not the context
    samples, prefix = decoder.submitted[2]
    assert samples == len(first) + len(second)
    assert decoder.text_of(prefix) == "The first sentence."
    assert worker.num_with_context == 1 and worker.backlog == 0


def test_a_refinement_decodes_after_its_context_and_answers_what_follows_it() -> None:
    decoder = ScriptedDecoder({1: "The first sentence.", 2: "and the"})
    worker, out = _worker(decoder)
    first, second = _voice(2.0), _voice(1.5)
    worker.try_submit(_job(1, first))
    decoder.release(1)
    assert out.get(timeout=5).text == "The first sentence."
    refine = RefineJob(2, 1, 1, np.concatenate([first, second]), (), 75,
                       context="The first sentence.", context_samples=len(first))
    assert worker.try_submit_refine(refine, max_in_flight=2)
    decoder.release(2)
    done = out.get(timeout=5)
    worker.stop()
    assert isinstance(done, RefineDone) and done.text == "and the"  # not the context's words
    assert decoder.text_of(done.tokens) == "and the"
    samples, prefix = decoder.submitted[2]
    assert samples == len(first) + len(second)
    assert decoder.text_of(prefix) == "The first sentence."


@pytest.mark.parametrize(("previous", "forced"), [
    ("hello there", "hello there"),
    # Whisper's unpunctuated style carries on to the finals forced after it: it goes on
    # after a full stop (`as_context`), the final itself keeps the text Whisper wrote
    ("the children played outside", "the children played outside.")])
def test_a_previous_final_already_out_is_used_at_once(previous: str, forced: str) -> None:
    decoder = ScriptedDecoder({1: previous, 2: "general"})
    decoder.release(1)
    decoder.release(2)
    worker, out = _worker(decoder)
    first = _voice(1.0)
    worker.try_submit(_job(1, first))
    assert out.get(timeout=5).text == previous
    worker.try_submit(_job(2, _voice(1.0), context=first, context_job=1))
    assert out.get(timeout=5).text == "general"
    worker.stop()
    assert decoder.text_of(decoder.submitted[2][1]) == forced


def test_a_rejected_previous_final_passes_on_the_text_it_published() -> None:
    decoder = ScriptedDecoder({1: "loop loop loop", 2: "fine"})

    class RejectFirst:
        def review(self, text: str, ctc_text: str, failed: bool,
                   hotwords: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
            if text.startswith("loop"):
                return GuardVerdict(ctc_text, "ctc", "failed")
            return GuardVerdict(text, "whisper", None)

    out: queue.Queue[SecondPassDone] = queue.Queue()
    worker = SecondPassWorker.on_thread(decoder, out.put, max_backlog=8, guard=RejectFirst())  # type: ignore[arg-type]
    first = _voice(1.0)
    worker.try_submit(_job(1, first))
    worker.try_submit(_job(2, _voice(1.0), context=first, context_job=1))
    decoder.release(1)
    decoder.release(2)
    assert out.get(timeout=5).text is None  # the final keeps its CTC text ...
    assert out.get(timeout=5).text == "fine"
    worker.stop()
    assert decoder.text_of(decoder.submitted[2][1]) == "ctc 1"  # ... which is the context


def test_an_aborted_previous_segment_leaves_the_next_one_without_context() -> None:
    decoder = ScriptedDecoder({2: "alone"})
    decoder.release(2)
    worker, out = _worker(decoder)
    first, second = _voice(1.0), _voice(1.2)
    worker.try_submit(_job(1, first))
    worker.try_submit(_job(2, second, context=first, context_job=1))
    worker.abort(1)
    done = out.get(timeout=5)
    worker.stop()
    assert (done.job_id, done.text) == (2, "alone")
    assert decoder.submitted[2] == (len(second), ())  # its own audio, nothing forced
    assert worker.backlog == 0


class EndsAfterContext(ScriptedDecoder):
    """Ends every transcript right after a forced context (as Whisper did after "He might
    even have been made amiable himself." with speech after it); decodes a job's script when
    nothing, or only the job's own committed words, are forced. Records every submission."""

    def __init__(self, scripts: dict[int, str], context: str) -> None:
        super().__init__(scripts)
        self.context = tuple(self.text_tokens(context))
        self.history: list[tuple[int, int, tuple[int, ...]]] = []  # (job, samples, prefix)

    def submit(self, job_id: int, audio: np.ndarray, prefix: tuple[int, ...] = (),
               background: bool = False, fast: bool = False,
               draft: tuple[int, ...] = ()) -> None:
        self.history.append((job_id, len(audio), tuple(prefix)))
        super().submit(job_id, audio, prefix, background, fast, draft)

    def step(self) -> list[object]:
        with self._lock:
            ready = [j for j in self._pending if j in self.released]
        results: list[object] = []
        for job_id in ready:
            self._pending.remove(job_id)
            prefix = self.submitted[job_id][1]
            ends = prefix[:len(self.context)] == self.context and len(self.context) > 0
            tokens = prefix + (() if ends else tuple(self.text_tokens(self.scripts[job_id])))
            results.append(_Result(job_id, tokens, self.text_of(tokens)))
        return results


def _guarded(decoder: ScriptedDecoder) -> tuple[SecondPassWorker, queue.Queue[SecondPassDone]]:
    out: queue.Queue[SecondPassDone] = queue.Queue()
    return SecondPassWorker.on_thread(decoder, out.put, max_backlog=8,
                                      guard=FirstPassGuard()), out


@pytest.mark.parametrize(("ctc", "alone", "final"), [
    # the CTC pass heard about what Whisper hears alone: that is the final
    ("an mister jon dash wood", "and mister john dashwood", "and mister john dashwood"),
    # what Whisper writes on applause alone is not what the CTC pass spelled there: the
    # decode after the context stands ("", which the guard lets be with one CTC word)
    ("three", "thank you", ""),
    ("try to try to avery are", "thank you", None),  # (3 CTC words: the guard keeps them)
])
def test_a_final_whisper_ends_at_its_context_is_decoded_again_on_its_own_audio(
        ctc: str, alone: str, final: str | None) -> None:
    decoder = EndsAfterContext({2: alone}, context="amiable himself")
    decoder.release(2)
    worker, out = _guarded(decoder)
    first, second = _voice(3.0), _voice(4.0)
    job = replace(_job(2, second, context=first, context_text="amiable himself"), ctc_text=ctc)
    worker.try_submit(job)
    done = out.get(timeout=5)
    worker.stop()
    assert (done.job_id, done.text) == (2, final)
    assert decoder.text_of(done.tokens) == (final or "")
    # with the context, then the segment's own audio with nothing forced
    assert [(j, n, decoder.text_of(p)) for j, n, p in decoder.history] == [
        (2, len(first) + len(second), "amiable himself"), (2, len(second), "")]
    assert worker.num_context_retries == 1 and worker.backlog == 0


def test_with_no_witness_the_decode_after_the_context_stands() -> None:
    # no CTC words, or no guard to compare with: two decodes that disagree, nothing to choose
    for ctc, guarded in (("", True), ("an mister jon", False)):
        decoder = EndsAfterContext({2: "and mister john"}, context="amiable himself")
        decoder.release(2)
        worker, out = _guarded(decoder) if guarded else _worker(decoder)
        job = replace(_job(2, _voice(2.0), context=_voice(3.0), context_text="amiable himself"),
                      ctc_text=ctc)
        worker.try_submit(job)
        done = out.get(timeout=5)
        worker.stop()
        assert done.text == "" and len(decoder.history) == 2, (ctc, guarded)


def test_a_refinement_whisper_ends_at_its_context_is_decoded_again_unless_it_is_silent() -> None:
    decoder = EndsAfterContext({3: "and mister", 4: "you", 5: "and mister john"},
                               context="amiable himself")
    for job_id in (3, 4, 5):
        decoder.release(job_id)
    worker, out = _guarded(decoder)
    first = _voice(3.0)
    # (job, segment, its own audio): 4 is another segment's, silent; 5 refines 3's segment
    for job_id, segment, own in ((3, 1, _voice(2.0)), (4, 2, np.zeros(2 * RATE, np.float32)),
                                 (5, 1, _voice(3.0))):
        refine = RefineJob(job_id, 1, segment, np.concatenate([first, own]), (), 50,
                           context="amiable himself", context_samples=len(first),
                           ctc_text="an mister jon")
        assert worker.try_submit_refine(refine, max_in_flight=2)
        done = out.get(timeout=5)
        assert isinstance(done, RefineDone) and not done.failed
        assert done.text == {3: "and mister", 4: "", 5: "and mister john"}[job_id]
        assert done.alone == (job_id != 4)  # shown, not committed (`Refiner.apply`)
    worker.stop()
    # the silent one is answered "" without a decode of its silence ("you" is never seen);
    # the segment whose refinement ended at the context is refined alone from then on
    assert [(j, n) for j, n, _ in decoder.history] == [
        (3, len(first) + 2 * RATE), (3, 2 * RATE), (4, len(first) + 2 * RATE), (5, 3 * RATE)]
    assert worker.num_context_retries == 3


def test_a_decode_with_committed_words_may_end_after_them() -> None:
    # the committed words were heard in this segment: ending after them is a transcript
    decoder = EndsAfterContext({5: "never"}, context="amiable himself")
    decoder.release(5)
    worker, out = _worker(decoder)
    committed = tuple(decoder.text_tokens("and mister"))
    first, own = _voice(3.0), _voice(2.0)
    refine = RefineJob(5, 1, 1, np.concatenate([first, own]), committed, 50,
                       context="amiable himself", context_samples=len(first))
    assert worker.try_submit_refine(refine, max_in_flight=2)
    done = out.get(timeout=5)
    worker.stop()
    assert done.text == "and mister"
    assert len(decoder.history) == 1 and worker.num_context_retries == 0


def test_a_context_too_long_for_the_decoder_is_left_out() -> None:
    decoder = ScriptedDecoder({2: "short"})
    decoder.release(2)
    worker, out = _worker(decoder)
    long_text = " ".join(f"w{i}" for i in range(60))  # over half the decoder's 100 tokens
    second = _voice(1.0)
    worker.try_submit(_job(2, second, context=_voice(3.0), context_text=long_text))
    assert out.get(timeout=5).text == "short"
    worker.stop()
    assert decoder.submitted[2] == (len(second), ())
    assert worker.num_with_context == 0


@pytest.mark.parametrize(("fast_backlog", "fast"), [(None, False), (8, False), (2, True)])
def test_a_backlog_beyond_the_fast_limit_is_decoded_fast(fast_backlog: int | None,
                                                         fast: bool) -> None:
    # a live server keeps up by decoding finals greedily once more than 2 wait; offline
    # (None) every final gets the full decode however many wait
    decoder = ScriptedDecoder({i: "x" for i in range(1, 6)})
    decoder.gate.clear()  # five finals arrive before the worker looks
    out: queue.Queue[SecondPassDone] = queue.Queue()
    worker = SecondPassWorker.on_thread(decoder, out.put, max_backlog=8, fast_backlog=fast_backlog)
    for job_id in range(1, 6):
        assert worker.try_submit(_job(job_id, _voice(0.5)))
    decoder.gate.set()
    for job_id in range(1, 6):
        decoder.release(job_id)
    for _ in range(5):
        out.get(timeout=5)
    worker.stop()
    assert [decoder.fast[j] for j in range(1, 6)] == [fast] * 5


whisper = pytest.importorskip("oasr.models.whisper")


def _cut_every(seconds: float) -> EndpointConfig:
    """A segment ends every ``seconds`` (the tiny random CTC model hears no pauses)."""
    rule = EndpointRule(must_contain_speech=False, min_trailing_silence_s=0.0,
                        min_utterance_length_s=seconds)
    return EndpointConfig(rule1=None, rule2=None, rule3=rule)


@pytest.mark.skipif(whisper.default_model_dir() is None, reason="no Whisper tiny.en weights")
def test_finals_through_the_engine_carry_the_previous_segment(
        engine_config: EngineConfig, speech: list[np.ndarray]) -> None:
    gap = np.zeros(RATE, dtype=np.float32)
    audio = np.concatenate([speech[0], gap, speech[1], gap])
    texts = {}
    # (final_context_s, light_load_context_s, light_load_streams): carried or not
    for contexts, carried in (((0.0, 0.0, None), False), ((10.0, 0.0, None), True),
                              ((0.0, 10.0, None), True),  # one stream: a demo's load
                              ((0.0, 10.0, 0), False)):  # any stream is above the limit
        final_s, light_s, light_streams = contexts
        config = replace(engine_config, second_pass="whisper", final_guard=None, refine=None,
                         endpoint=_cut_every(len(speech[0]) / RATE + 0.6),
                         final_context_s=final_s, light_load_context_s=light_s,
                         light_load_streams=light_streams)
        engine = ASREngine(config)
        events = stream_all(engine, audio)
        run_until_idle_with_finals(engine)
        finals = events.of_type(1, Final)
        assert [f.source for f in finals] == ["whisper", "whisper"]
        texts[contexts] = [normalize_transcript(f.text) for f in finals]
        with_context = engine.latest_stats().second_pass.num_with_context
        assert with_context == (1 if carried else 0), contexts
        engine.shutdown()
    # the second final is the second sentence alone, with or without the first as context
    alone, carried_text = texts[(0.0, 0.0, None)], texts[(10.0, 0.0, None)]
    assert carried_text[0] == alone[0]
    assert "weather" not in carried_text[1] and "volume" in carried_text[1]
    assert texts[(0.0, 10.0, None)] == carried_text


@pytest.fixture(scope="module")
def bundled() -> EngineConfig:
    from oasr.models.checkpoint import DEFAULT_MODEL_DIR

    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip("the bundled default model is not installed")
    if whisper.default_model_dir() is None:
        pytest.skip("no Whisper tiny.en weights")
    # endpoints only at chunks: these tests compare runs that step a different number of
    # times between chunks (one waits for early decodes), and must cut at the same frames
    return EngineConfig(device="cpu", second_pass="whisper", max_num_blocks=256,
                        max_batch_size=4, refine=None, endpoint=EndpointConfig.wenet(),
                        endpoint_quiet=None)


def _run_live(config: EngineConfig, audio: np.ndarray) -> tuple[list[str], SecondPassSnapshot]:
    """One stream fed in 0.64 s pieces, as a live client's audio comes; after each piece the
    second pass catches up (an idle server: early decodes start only without a backlog)."""
    events, second = _run_live_events(config, audio)
    return [f.text for f in events.of_type(1, Final)], second


def _run_live_events(config: EngineConfig,
                     audio: np.ndarray) -> tuple[Collector, SecondPassSnapshot]:
    engine = ASREngine(config)
    events = Collector()
    engine.submit(OpenStream(1, events.sink(1)))
    piece = int(0.64 * RATE)
    worker = engine.live.finals.worker
    assert worker is not None
    for start in range(0, len(audio), piece):
        engine.submit(AppendAudio(1, audio[start : start + piece]))
        engine.step()
        deadline = time.monotonic() + 60
        while worker.backlog and time.monotonic() < deadline:
            time.sleep(0.01)
            engine.step()
    engine.submit(EndStream(1))
    run_until_idle_with_finals(engine)
    second = engine.latest_stats().second_pass
    engine.shutdown()
    return events, second


@pytest.mark.slow
def test_an_early_decode_at_the_pause_becomes_the_final(
        bundled: EngineConfig, speech: list[np.ndarray]) -> None:
    pause, short = np.zeros(int(1.6 * RATE), np.float32), np.zeros(int(0.85 * RATE), np.float32)
    # two sentences ended by endpoints; the first has a 0.85 s pause inside it, where an early
    # decode starts and is dropped when the speaker goes on
    audio = np.concatenate([speech[0][: int(1.6 * RATE)], short, speech[0][int(1.6 * RATE):],
                            pause, speech[1], pause])
    plain, plain_stats = _run_live(replace(bundled, early_final_s=0.0), audio)
    # 0.16 s: a chunk boundary (every 0.64 s) surely falls in the inner pause after it
    early, early_stats = _run_live(replace(bundled, early_final_s=0.16), audio)
    assert plain_stats.num_early_finals == 0 and len(plain) == 2
    assert early_stats.num_early_finals == 2  # both finals were decoded at their pause
    assert early_stats.num_early_discarded >= 1  # the pause inside the first sentence
    assert [normalize_transcript(t) for t in early] == [normalize_transcript(t) for t in plain]


@pytest.mark.slow
def test_an_early_decode_shows_in_the_partial_before_its_final(
        bundled: EngineConfig, speech: list[np.ndarray]) -> None:
    # with refined partials on, the early decode's answer (beam search on the segment so far)
    # refines the partial at once: the text a reader has before the final is the final's
    audio = np.concatenate([speech[1], np.zeros(int(1.6 * RATE), np.float32)])
    config = replace(bundled, early_final_s=0.16, refine=RefineConfig())
    events, second = _run_live_events(config, audio)
    stream = events.events[1]
    final = next(e for e in stream if isinstance(e, Final))
    before = [e for e in stream[: stream.index(final)] if isinstance(e, Partial)]
    assert second.num_early_finals == 1
    shown = " ".join(p for p in (before[-1].stable, before[-1].tentative) if p)
    assert normalize_transcript(shown) == normalize_transcript(final.text)
    # the silence after the endpoint opens segment 1, which never gets a word: a segment's
    # first partial comes with its first word, refined or not (no empty line on a page)
    assert [e.segment for e in stream if isinstance(e, Partial) and not e.text] == []


def _run_paced(config: EngineConfig, audio: np.ndarray, sent: list[float] | None = None
               ) -> tuple[list[tuple[float, Final]], dict[str, int]]:
    """One stream fed in 0.1 s pieces (what a browser sends); after each piece the second
    pass answers what it has (a decode faster than the pause). Each final with the seconds of
    audio sent when it came (kept in ``sent[0]`` as it goes); the endpoint counts."""
    engine = ASREngine(config)
    finals: list[tuple[float, Final]] = []
    sent = [0.0] if sent is None else sent
    engine.submit(OpenStream(1, lambda e: finals.append((sent[0], e))
                             if isinstance(e, Final) else None))
    piece = RATE // 10
    worker = engine.live.finals.worker
    assert worker is not None
    for start in range(0, len(audio), piece):
        engine.submit(AppendAudio(1, audio[start : start + piece]))
        sent[0] = min(start + piece, len(audio)) / RATE
        engine.step()
        deadline = time.monotonic() + 60
        while worker.backlog and time.monotonic() < deadline:
            time.sleep(0.01)
            engine.step()
        engine.step()
    engine.submit(EndStream(1))
    run_until_idle_with_finals(engine)
    endpoints = dict(engine.latest_stats().endpoints)
    engine.shutdown()
    return finals, endpoints


@pytest.mark.slow
def test_a_sentence_ends_its_segment_at_a_pause_shorter_than_the_endpoints(
        bundled: EngineConfig, speech: list[np.ndarray]) -> None:
    # two sentences 0.65 s apart: shorter than WeNet's 1 s of silence, so the endpoint rules
    # join them; the early decode at the pause reads a sentence's end, which ends the
    # segment after 0.5 s of the pause, before the next sentence starts
    opening = speech[0][: int(2.66 * RATE)]  # its last sound ends at 2.61 s
    gap = int(0.6 * RATE)
    audio = np.concatenate([opening, np.zeros(gap, np.float32), speech[1],
                            np.zeros(int(1.6 * RATE), np.float32)])
    config = replace(bundled, endpoint_quiet=QuietTail(), early_final_s=0.2)
    joined, plain = _run_paced(replace(config, sentence_end_s=0.0), audio)
    split, counts = _run_paced(replace(config, sentence_end_s=0.5), audio)
    assert len(joined) == 1 and "sentence" not in plain
    assert len(split) == 2 and counts["sentence"] == 2  # the last one too, before 1 s
    (sent, first), (_, second) = split
    assert first.text.endswith(".") and first.source == "whisper"
    assert "weather" in normalize_transcript(first.text)
    assert "volume" in normalize_transcript(second.text)
    assert "weather" not in normalize_transcript(second.text)
    # the final came 0.5-0.7 s after the last word (the client's 0.1 s pieces), before the
    # next sentence's first sound (0.21 s into its clip)
    assert 0.5 <= sent - first.end <= 0.75
    assert sent < (len(opening) + gap) / RATE + 0.2
    words = normalize_transcript(joined[0][1].text).split()
    assert normalize_transcript(f"{first.text} {second.text}").split() == words


@pytest.mark.slow
def test_an_early_decode_starts_a_fifth_of_a_second_into_the_pause_wherever_chunks_end(
        bundled: EngineConfig, speech: list[np.ndarray]) -> None:
    # one sentence, then silence; each lead-in puts the 0.64 s chunks' ends elsewhere in its
    # last word. The early decode starts once 0.2 s of quiet follow the word's sound (within
    # the client's 0.1 s pieces), not when a chunk has decoded that much of the pause (up to
    # 0.64 s later), and its audio holds the whole word
    clip = speech[1]
    energy = FrameEnergy(320)
    energy.append(clip)
    sound_end = (int(np.flatnonzero(energy.span(0, energy.num_frames) > -40.0)[-1]) + 1) * 0.02
    config = replace(bundled, endpoint_quiet=QuietTail(), early_final_s=0.2)
    delays = []
    for lead in (0.0, 0.16, 0.32, 0.48):
        audio = np.concatenate([np.zeros(int(lead * RATE), np.float32), clip,
                                np.zeros(int(1.6 * RATE), np.float32)])
        (sent, job), finals = _run_paced_jobs(config, audio)
        assert len(finals) == 1 and finals[0][1].source == "whisper"
        end = lead + sound_end
        delays.append(round(sent - end, 2))
        assert len(job.audio) >= end * RATE
    assert all(0.18 <= d <= 0.34 for d in delays), delays


def _run_paced_jobs(config: EngineConfig, audio: np.ndarray
                    ) -> tuple[tuple[float, SecondPassJob], list[tuple[float, Final]]]:
    """`_run_paced`, and the last job its second pass was given, with the audio sent then."""
    jobs: list[tuple[float, SecondPassJob]] = []
    sent = [0.0]
    real = SecondPassWorker.try_submit

    def spy(worker: SecondPassWorker, job: SecondPassJob) -> bool:
        jobs.append((sent[0], job))
        return real(worker, job)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SecondPassWorker, "try_submit", spy)
        finals, _ = _run_paced(config, audio, sent)
    return jobs[-1], finals


class _QueueingWorker:
    """The worker's side of FinalPublisher: queued jobs, aborts, a settable backlog."""

    def __init__(self) -> None:
        self.jobs: list[SecondPassJob] = []
        self.aborted: list[int] = []
        self.room = True
        self.backlog = 0
        self.num_decoders = 1
        self.no_speech = NoSpeechRule()

    def try_submit(self, job: SecondPassJob) -> bool:
        if not self.room:  # a full backlog
            return False
        self.jobs.append(job)
        return True

    def abort(self, job_id: int) -> None:
        self.aborted.append(job_id)


def _open_request(seconds: float) -> LiveStream:
    request = live_stream()
    request.audio = SegmentAudio(30 * RATE)
    request.audio.append(_voice(seconds))
    request.refine = RefineState()
    return request


def _hyp(tokens: list[int], last_frame: int) -> Hypothesis:
    return Hypothesis(tokens, " ".join(map(str, tokens)), 0.0,
                      [last_frame - len(tokens) + 1 + i for i in range(len(tokens))])


def _sentence_rules() -> tuple[_QueueingWorker, FinalPublisher, LiveStream]:
    """Early decodes from 0.2 s of pause, segments ended at 0.5 s when one ends a sentence;
    a 3 s segment decoded to frame 100."""
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0), early_s=0.2,  # type: ignore[arg-type]
                            sentence_s=0.5)
    request = _open_request(3.0)
    request.view.offset = request.view.num_frames_decoded = 100
    return worker, finals, request


def test_early_decodes_start_at_a_pause_and_are_dropped_when_the_speaker_goes_on() -> None:
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0), early_s=0.5)  # type: ignore[arg-type]
    request = _open_request(3.0)
    request.view.offset = request.view.num_frames_decoded = 100
    finals.start_early(request, _hyp([5, 6], 80))  # 0.38 s after the last token: too soon
    assert not worker.jobs
    # with the quiet audio after the chunk (SegmentCuts.in_quiet): 0.48 s, still too soon
    finals.start_early(request, _hyp([5, 6], 80), heard=HeardPause(24, 100, 104))
    assert not worker.jobs
    worker.backlog = 1
    finals.start_early(request, _hyp([5, 6], 70))  # 0.58 s, but the second pass is busy
    assert not worker.jobs
    worker.backlog = 0
    finals.start_early(request, _hyp([5, 6], 70), num_streams=3)  # more than a demo's load
    assert not worker.jobs
    finals.start_early(request, _hyp([5, 6], 70))
    (early,) = worker.jobs
    finals.start_early(request, _hyp([5, 6], 70))  # the same words: nothing new to start
    assert len(worker.jobs) == 1
    request.view.offset = request.view.num_frames_decoded = 132  # the next chunk
    finals.start_early(request, _hyp([5, 6, 7], 120))  # the speaker went on: dropped
    assert worker.aborted == [early.job_id] and request.early is None
    finals.start_early(request, _hyp([5, 6, 7], 70))
    second = worker.jobs[-1]
    assert (finals.num_early_used, finals.num_early_discarded) == (0, 1)
    request.refine.prefix_tokens = (42,)  # a refinement committed a word since: the early
    finals.publish(request, _hyp([5, 6, 7], 70), "endpoint")  # decode did not force it
    # ... so the final takes its answer only if it begins with that word, and the segment's
    # decode with the word forced goes beside it
    assert second.job_id not in worker.aborted
    retry = worker.jobs[-1]
    assert retry.job_id not in (early.job_id, second.job_id) and retry.prefix == (42,)
    (pending,) = request.pending_finals.values()
    assert list(request.pending_finals) == [second.job_id]
    assert (pending.prefix, pending.retry) == ((42,), retry.job_id)


def _finals_of(request: LiveStream) -> list[Final]:
    """Make ``request`` collect its final events; the list they go to."""
    out: list[Final] = []
    request.view.sink = lambda event: out.append(event) if isinstance(event, Final) else None
    return out


def _early_then_commit(room: bool = True) -> tuple[
        _QueueingWorker, FinalPublisher, LiveStream, SecondPassJob, SecondPassJob | None, list[Final]]:
    """A segment whose early decode is still running when its endpoint comes, a word (42)
    committed by a refinement meanwhile: the worker, the publisher, the request, the early
    job, its retry (None when the backlog had no ``room`` for it) and the finals published."""
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0), early_s=0.5)  # type: ignore[arg-type]
    request = _open_request(3.0)
    published = _finals_of(request)
    request.view.offset = request.view.num_frames_decoded = 100
    finals.start_early(request, _hyp([5, 6], 70))
    (early,) = worker.jobs
    request.refine.prefix_tokens = (42,)
    worker.room = room
    finals.publish(request, _hyp([5, 6], 70), "endpoint")
    worker.room = True
    assert not worker.aborted and not published
    assert len(worker.jobs) == 1 + room
    return worker, finals, request, early, worker.jobs[1] if room else None, published


def _answer(job: SecondPassJob, text: str | None, tokens: tuple[int, ...]) -> SecondPassDone:
    return SecondPassDone(job.job_id, 1, text, 0.5, "whisper" if text is not None else "ctc",
                          tokens=tokens, word_ends=tuple(range(1, len(tokens) + 1)))


def test_an_early_decode_that_begins_with_words_committed_while_it_ran_is_the_final() -> None:
    worker, finals, request, early, retry, published = _early_then_commit()
    assert retry is not None and retry.prefix == (42,)
    finals.on_second_pass(request, _answer(early, "Five, six.", (42, 43)))
    assert [f.text for f in published] == ["Five, six."] and not request.pending_finals
    assert worker.aborted == [retry.job_id]  # its retry is not needed
    finals.on_second_pass(request, _answer(retry, "Late.", (42, 44)))  # on its way already
    assert [f.text for f in published] == ["Five, six."]
    assert (finals.num_early_used, finals.num_early_discarded) == (1, 0)


@pytest.mark.parametrize("text", ["Five, six.", None])
def test_an_early_decode_without_the_committed_words_gives_way_to_its_retry(
        text: str | None) -> None:
    # it answered without the word (or with no text at all: rejected, given up): the retry,
    # decoding beside it, is the final; the next segment's final waits behind it, in order
    worker, finals, request, early, retry, published = _early_then_commit()
    assert retry is not None
    request.view.segment_start_frame = request.view.num_frames_decoded
    request.view.offset, request.view.num_frames_decoded = 50, 150
    finals.publish(request, _hyp([8], 40), "endpoint")
    later = worker.jobs[-1]
    finals.on_second_pass(request, _answer(early, text, (41, 43) if text else ()))
    finals.on_second_pass(request, _answer(later, "eight", (8,)))
    assert not published and list(request.pending_finals) == [early.job_id, later.job_id]
    finals.on_second_pass(request, _answer(retry, "Forty-two six.", (42, 43)))
    assert [f.text for f in published] == ["Forty-two six.", "eight"]
    assert [f.segment for f in published] == [0, 1] and not worker.aborted
    assert (finals.num_early_used, finals.num_early_discarded) == (0, 1)


def test_a_retry_that_answers_first_is_the_final() -> None:
    worker, finals, request, early, retry, published = _early_then_commit()
    assert retry is not None
    finals.on_second_pass(request, _answer(retry, "Forty-two six.", (42, 43)))
    assert [f.text for f in published] == ["Forty-two six."]
    # the early decode goes on (a next segment may be waiting for its text as context); its
    # answer changes nothing
    assert not worker.aborted
    finals.on_second_pass(request, _answer(early, "Forty-two six.", (42, 43)))
    assert [f.text for f in published] == ["Forty-two six."]
    assert (finals.num_early_used, finals.num_early_discarded) == (0, 1)


def test_a_vanished_stream_aborts_an_early_decode_and_its_retry() -> None:
    worker, finals, request, early, retry, _ = _early_then_commit()
    assert retry is not None
    finals.drop_pending(request)
    assert sorted(worker.aborted) == [early.job_id, retry.job_id]
    assert not request.pending_finals


@pytest.mark.parametrize(("text", "kept"), [("Five, six.", "5 6"),
                                            ("Forty-two six.", "Forty-two six.")])
def test_without_room_for_a_retry_the_early_decode_decides_alone(text: str, kept: str) -> None:
    _, finals, request, early, retry, published = _early_then_commit(room=False)
    assert retry is None
    tokens = (42, 43) if text.startswith("Forty") else (41, 43)
    finals.on_second_pass(request, _answer(early, text, tokens))
    assert [f.text for f in published] == [kept]  # without the committed word: the CTC text


def test_an_early_decode_starts_on_the_quiet_audio_after_a_chunk() -> None:
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0), early_s=0.5)  # type: ignore[arg-type]
    request = _open_request(3.0)
    request.view.offset = request.view.num_frames_decoded = 100
    finals.start_early(request, _hyp([5, 6], 90))  # 0.18 s decoded after the last token
    assert not worker.jobs
    # + 0.32 s of quiet audio: the decode has it too (a word's soft end is not cut off)
    finals.start_early(request, _hyp([5, 6], 90), heard=HeardPause(25, 100, 116))
    (job,) = worker.jobs
    assert len(job.audio) == 116 * 320 and request.early is not None
    assert request.early.num_frames == 100  # a token from there on: the speaker went on


def test_an_early_decode_starts_on_a_word_the_ctc_pass_has_not_decoded_yet() -> None:
    # the chunk ended inside the last word; the audio after it holds the word's end (frame
    # 108) and 0.28 s of quiet (SegmentCuts.in_quiet: QuietTail.pause_after_speech)
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0), early_s=0.2)  # type: ignore[arg-type]

    def started() -> tuple[LiveStream, SecondPassJob, list[Final]]:
        """A segment decoded to frame 100 whose early decode started on the heard pause."""
        request = _open_request(3.0)
        published = _finals_of(request)
        request.view.offset = request.view.num_frames_decoded = 100
        finals.start_early(request, _hyp([5, 6], 99), heard=HeardPause(14, 110, 122))
        return request, worker.jobs[-1], published

    request, early, published = started()
    assert worker.jobs == [early]
    assert len(early.audio) == 122 * 320
    assert request.early is not None and request.early.num_frames == 110
    finals.on_second_pass(request, _answer(early, "Five, six, seven.", (11, 12, 13)))
    # the segment ends between chunks, before the word: the word is the next segment's, so
    # the early decode (which heard it) is not this segment's final
    finals.publish(request, _hyp([5, 6], 99), "endpoint")
    assert len(worker.jobs) == 2 and not published
    assert len(worker.jobs[1].audio) == 100 * 320
    # the next chunk decodes the word (a token before frame 110): the decode still holds, and
    # is the final of a segment that reaches past it
    request, early, published = started()
    request.view.offset = request.view.num_frames_decoded = 132
    finals.start_early(request, _hyp([5, 6, 7], 106))
    assert request.early is not None
    finals.on_second_pass(request, _answer(early, "Five, six, seven.", (11, 12, 13)))
    finals.publish(request, _hyp([5, 6, 7], 106), "endpoint")
    assert [f.text for f in published] == ["Five, six, seven."] and worker.jobs[-1] is early
    # a token after it, in the quiet audio the decode was given (110-117: 122 less the
    # guard): the word's last letter written late, the decode still holds
    request, held, _ = started()
    request.view.offset = request.view.num_frames_decoded = 132
    finals.start_early(request, _hyp([5, 6, 7], 112))
    assert request.early is not None and request.early.job_id == held.job_id
    assert not worker.aborted
    # a token at the end of that audio or later: the speaker went on
    request, dropped, _ = started()
    request.view.offset = request.view.num_frames_decoded = 132
    finals.start_early(request, _hyp([5, 6, 7], 117))  # (and 0.28 s after it: a new one)
    assert worker.aborted == [dropped.job_id]
    assert request.early is not None and request.early.job_id == worker.jobs[-1].job_id


def test_the_pause_heard_on_after_an_early_decode_started_holds_late_letters_too() -> None:
    # started at 0.2 s of heard pause (audio to frame 110, quiet from 100: tokens before
    # frame 105 held); the CTC pass writes the last word's final letters 0.24 s after its
    # sound (frame 112). The pause heard on, quiet, to frame 130: that token still holds it
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0), early_s=0.2)  # type: ignore[arg-type]

    def started(heard_on_to: int | None) -> tuple[LiveStream, SecondPassJob]:
        request = _open_request(3.0)
        request.view.offset = request.view.num_frames_decoded = 100
        finals.start_early(request, _hyp([5, 6], 95), heard=HeardPause(10, 100, 110))
        if heard_on_to is not None:
            finals.start_early(request, _hyp([5, 6], 95),
                               heard=HeardPause(heard_on_to - 100, 100, heard_on_to))
        request.view.offset = request.view.num_frames_decoded = 132
        return request, worker.jobs[-1]

    request, early = started(heard_on_to=None)
    finals.start_early(request, _hyp([5, 6, 7], 112))  # the letter after the quiet it knew
    assert worker.aborted == [early.job_id]
    request, early = started(heard_on_to=130)
    finals.start_early(request, _hyp([5, 6, 7], 112))
    assert request.early is not None and request.early.job_id == early.job_id
    assert worker.aborted == [worker.jobs[0].job_id]  # (the first one's) only
    # a token near the end of the quiet heard (the guard: a next word's onset) still drops it
    finals.start_early(request, _hyp([5, 6, 7], 127))
    assert request.early is None or request.early.job_id != early.job_id
    assert early.job_id in worker.aborted


def test_the_last_words_late_letters_after_its_final_are_no_final_of_their_own() -> None:
    # a segment decoded to frame 100 (its last token at 95), whose early decode started on the
    # pause heard to frame 110 and heard on, quiet, to 130, is its final; the CTC pass then
    # writes the last word's late letters (frame 112) into the next segment, which the audio
    # after 130 (less the late-token guard) must judge alone
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0), early_s=0.2,  # type: ignore[arg-type]
                            light_context_s=10.0)
    quiet_to = 130 - finals.late_token_guard

    def after_a_sentence(heard: bool = True, rest: np.ndarray | None = None
                         ) -> tuple[LiveStream, list[Final]]:
        """The first segment ended on its early decode; the second decoded to frame 150
        (4 s of voice, or 2 s and then ``rest``)."""
        request = _open_request(0.0)
        audio = _voice(4.0) if rest is None else np.concatenate([_voice(2.0), rest])
        for start in range(0, len(audio), RATE // 10):  # as a client sends it
            request.audio.append(audio[start: start + RATE // 10])
        published = _finals_of(request)
        request.view.offset = request.view.num_frames_decoded = 100
        if heard:
            finals.start_early(request, _hyp([5, 6], 95), heard=HeardPause(10, 100, 110))
            finals.start_early(request, _hyp([5, 6], 95), heard=HeardPause(30, 100, 130))
        else:
            finals.start_early(request, _hyp([5, 6], 80))  # after a chunk: decoded audio only
        finals.on_second_pass(request, _answer(worker.jobs[-1], "For them.", (11, 12)))
        finals.publish(request, _hyp([5, 6], 95), "endpoint")
        assert [f.text for f in published] == ["For them."]
        finals.release_audio(request, 0)  # (as the engine does when a segment ends)
        request.view.segment_start_frame = request.view.num_frames_decoded = 100
        request.view.offset, request.view.num_frames_decoded = 50, 150
        return request, published

    request, published = after_a_sentence()
    jobs_before = len(worker.jobs)
    finals.start_early(request, _hyp([7], 12), heard=HeardPause(20, 150, 170))  # "m"
    early = worker.jobs[-1]
    assert len(worker.jobs) == jobs_before + 1
    finals.publish(request, _hyp([7], 12), "endpoint")
    # the early decode of the letters is dropped; the segment goes to Whisper with no CTC
    # text, on its audio from the pause's end (frame 150 is the second's decoded end)
    assert early.job_id in worker.aborted
    job = worker.jobs[-1]
    assert job.job_id != early.job_id and job.ctc_text == ""
    assert len(job.audio) - job.context_samples == (150 - quiet_to) * 320
    assert job.context == "For them." and job.context_samples == 100 * 320
    # Whisper hears no words there: the final is "", which takes back the letters' partial,
    # and the next segment goes on from the sentence before (its audio from that
    # sentence's start: both segments')
    finals.release_audio(request, 100)
    finals.on_second_pass(request, _answer(job, "", ()))
    assert [f.text for f in published] == ["For them.", ""]
    request.view.segment_start_frame = 150
    request.view.offset, request.view.num_frames_decoded = 30, 180
    text, audio = finals.known_context(request, 1)
    assert text == "For them." and len(audio) == 150 * 320
    # with nothing but silence after the pause, the final is "" without a decode
    request, published = after_a_sentence(rest=np.zeros(2 * RATE, np.float32))
    jobs_before = len(worker.jobs)
    finals.publish(request, _hyp([7], 12), "endpoint")
    assert len(worker.jobs) == jobs_before
    assert [(f.text, f.segment) for f in published] == [("For them.", 0), ("", 1)]
    # a token after the pause heard is a word of its own: the whole segment is decoded
    request, _ = after_a_sentence()
    finals.publish(request, _hyp([7, 8], 40), "endpoint")
    job = worker.jobs[-1]
    assert job.ctc_text == "7 8" and len(job.audio) - job.context_samples == 50 * 320
    # a final whose decode was given only the decoded audio heard no pause after it
    request, _ = after_a_sentence(heard=False)
    finals.publish(request, _hyp([7], 12), "endpoint")
    job = worker.jobs[-1]
    assert job.ctc_text == "7" and len(job.audio) - job.context_samples == 50 * 320


def test_a_word_heard_after_an_early_decodes_audio_drops_it() -> None:
    # an early decode started at a pause (decoded end 100); before the next chunk the audio
    # holds another word (to frame 120) and 0.24 s of quiet: the speaker went on, though the
    # CTC pass has not heard it yet. The decode is dropped, one on the new audio starts.
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0), early_s=0.2)  # type: ignore[arg-type]
    request = _open_request(3.0)
    request.view.offset = request.view.num_frames_decoded = 100
    finals.start_early(request, _hyp([5, 6], 80))
    (first,) = worker.jobs
    assert request.early is not None and request.early.heard_to == 100
    # the same pause, heard longer (its level measured again): the decode had that audio
    finals.start_early(request, _hyp([5, 6], 80), heard=HeardPause(25, 100, 105))
    assert len(worker.jobs) == 1 and not worker.aborted
    # its sound's end measured 3 frames (60 ms) past the decode's audio: the word's fade
    # (traced: the next chunk's last token moved the quiet run's start), not a new word
    finals.start_early(request, _hyp([5, 6], 80), heard=HeardPause(22, 103, 125))
    assert len(worker.jobs) == 1 and not worker.aborted
    finals.start_early(request, _hyp([5, 6], 80), heard=HeardPause(12, 122, 132))
    assert worker.aborted == [first.job_id] and len(worker.jobs) == 2
    assert request.early is not None and request.early.heard_to == 132


def test_speech_heard_after_the_pause_drops_the_early_decode_before_the_next_chunk() -> None:
    # two live streams share one second pass: an early decode started on a comma pause held
    # it while the other stream's sentence had ended. The audio says the speaker went on
    # (`HeardPause.went_on`) a chunk before the CTC pass can: the decode is dropped then,
    # and none starts on the pause that is over
    worker, finals, request = _sentence_rules()
    finals.start_early(request, _hyp([5, 6], 90), heard=HeardPause(12, 100, 102))
    (early,) = worker.jobs
    worker.backlog = 1  # the one decoder is busy with it
    # the pause heard longer: the decode stands
    finals.start_early(request, _hyp([5, 6], 90), heard=HeardPause(16, 100, 106))
    assert request.early is not None and not worker.aborted
    # a word after 0.32 s of quiet: the same pause, over
    finals.start_early(request, _hyp([5, 6], 90),
                       heard=HeardPause(16, 100, 106, went_on=True))
    assert worker.aborted == [early.job_id] and request.early is None
    assert len(worker.jobs) == 1  # no decode of a pause that is over
    # the next pause starts one as before
    worker.backlog = 0
    request.view.offset = request.view.num_frames_decoded = 140
    finals.start_early(request, _hyp([5, 6, 7], 125))
    assert len(worker.jobs) == 2 and request.early is not None
    # speech after a sentence's pause (0.5 s): the decode may still end the segment there
    # when it answers (the CTC pass has not decoded the new word yet), so it stays
    finals.start_early(request, _hyp([5, 6, 7], 125),
                       heard=HeardPause(25, 140, 150, went_on=True))
    assert request.early is not None and request.early.job_id == worker.jobs[-1].job_id
    assert len(worker.aborted) == 1


def test_an_early_decode_whose_own_words_were_committed_since_is_still_the_final() -> None:
    # its answer refines the partial at once (Refiner.apply_early), which commits the words it
    # agrees on with the refinement before it: those come from the decode itself, so the
    # final it is begins with them; a word committed from elsewhere still voids it
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0), early_s=0.5)  # type: ignore[arg-type]
    for committed_since, used in (((11, 12), True), ((11, 42), False)):
        request = _open_request(3.0)
        request.view.offset = request.view.num_frames_decoded = 100
        request.refine.prefix_tokens = (11,)  # "five" committed before the pause
        finals.start_early(request, _hyp([5, 6], 70))
        early = worker.jobs[-1]
        assert early.prefix == (11,)
        finals.on_second_pass(request, SecondPassDone(early.job_id, 1, "five six", 0.4,
                                                      tokens=(11, 12), word_ends=(1, 2)))
        request.refine.prefix_tokens = committed_since
        jobs_before = len(worker.jobs)
        finals.publish(request, _hyp([5, 6], 70), "endpoint")
        assert (len(worker.jobs) == jobs_before) is used
        assert (request.last_final is not None and request.last_final.text == "five six") is used
    assert (finals.num_early_used, finals.num_early_discarded) == (1, 1)


def test_an_early_decode_on_the_final_words_is_the_final() -> None:
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0), early_s=0.5)  # type: ignore[arg-type]
    request = _open_request(3.0)
    request.view.offset = request.view.num_frames_decoded = 100
    finals.start_early(request, _hyp([5, 6], 70))
    (early,) = worker.jobs
    finals.on_second_pass(request, SecondPassDone(early.job_id, 1, "five six", 0.4))
    finals.publish(request, _hyp([5, 6], 70), "endpoint")
    assert len(worker.jobs) == 1 and not worker.aborted  # no second decode
    assert finals.num_early_used == 1
    assert not request.pending_finals and request.last_final is not None
    assert request.last_final.text == "five six"  # published at the endpoint at once


def test_an_early_decode_that_ends_a_sentence_ends_the_segment_at_a_shorter_pause() -> None:
    worker, finals, request = _sentence_rules()
    hyp = _hyp([5, 6, 7], 84)  # 0.3 s after the last token
    finals.start_early(request, hyp)
    (early,) = worker.jobs
    assert not finals.at_sentence_end(request, hyp, 30)  # not answered yet
    sentence = "He was not an ill-disposed young man."
    finals.on_second_pass(request, SecondPassDone(early.job_id, 1, sentence, 0.4))
    assert not finals.at_sentence_end(request, hyp, 24)  # 0.48 s: a breath may be that long
    assert finals.at_sentence_end(request, hyp, 25)
    assert not finals.at_sentence_end(request, _hyp([5, 6, 7, 8], 120), 25)  # he went on
    assert request.early is not None
    for text in ("He was not an ill-disposed", "He was not, I think...", "Not him.", "", None):
        request.early.done = SecondPassDone(early.job_id, 1, text, 0.4)  # open, or too short
        assert not finals.at_sentence_end(request, hyp, 40), text
    request.early.done = SecondPassDone(early.job_id, 1, sentence, 0.4)
    request.refine.prefix_tokens = (42,)  # a word committed from elsewhere: not its final
    assert not finals.at_sentence_end(request, hyp, 40)
    request.refine.prefix_tokens = ()
    off = FinalPublisher(worker, FrameTiming(0.02, 0), early_s=0.2)  # type: ignore[arg-type]
    assert not off.at_sentence_end(request, hyp, 40)  # sentence_s 0: the endpoint rules only
    finals.publish(request, hyp, "endpoint")  # the engine ends the segment: no new decode
    assert len(worker.jobs) == 1 and finals.num_early_used == 1
    assert request.last_final is not None and request.last_final.text == sentence


def test_a_sentence_the_segment_before_left_unfinished_ends_in_fewer_words() -> None:
    # a segment cut mid-sentence (a length cut): "... of someone or other" | "their
    # daughters." ends that sentence in two words; two words after a closed sentence
    # ("Ask." of "Ask [pause] not what ...") do not
    worker, finals, request = _sentence_rules()
    request.segment = 4
    hyp = _hyp([5, 6], 84)
    finals.start_early(request, hyp)
    (early,) = worker.jobs
    finals.on_second_pass(request, SecondPassDone(early.job_id, 1, "their daughters.", 0.4))
    assert not finals.at_sentence_end(request, hyp, 30)  # no previous final: 3 words
    for previous, ends in (("the rightful property of someone or other", True),
                           ("of someone", True),  # (and 2 words left: still fewer than 3)
                           ("It was the property of someone.", False),
                           ("or other", True)):
        request.last_final = SpokenContext(3, 0, previous)
        assert finals.at_sentence_end(request, hyp, 30) is ends, previous
    request.last_final = SpokenContext(2, 0, "of someone or other")  # not the one before
    assert not finals.at_sentence_end(request, hyp, 30)


SENTENCE = "Ask what you can do for your country."


def _sentence_then_noise() -> tuple[_QueueingWorker, FinalPublisher, LiveStream, SecondPassJob]:
    """A segment whose early decode (to frame 100) answered a sentence; the CTC pass then
    wrote a token (9) in the sound after it (applause), at frame 120 of 132 decoded: the decode
    is dropped but kept as the sentence's end, and a second one starts on the longer audio."""
    worker, finals, request = _sentence_rules()
    finals.start_early(request, _hyp([5, 6, 7], 84))
    (first,) = worker.jobs
    finals.on_second_pass(request, _answer(first, SENTENCE, (5, 6, 7)))
    request.view.offset = request.view.num_frames_decoded = 132
    finals.start_early(request, _hyp([5, 6, 7, 9], 120))
    assert request.sentence_heard is not None and request.sentence_heard.job_id == first.job_id
    assert len(worker.jobs) == 2 and not worker.aborted
    return worker, finals, request, first


def test_a_sentence_heard_again_over_noise_ends_the_segment_where_it_ended() -> None:
    # traced (JFK's "... for your country." then applause): the CTC pass wrote "try to try
    # to avery are" over 3 s of applause, every early decode answered the sentence and was
    # dropped for the next token, and the final came when the applause stopped, 4.3 s late
    worker, finals, request, first = _sentence_then_noise()
    published = _finals_of(request)
    second = worker.jobs[1]
    assert finals.end_before_noise(request, 150) is None  # the second has not answered
    finals.on_second_pass(request, _answer(second, SENTENCE, (5, 6, 7)))
    request.view.offset = request.view.num_frames_decoded = 170  # a chunk on since the second started
    assert finals.end_before_noise(request, 37) is None  # the stream no longer holds frame 132
    # the segment ends where the second started (a pause after every token it heard), its
    # final's tokens those before the first one's audio, its text the first one's answer
    assert finals.end_before_noise(request, 150) == NoiseCut(cut=132, words_to=100)
    assert request.early is not None and request.early.job_id == first.job_id
    assert request.sentence_heard is None
    # the engine ends the segment there (its later frames decoded again as the next one's)
    request.view.num_frames_decoded = 132
    finals.publish(request, _hyp([5, 6, 7], 84), "endpoint")
    assert [f.text for f in published] == [SENTENCE] and len(worker.jobs) == 2
    assert (finals.num_early_used, finals.num_early_discarded) == (1, 1)


@pytest.mark.parametrize("later", ["Ask what you can do for your country. And so", None])
def test_a_later_answer_with_more_words_or_none_does_not_end_the_segment(
        later: str | None) -> None:
    worker, finals, request, _ = _sentence_then_noise()
    finals.on_second_pass(request, _answer(worker.jobs[1], later, (5, 6, 7, 8, 9)[:5 if later else 0]))
    assert finals.end_before_noise(request, 150) is None
    # words after the sentence: it is over; no answer (the guard, a failure): still kept
    assert (request.sentence_heard is None) is (later is not None)


def test_a_sentence_end_is_kept_only_when_it_ends_a_sentence_and_heard_long_enough() -> None:
    worker, finals, request, first = _sentence_then_noise()
    second = worker.jobs[1]
    request.refine.prefix_tokens = (42,)  # committed from elsewhere: not its final
    finals.on_second_pass(request, _answer(second, SENTENCE, (5, 6, 7)))
    assert finals.end_before_noise(request, 150) is None
    request.refine.prefix_tokens = ()
    assert finals.end_before_noise(request, 150) == NoiseCut(cut=132, words_to=100)
    # heard over less than a sentence's pause more audio: not yet
    worker, finals, request, first = _sentence_then_noise()
    assert request.early is not None
    request.early.heard_to = 124
    finals.on_second_pass(request, _answer(worker.jobs[1], SENTENCE, (5, 6, 7)))
    assert finals.end_before_noise(request, 150) is None
    # an early decode that answered no sentence is dropped, not kept
    worker, finals, request = _sentence_rules()
    finals.start_early(request, _hyp([5, 6, 7], 84))
    finals.on_second_pass(request, _answer(worker.jobs[0], "Ask what you can", (5, 6)))
    request.view.offset = request.view.num_frames_decoded = 132
    finals.start_early(request, _hyp([5, 6, 7, 9], 120))
    assert request.sentence_heard is None and finals.num_early_discarded == 1


def test_a_decode_dropped_while_another_decoder_is_idle_answers_as_a_sentence_end() -> None:
    # traced (flite awb, "... of their daughters." then applause): the applause sounded like
    # speech after 0.28 s of pause (`HeardPause.went_on`), so the early decode was aborted
    # before it answered, and the final waited for the applause to end. With a decoder idle
    # it answers: a sentence's end is kept, anything else dropped
    for text, kept in ((SENTENCE, True), ("Ask what you can do for your", False)):
        worker, finals, request = _sentence_rules()
        worker.num_decoders = 2
        finals.start_early(request, _hyp([5, 6, 7], 86))
        (first,) = worker.jobs
        worker.backlog = 1  # itself: the other decoder is idle
        finals.start_early(request, _hyp([5, 6, 7], 86),
                           heard=HeardPause(14, 100, 112, went_on=True))
        assert request.early is None and not worker.aborted
        assert request.sentence_heard is not None and len(worker.jobs) == 1
        finals.on_second_pass(request, _answer(first, text, (5, 6, 7)))
        assert (request.sentence_heard is not None) is kept, text
        assert finals.num_early_discarded == (0 if kept else 1)
    # both decoders busy: aborted at once, as before
    worker, finals, request = _sentence_rules()
    worker.num_decoders = 2
    finals.start_early(request, _hyp([5, 6, 7], 86))
    worker.backlog = 2
    finals.start_early(request, _hyp([5, 6, 7], 86), heard=HeardPause(14, 100, 112, went_on=True))
    assert worker.aborted == [worker.jobs[0].job_id] and request.sentence_heard is None


def test_the_decode_that_tests_the_noise_starts_at_a_pause_after_the_ctc_tokens() -> None:
    # the words the CTC pass wrote since must lie whole in its audio: one started right after
    # a token ("... times. [breath] it wa") could answer without the half-heard word, the
    # same as the kept sentence, and cut the sentence at the breath
    for last_token, starts in ((138, False), (129, True)):
        worker, finals, request = _sentence_rules()
        finals.start_early(request, _hyp([5, 6, 7], 84))
        finals.on_second_pass(request, _answer(worker.jobs[0], SENTENCE, (5, 6, 7)))
        request.view.offset = request.view.num_frames_decoded = 140
        finals.start_early(request, _hyp([5, 6, 7, 9], last_token))
        assert request.sentence_heard is not None
        assert (len(worker.jobs) == 2) is starts, last_token
    # while it runs, more tokens or sound like speech do not drop it: its answer is the test
    first, second = worker.jobs
    finals.start_early(request, _hyp([5, 6, 7, 9, 11], 141))
    finals.start_early(request, _hyp([5, 6, 7, 9, 11], 141),
                       heard=HeardPause(3, 142, 145, went_on=True))
    assert request.early is not None and request.early.job_id == second.job_id
    assert not worker.aborted and len(worker.jobs) == 2
    # it answers the same, then a token drops it: the first stays the sentence's end (its
    # audio ends where the sentence did), and a third decode tests the noise
    finals.on_second_pass(request, _answer(second, SENTENCE, (5, 6, 7)))
    request.view.offset = request.view.num_frames_decoded = 160
    finals.start_early(request, _hyp([5, 6, 7, 9, 11], 145))
    assert request.sentence_heard is not None and request.sentence_heard.job_id == first.job_id
    assert len(worker.jobs) == 3 and finals.num_early_discarded == 1  # the second


def test_an_early_decode_the_guard_rejected_on_half_a_word_is_decoded_again() -> None:
    # the early decode started while the CTC pass had "... seventy fi"; the guard kept the
    # CTC text against Whisper's "... 1775." (too far from that witness). The pass then
    # heard "five": the segment's own decode is judged against the whole text. With the
    # same CTC text as its witness, the verdict stands (no second decode)
    for later, decoded_again in (([5, 6, 7], True), ([5, 6], False)):
        worker, finals, request = _sentence_rules()
        published = _finals_of(request)
        finals.start_early(request, _hyp([5, 6], 88))
        (early,) = worker.jobs
        finals.on_second_pass(request, SecondPassDone(early.job_id, 1, None, 0.3, "ctc",
                                                      rejected="distance"))
        finals.publish(request, _hyp(later, 88), "stop")
        assert (len(worker.jobs) == 2) is decoded_again
        if decoded_again:
            assert not published and worker.jobs[1].ctc_text == "5 6 7"
            finals.on_second_pass(request, _answer(worker.jobs[1], "Five six seven.", (1,)))
        assert [(f.text, f.source) for f in published] == (
            [("Five six seven.", "whisper")] if decoded_again else [("5 6", "ctc")])


def test_a_rejected_early_decode_starts_again_when_the_last_word_is_heard_whole() -> None:
    # traced (flite awb, "It was the year of our Lord 1775." at four clients): the guard
    # rejected the early answer against "... seventy fi"; a chunk later the pass had "five".
    # The decode starts again in the same pause, so the sentence's end can still end the
    # segment at 0.5 s, not at the endpoint's silence or the stream's end
    worker, finals, request = _sentence_rules()
    finals.start_early(request, _hyp([5, 6], 88))
    (early,) = worker.jobs
    finals.on_second_pass(request, SecondPassDone(early.job_id, 1, None, 0.3, "ctc",
                                                  rejected="distance"))
    finals.start_early(request, _hyp([5, 6], 88))  # the same words: the verdict stands
    assert len(worker.jobs) == 1 and request.early is not None
    request.view.offset = request.view.num_frames_decoded = 110
    later = _hyp([5, 6, 7], 89)  # the last word's late letter, in the pause
    finals.start_early(request, later)
    assert len(worker.jobs) == 2 and worker.jobs[1].ctc_text == "5 6 7"
    assert request.early is not None and request.early.job_id == worker.jobs[1].job_id
    finals.on_second_pass(request, _answer(worker.jobs[1], "Five six seven.", (1, 2, 3)))
    assert finals.at_sentence_end(request, later, 25)
    published = _finals_of(request)
    finals.publish(request, later, "endpoint")
    assert [(f.text, f.source) for f in published] == [("Five six seven.", "whisper")]
    assert len(worker.jobs) == 2  # its answer was the final: no third decode


def test_an_early_decode_outlives_a_new_ranking_of_the_words_it_heard() -> None:
    # a stream's last chunk, flushed at its end, may re-rank the CTC beam over the same audio
    # ("5 6" -> "5 9"); the early decode had that audio, so it is still the final. A token in
    # the audio after it (frame >= 100, what it covered) voids it.
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0), early_s=0.5)  # type: ignore[arg-type]
    for later, used in (([5, 9], 70), True), (([5, 6, 8], 104), False):
        request = _open_request(3.0)
        request.view.offset = request.view.num_frames_decoded = 100
        finals.start_early(request, _hyp([5, 6], 70))
        early = worker.jobs[-1]
        request.view.offset = request.view.num_frames_decoded = 110
        finals.start_early(request, _hyp(*later))  # the next chunk: kept only when used
        assert (request.early is not None) is used
        finals.on_second_pass(request, SecondPassDone(early.job_id, 1, "five six", 0.4))
        jobs_before = len(worker.jobs)
        finals.publish(request, _hyp(*later), "stop")
        assert (len(worker.jobs) == jobs_before) is used
        assert (request.last_final is not None and request.last_final.text == "five six") is used
    assert (finals.num_early_used, finals.num_early_discarded) == (1, 1)


@pytest.mark.skipif(whisper.default_model_dir() is None, reason="no Whisper tiny.en weights")
def test_transcribe_files_stops_the_second_pass_it_started(
        engine_config: EngineConfig, speech: list[np.ndarray], tmp_path) -> None:  # type: ignore[no-untyped-def]
    import soundfile as sf

    from oasr.engine.offline import transcribe_files

    path = tmp_path / "a.wav"
    sf.write(path, speech[0], RATE)
    config = replace(engine_config, second_pass="whisper", final_guard=None)
    before = {t for t in threading.enumerate() if t.name == "oasr-second-pass"}
    for _ in range(2):
        (result,) = transcribe_files(config, [path], progress=False)
        assert result.finish_reason == "stop" and result.text
    after = {t for t in threading.enumerate() if t.name == "oasr-second-pass"}
    assert after <= before  # no worker thread left behind by either call


@pytest.mark.parametrize(("answer", "context"), [("Five, six.", "Five, six."), ("", "")])
def test_a_refinement_has_the_previous_segments_context_once_its_final_is_out(
        answer: str, context: str) -> None:
    # a final with no words (Whisper heard none: a cough, the last word's late letters) is
    # no context: segment 1's decode would otherwise begin with that sound
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0),  # type: ignore[arg-type]
                            light_context_s=10.0)
    request = _open_request(3.0)
    published = _finals_of(request)
    request.view.offset = request.view.num_frames_decoded = 60
    finals.publish(request, _hyp([5, 6], 50), "endpoint")  # segment 0: frames 0-60
    request.view.segment_start_frame = 60
    request.view.offset, request.view.num_frames_decoded = 40, 100
    text, audio = finals.known_context(request, 1)
    assert (text, len(audio)) == ("", 0)  # its final is being decoded: no waiting for it
    (job,) = worker.jobs
    finals.on_second_pass(request, _answer(job, answer, (5, 6) if answer else ()))
    assert [f.text for f in published] == [answer]
    text, audio = finals.known_context(request, 1)
    assert text == context and len(audio) == (60 * 320 if context else 0)
    assert finals.known_context(request, 8)[0] == ""  # above a demo's load: no context
    finals.publish(request, _hyp([7, 8], 30), "endpoint")
    job = worker.jobs[-1]
    assert job.context_samples == (60 * 320 if context else 0)
    assert len(job.audio) - job.context_samples == 40 * 320


def test_a_final_that_keeps_its_ctc_text_waits_for_the_segments_before_it() -> None:
    # segment 0 goes to Whisper; segment 1 finds the backlog full and keeps its CTC text: it
    # is still published after segment 0's final, never before it (a client appends finals
    # in the order they come)
    worker = _QueueingWorker()
    finals = FinalPublisher(worker, FrameTiming(0.02, 0))  # type: ignore[arg-type]
    request = _open_request(4.0)
    published = _finals_of(request)
    request.view.offset = request.view.num_frames_decoded = 100
    finals.publish(request, _hyp([5, 6], 80), "endpoint")
    (first,) = worker.jobs
    request.view.segment_start_frame = 100
    request.view.offset, request.view.num_frames_decoded = 50, 150
    worker.room = False
    finals.publish(request, _hyp([7, 8], 40), "endpoint")
    assert not published and finals.num_backlog_full == 1
    finals.on_second_pass(request, _answer(first, "Five, six.", (5, 6)))
    assert [(f.segment, f.text, f.source) for f in published] == [
        (0, "Five, six.", "whisper"), (1, "7 8", "ctc")]
    assert not request.pending_finals
    # a stream that vanishes with such a final queued aborts only the jobs that run
    finals.publish(request, _hyp([9], 10), "endpoint")  # (no room: nothing pending, out)
    worker.room = True
    finals.publish(request, _hyp([10], 10), "endpoint")
    worker.room = False
    finals.publish(request, _hyp([11], 10), "endpoint")
    running = worker.jobs[-1].job_id
    finals.drop_pending(request)
    assert worker.aborted == [running] and not request.pending_finals
