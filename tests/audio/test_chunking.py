import json

import numpy as np
import pytest

from oasr.audio import (
    ChunkGeometry,
    ChunkWindower,
    FbankConfig,
    StreamingFbank,
    compute_fbank,
    read_audio,
    split_windows,
)


def _samples_for_frames(num_frames: int, seed: int = 0) -> np.ndarray:
    """Audio that yields exactly ``num_frames`` fbank frames."""
    n = 0 if num_frames == 0 else 400 + 160 * (num_frames - 1)
    return (0.1 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def _conv_stem_output(n: int, subsampling: int) -> int:
    """Output length of WeNet's conv2d stems, layer by layer (kernel 3 stride 2, ...)."""
    if subsampling == 4:
        return max(0, ((n - 1) // 2 - 1) // 2) if n >= 7 else 0
    if subsampling == 6:
        return max(0, ((n - 1) // 2 - 2) // 3) if n >= 11 else 0
    if subsampling == 8:
        return max(0, (((n - 1) // 2 - 1) // 2 - 1) // 2) if n >= 15 else 0
    raise AssertionError(subsampling)


@pytest.mark.parametrize(
    ("geometry", "window", "stride", "minimum"),
    [
        (ChunkGeometry(), 67, 64, 7),
        (ChunkGeometry(chunk_size=8), 35, 32, 7),
        (ChunkGeometry(chunk_size=32), 131, 128, 7),
        (ChunkGeometry(chunk_size=1), 7, 4, 7),
        (ChunkGeometry(16, subsampling=6, right_context=10), 101, 96, 11),
        (ChunkGeometry(16, subsampling=8, right_context=14), 135, 128, 15),
    ],
)
def test_geometry_derives_window_and_stride(geometry, window, stride, minimum):
    assert geometry.window_frames == window
    assert geometry.stride_frames == stride
    assert geometry.min_window_frames == minimum
    assert geometry.num_output_frames(window) == geometry.chunk_size


@pytest.mark.parametrize(("subsampling", "context"), [(4, 6), (6, 10), (8, 14)])
def test_output_frames_match_the_conv_stem(subsampling, context):
    geometry = ChunkGeometry(16, subsampling, context)
    for n in range(0, 300):
        assert geometry.num_output_frames(n) == _conv_stem_output(n, subsampling), n


@pytest.mark.parametrize("chunk_size", [1, 4, 8, 16, 32])
def test_windows_cover_exactly_the_full_utterance_output(chunk_size):
    # Chunk outputs concatenate to the whole utterance's encoder frames, for every length.
    geometry = ChunkGeometry(chunk_size=chunk_size)
    for num_frames in range(0, 400):
        starts = geometry.window_starts(num_frames)
        outputs = [
            geometry.num_output_frames(min(num_frames, s + geometry.window_frames) - s)
            for s in starts
        ]
        assert sum(outputs) == geometry.num_output_frames(num_frames), num_frames
        assert all(o >= 1 for o in outputs)
        assert all(o == chunk_size for o in outputs[:-1])


def test_windows_match_wenet_report(wenet_report_path):
    report = json.loads(wenet_report_path.read_text())
    traces = sorted((k for k in report if k.startswith("trace_chunk")), key=lambda k: int(k[11:]))
    expected = [tuple(report[k]["frames"]) for k in traces]
    feats = np.zeros((512, 80), dtype=np.float32)
    geometry = ChunkGeometry()
    got = [
        (s, s + w.shape[0])
        for s, w in zip(geometry.window_starts(512), split_windows(feats), strict=True)
    ]
    assert got == expected
    assert [report[k]["offset"] for k in traces] == [16 * i for i in range(len(traces))]


@pytest.mark.parametrize(
    ("num_frames", "windows"),
    [
        (6, []),
        (7, [(0, 7)]),
        (66, [(0, 66)]),
        (67, [(0, 67)]),
        (70, [(0, 67)]),  # 6 frames left after 64: no encoder frame, dropped
        (71, [(0, 67), (64, 71)]),
        (131, [(0, 67), (64, 131)]),
        (135, [(0, 67), (64, 131), (128, 135)]),
    ],
)
def test_final_partial_window_needs_one_encoder_frame(num_frames, windows):
    fbank = StreamingFbank()
    fbank.accept_waveform(_samples_for_frames(num_frames))
    assert fbank.num_frames_ready == num_frames
    windower = ChunkWindower()
    full = []
    while (w := windower.pop_window(fbank)) is not None:
        full.append(w)
    fbank.input_finished()
    while (w := windower.pop_window(fbank)) is not None:
        full.append(w)
    assert [(w.start_frame, w.start_frame + w.num_frames) for w in full] == windows
    assert [w.index for w in full] == list(range(len(windows)))
    assert windower.is_exhausted(fbank)


def test_partial_window_waits_for_input_finished():
    fbank = StreamingFbank()
    fbank.accept_waveform(_samples_for_frames(100))
    windower = ChunkWindower()
    first = windower.pop_window(fbank)
    assert first is not None and first.num_frames == 67 and not first.is_last
    assert not windower.is_window_ready(fbank) and windower.pop_window(fbank) is None
    assert not windower.is_exhausted(fbank)
    fbank.input_finished()
    assert windower.is_window_ready(fbank)
    last = windower.pop_window(fbank)
    assert (last.start_frame, last.num_frames, last.num_output_frames) == (64, 36, 8)
    assert last.is_last
    assert windower.pop_window(fbank) is None


def test_full_window_is_last_when_nothing_follows():
    fbank = StreamingFbank()
    fbank.accept_waveform(_samples_for_frames(67))
    fbank.input_finished()
    window = ChunkWindower().pop_window(fbank)
    assert window.num_frames == 67 and window.is_last


@pytest.mark.parametrize("chunk_size", [8, 16, 32])
def test_streamed_windows_equal_offline_windows(devset_wavs, chunk_size):
    wav = read_audio(devset_wavs[0])
    geometry = ChunkGeometry(chunk_size=chunk_size)
    offline = split_windows(compute_fbank(wav), geometry)
    rng = np.random.default_rng(chunk_size)
    fbank, windower, streamed, most_retained, i = (
        StreamingFbank(),
        ChunkWindower(geometry),
        [],
        0,
        0,
    )
    while i < wav.shape[0]:
        n = int(rng.integers(0, 4000))
        fbank.accept_waveform(wav[i : i + n])
        i += n
        while (w := windower.pop_window(fbank)) is not None:
            streamed.append(w)
        most_retained = max(most_retained, fbank.num_frames_retained)
    fbank.input_finished()
    while (w := windower.pop_window(fbank)) is not None:
        streamed.append(w)
    assert len(streamed) == len(offline) > 3
    for got, want in zip(streamed, offline, strict=True):
        np.testing.assert_array_equal(got.feats, want)
    assert [w.is_last for w in streamed] == [False] * (len(offline) - 1) + [True]
    # Bounded: at most one window plus one piece of not-yet-windowed frames is kept.
    assert most_retained <= geometry.window_frames + 4000 // 160 + 1


def test_windower_drops_consumed_frames():
    fbank = StreamingFbank()
    fbank.accept_waveform(_samples_for_frames(200))
    windower = ChunkWindower()
    windower.pop_window(fbank)
    assert fbank.num_frames_dropped == 64  # the 3-frame overlap is kept for the next window
    windower.pop_window(fbank)
    assert fbank.num_frames_dropped == 128
    assert windower.next_start_frame == 128 and windower.num_windows == 2


def test_windower_retains_frames_for_a_rewind():
    fbank = StreamingFbank()
    fbank.accept_waveform(_samples_for_frames(300))
    windower = ChunkWindower(retain_frames=40)
    first, _ = windower.pop_window(fbank), windower.pop_window(fbank)
    assert fbank.num_frames_dropped == 128 - 40  # 40 frames kept before the next window
    windower.rewind(100)
    expected = fbank.get_frames(100, 167)
    again = windower.pop_window(fbank)
    assert again is not None and again.start_frame == 100
    np.testing.assert_array_equal(again.feats, expected)
    assert first is not None and windower.next_start_frame == 164
    with pytest.raises(ValueError, match="cannot rewind forward: frame 200 > next window start 164"):
        windower.rewind(200)
    with pytest.raises(ValueError, match="frame 100 is no longer retained"):
        windower.rewind(100)
    with pytest.raises(ValueError, match="retain_frames must be >= 0, got -1"):
        ChunkWindower(retain_frames=-1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_size": 0}, "chunk_size must be >= 1, got 0"),
        ({"subsampling": 0}, "subsampling must be >= 1, got 0"),
        ({"right_context": -1}, "right_context must be >= 0, got -1"),
        ({"subsampling": 8, "right_context": 6}, "would skip fbank frames"),
    ],
)
def test_geometry_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ChunkGeometry(**kwargs)


def test_fbank_config_default_is_model_rate():
    assert FbankConfig().sample_rate == 16000
