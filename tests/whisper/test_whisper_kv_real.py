"""The real tiny.en through the paged decoder pool and through fp8 K/V, against the dense
full-precision tokens of the devset's real recordings."""

from __future__ import annotations

import pytest
import torch
from whisper_devset import dense_greedy, rows_named

from oasr.models.whisper import WhisperCheckpoint
from oasr.models.whisper.transcriber import WhisperDecodeConfig, WhisperTranscriber
from oasr.models.whisper.window import EncoderWindow
from oasr.text.wer import ErrorCounts, normalize_transcript

pytestmark = pytest.mark.slow
PAGED_STEMS = ("george_0", "jackson_1", "jfk", "sense_and_sensibility_01_austen_64kb-0870")


def devset_wer(checkpoint: WhisperCheckpoint, recordings, tokens: list[list[int]]) -> float:
    counts = ErrorCounts()
    for rec, row in zip(recordings, tokens, strict=True):
        counts.add(rec.reference, normalize_transcript(checkpoint.tokenizer.decode(row)))
    return counts.wer


def test_paged_transcriber_gives_the_dense_tokens(checkpoint: WhisperCheckpoint, devset_encoded,
                                                  dense_tokens, recordings) -> None:
    rows = rows_named(recordings, *PAGED_STEMS)
    transcriber = WhisperTranscriber(checkpoint, WhisperDecodeConfig(max_rows=4))
    assert transcriber.storage == "paged" and transcriber.manager is not None
    pool = transcriber.manager.pool
    results = transcriber.decode_encoded(devset_encoded[rows])
    assert [list(r.tokens) for r in results] == [dense_tokens[i] for i in rows]
    assert pool.num_free_blocks == pool.num_blocks
    assert transcriber.manager.num_reserved_blocks == 0 and transcriber.manager.num_rows == 0


def test_paged_pool_refuses_past_its_budget_and_stays_full(checkpoint: WhisperCheckpoint,
                                                           devset_encoded) -> None:
    # 2 rows of (448 / 16 = 28) + (1500 / 16 -> 94) pages fit in 244; a third row does not.
    config = WhisperDecodeConfig(max_rows=3, max_num_blocks=244)
    transcriber = WhisperTranscriber(checkpoint, config)
    with pytest.raises(RuntimeError, match="3 rows need 366 blocks, 244 unreserved of 244"):
        transcriber.decode_encoded(devset_encoded[:3])
    assert transcriber.manager is not None
    assert transcriber.manager.pool.num_free_blocks == 244


def test_fp8_kv_wer_within_one_point(checkpoint: WhisperCheckpoint, recordings, devset_encoded,
                                     dense_tokens) -> None:
    fp8_tokens = dense_greedy(checkpoint, devset_encoded, kv_cache="fp8_e4m3")
    full, fp8 = devset_wer(checkpoint, recordings, dense_tokens), devset_wer(
        checkpoint, recordings, fp8_tokens)
    same = sum(a == b for a, b in zip(fp8_tokens, dense_tokens, strict=True))
    print(f"devset WER full {full:.2f}% fp8 {fp8:.2f}%; identical tokens {same}/{len(fp8_tokens)}")
    assert abs(fp8 - full) <= 1.0


def test_fp8_paged_matches_fp8_dense(checkpoint: WhisperCheckpoint, devset_encoded,
                                     recordings) -> None:
    rows = rows_named(recordings, *PAGED_STEMS[:2])
    transcriber = WhisperTranscriber(
        checkpoint, WhisperDecodeConfig(max_rows=2, kv_cache="fp8_e4m3", max_new_tokens=64))
    assert transcriber.manager is not None
    assert transcriber.manager.pool.dtype == torch.float8_e4m3fn
    paged = [list(r.tokens) for r in transcriber.decode_encoded(devset_encoded[rows])]
    assert paged == dense_greedy(checkpoint, devset_encoded[rows], kv_cache="fp8_e4m3")
    assert transcriber.manager.pool.num_free_blocks == transcriber.manager.pool.num_blocks


def test_second_pass_timing_of_a_five_second_segment(checkpoint: WhisperCheckpoint,
                                                     recordings) -> None:
    from oasr.models.whisper.timing import time_second_pass

    jfk = recordings[rows_named(recordings, "jfk")[0]]
    timings = {}
    for mode in ("full", "fit"):
        config = WhisperDecodeConfig(max_rows=1, encoder_window=EncoderWindow(mode))
        timing = time_second_pass(WhisperTranscriber(checkpoint, config), jfk.waveform[:80000],
                                  repeats=1)
        print(f"second pass, 5 s segment, CPU, {mode} window ({timing.encoder_frames} frames): "
              f"{timing.total_s:.2f} s (frontend {timing.frontend_s:.2f}, encoder "
              f"{timing.encoder_s:.2f}, decoder {timing.decoder_s:.2f}, {timing.num_tokens} "
              f"tokens), RTF {timing.real_time_factor:.2f}")
        assert timing.audio_seconds == 5.0
        assert 0 < timing.frontend_s < timing.total_s and timing.decoder_s > 0
        timings[mode] = timing
    # 5 s + the 2 s margin, in 0.5 s buckets: 7 s
    assert (timings["full"].encoder_frames, timings["fit"].encoder_frames) == (3000, 700)
    assert timings["full"].text == "And so my fellow Americans ask not"
    assert "my fellow Americans" in timings["fit"].text
