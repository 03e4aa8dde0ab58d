"""Second-pass decoder K/V sizing: bytes per token by format, pools built from a
byte budget, ``can_admit`` deciding how many rows run, and the engine/CLI options that reach
them."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from ct2_writer import write_tiny_tokenizer
from whisper_testutil import TINY, TINY_SPEC, tiny_encoded, tiny_model

from oasr.engine import EngineConfig
from oasr.fmha.fp8 import FP8_DTYPE
from oasr.models.whisper import WhisperCheckpoint, WhisperTokenizer
from oasr.models.whisper import quantization as quant
from oasr.models.whisper.continuous import ContinuousWhisperDecoder
from oasr.models.whisper.quantization import check_kv_cache_servable, decoder_kv_bytes_per_token
from oasr.models.whisper.transcriber import (
    WhisperDecodeConfig,
    build_decoder_manager,
    check_pool_admits_a_request,
    decoder_pool_blocks,
    rows_per_request,
    without_safeguards,
)

# TINY: 2 decoder layers, 2 kv heads of 16 dims. A row: prompt 2 + 12 new tokens = 4 pages of 4
# tokens, plus 20 encoder frames = 5 pages: 9 pages.
ROW_PAGES = 9
FP32_PAGE = 4 * 2 * 2 * 2 * 16 * 4  # 2048 bytes
FP8_PAGE = 4 * 2 * 2 * 2 * (16 + 4)  # 640 bytes


def checkpoint(tmp_path: Path) -> WhisperCheckpoint:
    write_tiny_tokenizer(tmp_path / "tokenizer.json", TINY.n_vocab)
    return WhisperCheckpoint(tiny_model(5), WhisperTokenizer(tmp_path), TINY_SPEC, tmp_path)


def budget(pages: int, page_bytes: int) -> float:
    return pages * page_bytes / 2**30


def test_bytes_per_token_follow_the_format() -> None:
    f16 = decoder_kv_bytes_per_token(4, 6, 64, torch.float16, None)
    fp8 = decoder_kv_bytes_per_token(4, 6, 64, torch.float16, "fp8_e4m3")
    assert (f16, fp8) == (2 * 4 * 6 * 64 * 2, 2 * 4 * 6 * 68)
    assert round(f16 / fp8, 2) == 1.88
    d128 = decoder_kv_bytes_per_token(4, 6, 128, torch.float16, None)
    assert round(d128 / decoder_kv_bytes_per_token(4, 6, 128, torch.float16, "fp8_e4m3"), 2) == 1.94
    assert decoder_kv_bytes_per_token(2, 2, 16, torch.float32, None) * 4 == FP32_PAGE
    with pytest.raises(ValueError, match="unknown decoder kv_cache format 'int4'"):
        decoder_kv_bytes_per_token(2, 2, 16, torch.float32, "int4")


@pytest.mark.parametrize("kv_cache", [None, "fp8_e4m3"])
def test_the_formula_is_what_the_pool_allocates(tmp_path: Path, kv_cache: str | None) -> None:
    manager = build_decoder_manager(checkpoint(tmp_path),
                                    WhisperDecodeConfig(kv_cache=kv_cache, max_new_tokens=12,
                                                        block_size=4, max_rows=3))
    pool = manager.pool
    allocated = pool.nbytes
    if kv_cache:
        assert pool.dtype == FP8_DTYPE
        assert manager.k_scales is not None and manager.v_scales is not None
        allocated += manager.k_scales.nbytes + manager.v_scales.nbytes
    per_token = decoder_kv_bytes_per_token(TINY.n_text_layer, TINY.n_text_head,
                                           TINY.text_head_dim, torch.float32, kv_cache)
    assert pool.num_blocks == 3 * ROW_PAGES
    assert allocated == per_token * 4 * pool.num_physical_blocks


def test_a_budget_buys_more_pages_in_fp8(tmp_path: Path) -> None:
    ck = checkpoint(tmp_path)
    two_rows = budget(2 * ROW_PAGES, FP32_PAGE)
    config = WhisperDecodeConfig(max_new_tokens=12, block_size=4, kv_budget_gib=two_rows)
    assert decoder_pool_blocks(ck, config) == 2 * ROW_PAGES
    fp8 = replace(config, kv_cache="fp8_e4m3")
    assert decoder_pool_blocks(ck, fp8) == (2 * ROW_PAGES * FP32_PAGE) // FP8_PAGE == 57
    with pytest.raises(ValueError, match=r"holds 8 pages of 2048 bytes .* needs 9: raise the "
                       r"budget to at least"):
        decoder_pool_blocks(ck, replace(config, kv_budget_gib=budget(8, FP32_PAGE)))
    with pytest.raises(ValueError, match="not both"):
        WhisperDecodeConfig(kv_budget_gib=1.0, max_num_blocks=64)
    with pytest.raises(ValueError, match="positive number of GiB"):
        WhisperDecodeConfig(kv_budget_gib=0.0)


@pytest.mark.parametrize(("kv_cache", "running"), [(None, 2), ("fp8_e4m3", 6)])
def test_can_admit_decides_how_many_rows_run(tmp_path: Path, kv_cache: str | None,
                                             running: int) -> None:
    """Same byte budget, same 8 slots: float32 pages hold 2 rows at their ceiling, fp8 pages
    57 // 9 = 6; the rest wait for pages, and every request still finishes (plain greedy:
    a sampled fallback's rows are the next test's)."""
    config = without_safeguards(WhisperDecodeConfig(
        kv_cache=kv_cache, max_new_tokens=12, block_size=4, max_rows=8,
        kv_budget_gib=budget(2 * ROW_PAGES, FP32_PAGE)))
    decoder = ContinuousWhisperDecoder(checkpoint(tmp_path), config)
    encoded = tiny_encoded(8, seed=3)
    for request in range(8):
        decoder.submit_encoded(request, encoded[request])
    decoder.step()
    assert (decoder.num_running, decoder.num_waiting) == (running, 8 - running)
    done, most = set(), 0
    while decoder.has_work():
        done |= {r.request_id for r in decoder.step()}
        most = max(most, decoder.num_running)
    assert done == set(range(8)) and most <= running
    pool = decoder.manager.pool
    assert pool.num_free_blocks == pool.num_blocks and decoder.manager.num_reserved_blocks == 0


def test_a_pool_that_cannot_hold_a_fallback_is_refused(tmp_path: Path) -> None:
    """The fallback ladder decodes every remaining temperature at once (5 rows at least);
    pages for 2 rows would leave such a request waiting forever, so the engine's second pass
    refuses the budget up front."""
    ck = checkpoint(tmp_path)
    small = WhisperDecodeConfig(max_new_tokens=12, block_size=4, max_rows=5,
                                kv_budget_gib=budget(2 * ROW_PAGES, FP32_PAGE))
    assert rows_per_request(small) == 5 and rows_per_request(without_safeguards(small)) == 1
    # best_of samples per temperature as far as the rows allow: 16 rows hold 5 x 3
    assert rows_per_request(replace(small, max_rows=16)) == 15
    with pytest.raises(ValueError, match="max_rows=3 cannot hold the fallback ladder"):
        ContinuousWhisperDecoder(ck, replace(small, max_rows=3))
    with pytest.raises(ValueError, match=r"cannot admit one request's 5 rows .* 5 rows need 45 "
                       r"blocks, 18 unreserved of 18"):
        check_pool_admits_a_request(build_decoder_manager(ck, small), small, 14)
    check_pool_admits_a_request(build_decoder_manager(ck, without_safeguards(small)),
                                without_safeguards(small), 14)
    fp8 = replace(small, kv_cache="fp8_e4m3")  # the same budget in fp8 holds 6 rows
    check_pool_admits_a_request(build_decoder_manager(ck, fp8), fp8, 14)


def test_a_device_that_cannot_store_fp8_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = {"kv_cache_dtypes": ("fp8_e4m3",), "model_dtype": torch.float32,
          "device": torch.device("cpu"), "head_dim": 64, "attn_backend": "torch"}
    assert quant.device_stores_fp8(torch.device("cpu"))  # this torch stores fp8 on CPU
    check_kv_cache_servable("fp8_e4m3", **ok)
    monkeypatch.setattr(quant, "device_stores_fp8", lambda device: False)
    with pytest.raises(ValueError, match="cannot store float8_e4m3fn on cpu"):
        check_kv_cache_servable("fp8_e4m3", **ok)


def test_engine_config_carries_the_second_pass_kv_options() -> None:
    config = EngineConfig(second_pass="whisper", quantization={"kv_cache": "fp8_e4m3"},
                          decode_kv_budget_gib=0.25, max_decode_slots=12)
    decode = config.second_pass_decode_config()
    assert (decode.kv_cache, decode.max_rows, decode.kv_budget_gib) == ("fp8_e4m3", 12, 0.25)
    assert decode.beam_size == config.second_pass_decode.beam_size == 5  # the rest is kept
    own = EngineConfig(second_pass_decode=WhisperDecodeConfig(kv_cache="fp8_e4m3",
                                                              max_num_blocks=500),
                       decode_kv_budget_gib=1.0).second_pass_decode_config()
    assert (own.kv_cache, own.max_num_blocks, own.kv_budget_gib) == ("fp8_e4m3", None, 1.0)
    assert EngineConfig().second_pass_decode_config().max_rows == 16
    assert EngineConfig(max_batch_size=3).resolved_max_decode_slots == 16
    assert EngineConfig().second_pass_decode_config().kv_cache is None
    with pytest.raises(ValueError, match="needs an autoregressive decoder: set second_pass="):
        EngineConfig(quantization={"kv_cache": "fp8_e4m3"})
    with pytest.raises(ValueError, match=r"unknown quantization keys \['weights'\]"):
        EngineConfig(second_pass="whisper", quantization={"weights": "int8"})
    with pytest.raises(ValueError, match="decode_kv_budget_gib must be a positive"):
        EngineConfig(decode_kv_budget_gib=float("nan"))
    with pytest.raises(ValueError, match="max_decode_slots must be >= 1"):
        EngineConfig(max_decode_slots=0)


def test_cli_options_reach_the_engine_config() -> None:
    from oasr.engine.options import add_engine_arguments, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--second-pass", "whisper", "--quantization-option",
                              "kv_cache=fp8_e4m3", "--decode-kv-budget-gib", "0.5",
                              "--max-decode-slots", "12", "--lm", "none"])
    config = engine_config_from_args(args)
    assert config.quantization == {"kv_cache": "fp8_e4m3"}
    assert (config.decode_kv_budget_gib, config.max_decode_slots) == (0.5, 12)
    defaults = engine_config_from_args(parser.parse_args(["--lm", "none"]))
    assert defaults.quantization is None and defaults.max_decode_slots is None
    bad = parser.parse_args(["--quantization-option", "kv_cache=fp4", "--lm", "none"])
    with pytest.raises(ValueError, match="unknown decoder kv_cache format 'fp4'"):
        engine_config_from_args(bad)
