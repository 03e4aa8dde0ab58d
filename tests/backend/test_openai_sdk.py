"""The official ``openai`` SDK, unmodified, against a real ``oasr-server`` on loopback.

One server for the module: the bundled model with its Whisper second pass and an API key.
The SDK transcribes a real recording in every response format and streamed; its realtime
client streams real recordings at real-time pace with server VAD and with manual commits;
wrong keys are refused on both.
"""

from __future__ import annotations

import http.client
import re
import time
from pathlib import Path

import pytest

from oasr.benchmarks.realtime_client import realtime_pcm, start_feeding
from oasr.text.wer import normalize_transcript, word_error_rate

openai = pytest.importorskip("openai")
pytestmark = [
    pytest.mark.slow, pytest.mark.timeout(600),
    # openai 2.x opens its sync realtime socket with websockets' connect() outside a `with`,
    # which websockets >= 15 deprecates; the connection itself works the same
    pytest.mark.filterwarnings(
        "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]
KEY = "sk-oasr-test"
JFK = "and so my fellow americans ask not what your country can do for you ask what you can " \
      "do for your country"


@pytest.fixture(scope="module")
def server(start_module_server, bundled_model_dir: Path) -> object:  # type: ignore[no-untyped-def]
    return start_module_server(None, "--api-key", KEY, "--max-batch-size", "4")


@pytest.fixture(scope="module")
def client(server: object) -> object:
    return openai.OpenAI(base_url=f"http://{server.address}/v1", api_key=KEY, max_retries=0)


def wer(reference: str, text: str) -> float:
    return word_error_rate(normalize_transcript(reference), normalize_transcript(text))


def test_every_response_format(client: object, devset_dir: Path) -> None:
    path = devset_dir / "real_jfk.wav"
    texts = {}
    for kind in ("json", "text", "srt", "vtt", "verbose_json"):
        with path.open("rb") as f:
            texts[kind] = client.audio.transcriptions.create(
                model="whisper-1", file=f, response_format=kind)
    # five requests, five streams: the second pass (batched, beam search) may word one of
    # them a little differently, so each is held to the reference, not to the others
    text = texts["json"].text
    assert wer(JFK, text) <= 0.1, text
    assert texts["json"].usage.seconds == pytest.approx(11.0, abs=0.01)
    assert texts["text"].endswith("\n") and wer(JFK, texts["text"]) <= 0.1
    verbose = texts["verbose_json"]
    assert wer(JFK, verbose.text) <= 0.1 and verbose.duration == pytest.approx(11.0, abs=0.01)
    assert verbose.segments and verbose.segments[-1].end <= 11.5
    assert " ".join(s.text for s in verbose.segments) == verbose.text
    for kind, clock in (("srt", r"\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}"),
                        ("vtt", r"\d\d:\d\d:\d\d\.\d{3} --> \d\d:\d\d:\d\d\.\d{3}")):
        cues = re.findall(clock + r"\n(.+)\n", texts[kind])
        assert cues and wer(JFK, " ".join(cues)) <= 0.1, texts[kind]
    assert texts["srt"].startswith("1\n00:00:0") and texts["vtt"].startswith("WEBVTT\n\n")


def test_word_and_segment_timestamps(client: object, devset_dir: Path) -> None:
    with (devset_dir / "real_jfk.wav").open("rb") as f:
        verbose = client.audio.transcriptions.create(
            model="whisper-1", file=f, response_format="verbose_json",
            timestamp_granularities=["word", "segment"])
    words = verbose.words
    assert normalize_transcript(" ".join(w.word for w in words)) == normalize_transcript(
        verbose.text)
    assert all(0.0 <= w.start <= w.end <= 11.0 for w in words)
    assert [w.start for w in words] == sorted(w.start for w in words)
    # JFK says "ask not" after a pause at about 3.4 s and ends at about 10.6 s
    ask = next(w for w in words if w.word.lower() == "ask")
    assert 2.8 <= ask.start <= 3.8, ask
    assert 9.5 <= words[-1].end <= 11.0 and verbose.segments


def test_streamed_transcription(client: object, devset_dir: Path) -> None:
    with (devset_dir / "real_jfk.wav").open("rb") as f:
        events = list(client.audio.transcriptions.create(model="gpt-4o-transcribe", file=f,
                                                         stream=True))
    assert events[-1].type == "transcript.text.done"
    assert "".join(e.delta for e in events[:-1]) == events[-1].text  # within one stream
    assert wer(JFK, events[-1].text) <= 0.1


def test_models(client: object) -> None:
    assert [m.id for m in client.models.list()] == ["oasr-whisper-ctc"]


def realtime(client: object, path: Path, manual: bool) -> list[object]:
    """Stream ``path`` at real-time pace (100 ms appends of 24 kHz pcm) plus 1.5 s of silence;
    the server events until the last completed transcript."""
    pcm = realtime_pcm(path)
    events: list[object] = []
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        events.append(conn.recv())
        conn.session.update(session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
            "turn_detection": None if manual else {"type": "server_vad",
                                                   "silence_duration_ms": 500}}}})

        feeder = start_feeding(conn, pcm, manual)
        deadline = time.monotonic() + 120
        num_updates = 0
        for event in conn:
            events.append(event)
            num_updates += event.type == "session.updated"
            kinds = [e.type for e in events]
            num_items = max(kinds.count("input_audio_buffer.committed"),
                            kinds.count("input_audio_buffer.speech_started"))
            pending = num_items - kinds.count(
                "conversation.item.input_audio_transcription.completed")
            if (num_updates == 2 and pending == 0) or event.type == "error":
                break
            assert time.monotonic() < deadline, kinds
        feeder.join()
    return [e for e in events if e.type != "session.updated"] + [events[1]]


def test_realtime_with_server_vad(client: object, devset_dir: Path) -> None:
    events = realtime(client, devset_dir / "real_jfk.wav", manual=False)
    kinds = [e.type for e in events]
    assert kinds[0] == "session.created" and kinds[-1] == "session.updated"
    assert "error" not in kinds, [e for e in events if e.type == "error"]
    completed = [e for e in events if e.type.endswith("transcription.completed")]
    started = [e for e in events if e.type == "input_audio_buffer.speech_started"]
    stopped = [e for e in events if e.type == "input_audio_buffer.speech_stopped"]
    committed = [e for e in events if e.type == "input_audio_buffer.committed"]
    assert len(completed) == len(started) == len(stopped) == len(committed) >= 1
    for before, item in zip(committed, committed[1:], strict=False):
        assert item.previous_item_id == before.item_id
    assert [e.item_id for e in completed] == [e.item_id for e in committed]
    assert any(k.endswith("transcription.delta") for k in kinds)
    text = " ".join(e.transcript for e in completed)
    assert wer(JFK, text) <= 0.15, text


def test_realtime_with_manual_commits(client: object, devset_dir: Path) -> None:
    events = realtime(client, devset_dir / "real_sense_and_sensibility_01_austen_64kb-0930.wav",
                      manual=True)
    kinds = [e.type for e in events]
    assert "error" not in kinds and "input_audio_buffer.speech_started" not in kinds
    committed = [e for e in events if e.type == "input_audio_buffer.committed"]
    (completed,) = [e for e in events if e.type.endswith("transcription.completed")]
    assert len(committed) == 1 and completed.item_id == committed[0].item_id
    assert completed.usage.seconds == pytest.approx(3.29 + 1.5, abs=0.01)
    assert wer("he might even have been made amiable himself", completed.transcript) <= 0.15


def test_wrong_keys_are_refused(server: object, devset_dir: Path) -> None:
    wrong = openai.OpenAI(base_url=f"http://{server.address}/v1", api_key="sk-wrong",
                          max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.models.list()
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError), (devset_dir / "real_jfk.wav").open("rb") as f:
        wrong.audio.transcriptions.create(model="whisper-1", file=f)
    from websockets.exceptions import ConnectionClosedError

    with wrong.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        error = conn.recv()
        assert error.type == "error" and error.error.code == "invalid_api_key"
        with pytest.raises(ConnectionClosedError) as closed:
            conn.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_a_2gb_content_length_is_413_at_once(server: object) -> None:
    host, port = server.address.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.putrequest("POST", "/v1/audio/transcriptions")
    for name, value in (("Authorization", f"Bearer {KEY}"), ("Content-Length", str(2 * 2**30)),
                        ("Content-Type", "multipart/form-data; boundary=x")):
        connection.putheader(name, value)
    connection.endheaders(b"--x\r\n")
    response = connection.getresponse()
    assert response.status == 413
    assert b"larger than the limit" in response.read()
    connection.close()
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", "/healthz")
    assert connection.getresponse().status == 200
    connection.close()
