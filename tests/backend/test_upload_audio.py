"""``backend.upload_audio``: limits checked from the header, decoding a block at a time; and
``backend.openai_http.ClientWatch``, which cancels a request whose client left."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
import soundfile

from backend.openai_http import ClientLeft, ClientWatch
from backend.upload_audio import BLOCK_SAMPLES, UploadAudio, UploadRefused


def flac(seconds: float, rate: int, channels: int, value: float = 0.0) -> io.BytesIO:
    buffer = io.BytesIO()
    samples = np.full((int(seconds * rate), channels), value, dtype=np.float32)
    soundfile.write(buffer, samples, rate, format="FLAC", subtype="PCM_16")
    buffer.seek(0)
    return buffer


def refused(file: io.BytesIO, max_duration_s: float = 60.0) -> UploadRefused:
    with pytest.raises(UploadRefused) as caught:
        UploadAudio.open(file, "a.flac", max_duration_s)
    return caught.value


def test_audio_longer_than_the_limit_is_413_from_the_header() -> None:
    error = refused(flac(3.0, 16000, 1), max_duration_s=2.0)
    assert error.status == 413 and error.code == "audio_too_long"
    assert "'a.flac' holds 3.0 s of audio; the limit is 2 s" in error.message


def test_a_rate_outside_8_to_192_khz_is_400() -> None:
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(4000, dtype=np.float32), 4000, format="WAV")
    buffer.seek(0)
    error = refused(buffer)
    assert error.status == 400 and "4000 Hz" in error.message and "8000..192000" in error.message


def test_not_audio_is_400_with_libsndfile_s_reason_and_no_object_or_path() -> None:
    error = refused(io.BytesIO(b"not audio at all" * 20))
    assert error.status == 400
    assert "'a.flac' is not audio oasr can decode" in error.message
    assert "<" not in error.message and "/" not in error.message.split(":", 1)[1]


def test_blocks_are_bounded_and_mixed_to_mono_at_the_file_s_rate() -> None:
    audio = UploadAudio.open(flac(5.0, 192000, 2, value=0.25), "a.flac", 60.0)
    assert (audio.sample_rate, audio.channels, audio.duration_s) == (192000, 2, 5.0)
    sizes = []
    while (block := audio.read_block()).size:
        assert block.dtype == np.float32 and block.ndim == 1
        assert np.allclose(block, 0.25, atol=1e-4)
        sizes.append(block.size)
    audio.close()
    assert max(sizes) == BLOCK_SAMPLES // 2  # all channels together within the block size
    assert sum(sizes) == 5 * 192000 and audio.frames_read == 5 * 192000


def test_non_finite_samples_are_refused_while_decoding() -> None:
    buffer = io.BytesIO()
    samples = np.zeros(1600, dtype=np.float32)
    samples[800] = np.nan
    soundfile.write(buffer, samples, 16000, format="WAV", subtype="FLOAT")
    buffer.seek(0)
    audio = UploadAudio.open(buffer, "nan.wav", 60.0)
    with pytest.raises(UploadRefused, match="NaN or infinite"):
        audio.read_block()


def test_a_read_after_close_is_the_end() -> None:
    audio = UploadAudio.open(flac(1.0, 16000, 1), "a.flac", 60.0)
    audio.close()
    assert audio.read_block().size == 0


def test_a_client_leaving_cancels_the_work() -> None:
    async def scenario() -> list[str]:
        seen: list[str] = []
        left = asyncio.Event()

        async def receive() -> dict[str, str]:
            await left.wait()
            return {"type": "http.disconnect"}

        async def work() -> str:
            try:
                await asyncio.sleep(30)
                return "answered"
            finally:
                seen.append("cleaned up")

        watch = ClientWatch(receive)
        asyncio.get_running_loop().call_later(0.05, left.set)
        with pytest.raises(ClientLeft):
            await asyncio.wait_for(watch.run(work()), 5)
        watch.stop()
        return seen

    assert asyncio.run(scenario()) == ["cleaned up"]


def test_work_that_finishes_first_is_answered() -> None:
    async def scenario() -> str:
        async def receive() -> dict[str, str]:
            await asyncio.sleep(30)
            return {"type": "http.disconnect"}

        async def work() -> str:
            return "answered"

        watch = ClientWatch(receive)
        try:
            return await watch.run(work())
        finally:
            watch.stop()

    assert asyncio.run(scenario()) == "answered"
