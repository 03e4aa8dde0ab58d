"""The CTranslate2 model.bin reader and the Whisper loader, on files written by the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ct2_writer import quantize_int8, write_model_bin, write_whisper_dir
from whisper_testutil import tiny_encoded, tiny_model

from oasr.models.whisper import DecoderKv, load_whisper, read_ct2_model


def test_reader_round_trips_every_dtype_and_resolves_aliases(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w16 = rng.standard_normal((3, 4)).astype(np.float16)
    w32 = rng.standard_normal((2, 2, 2)).astype(np.float32)
    bf16 = torch.randn(5).to(torch.bfloat16)
    bf16_bits = bf16.view(torch.int16).numpy().view(np.uint16)
    q, scale = quantize_int8(rng.standard_normal((4, 6)).astype(np.float32))
    variables = {"a/w16": w16, "a/w32": w32, "a/bf16": bf16_bits, "a/q": q, "a/q_scale": scale,
                 "a/heads": np.array(6, dtype=np.int16), "a/ids": np.arange(3, dtype=np.int32)}
    write_model_bin(tmp_path / "model.bin", variables, {"b/alias": "a/w16"},
                    raw_codes={"a/bf16": 5})
    model = read_ct2_model(tmp_path)
    assert (model.spec_name, model.revision) == ("WhisperSpec", 3)
    assert torch.equal(model.get("a/w16"), torch.from_numpy(w16))
    assert torch.equal(model.get("a/w32"), torch.from_numpy(w32))
    assert torch.equal(model.get("a/bf16"), bf16)
    assert model.scalar("a/heads") == 6 and model.get("a/ids").tolist() == [0, 1, 2]
    torch.testing.assert_close(model.get("a/q"), torch.from_numpy(q / scale[:, None]))
    assert "a/q_scale" not in model.variables
    assert model.get("b/alias") is model.get("a/w16") and model.aliases == {"b/alias": "a/w16"}
    with pytest.raises(KeyError, match="no variable 'nope'"):
        model.get("nope")


@pytest.mark.parametrize(
    ("variables", "kwargs", "message"),
    [
        ({}, {"version": 5}, "binary version 5, only 6"),
        ({"x": np.zeros(2, np.float32)}, {"raw_codes": {"x": 9}}, "unknown dtype code 9"),
        ({"w": np.zeros((2, 2), np.int8)}, {}, "comes without its w_scale"),
    ],
)
def test_reader_refuses_bad_files(tmp_path: Path, variables, kwargs, message) -> None:
    write_model_bin(tmp_path / "model.bin", variables, {}, **kwargs)
    with pytest.raises(ValueError, match=message):
        read_ct2_model(tmp_path / "model.bin")


def test_reader_refuses_truncation_and_dangling_aliases(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    write_model_bin(path, {"x": np.ones(8, np.float32)}, {})
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated model.bin"):
        read_ct2_model(path)
    write_model_bin(path, {"x": np.ones(8, np.float32)}, {"y": "missing"})
    with pytest.raises(ValueError, match="alias 'y' points at missing variable 'missing'"):
        read_ct2_model(path)


def _logits(model, encoded: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        kv = DecoderKv(model.decoder.cross_kv(encoded), 8)
        return model.decoder(torch.tensor([[61, 62, 3, 4]]), kv)


def test_loader_maps_every_whisper_variable(tmp_path: Path) -> None:
    source = tiny_model(seed=11)
    checkpoint = load_whisper(write_whisper_dir(source, tmp_path / "fp32", "float32"), "cpu")
    assert checkpoint.model.config == source.config
    for name, tensor in source.state_dict().items():
        assert torch.equal(checkpoint.model.state_dict()[name], tensor), name
    assert checkpoint.spec.prompt == (61, 62) and checkpoint.spec.eot == 60
    assert checkpoint.spec.suppress_ids == (63,) and checkpoint.spec.suppress_ids_begin == (60,)
    mel = torch.randn(1, 8, 40)
    with torch.inference_mode():
        torch.testing.assert_close(checkpoint.model.encoder(mel), source.encoder(mel))
    assert checkpoint.tokenizer.decode([5, 7, 60, 61]) == "w5 w7"


def test_a_cpu_checkpoint_stores_its_embedding_vocabulary_major(tmp_path: Path) -> None:
    """The logits' GEMM reads the vocabulary as the contiguous dimension; the values, the
    lookups and the logits are the contiguous layout's."""
    source = tiny_model(seed=13)
    loaded = load_whisper(write_whisper_dir(source, tmp_path / "fp32", "float32"), "cpu")
    weight = loaded.model.decoder.embedding.weight
    assert weight.stride() == (1, weight.size(0)) and weight.t().is_contiguous()
    assert torch.equal(weight, source.decoder.embedding.weight)
    encoded = tiny_encoded(1)
    torch.testing.assert_close(_logits(loaded.model, encoded), _logits(source, encoded))


def test_loader_reads_int8_and_float16_weights(tmp_path: Path) -> None:
    source = tiny_model(seed=12)
    encoded = tiny_encoded(1)
    expected = _logits(source, encoded)
    for weights, tolerance in (("float16", 0.05), ("int8", 0.5)):
        loaded = load_whisper(write_whisper_dir(source, tmp_path / weights, weights), "cpu")
        got = _logits(loaded.model, encoded)
        assert (got - expected).abs().max() < tolerance * expected.std(), weights


def test_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="has no model.bin"):
        load_whisper(tmp_path, "cpu")
    write_model_bin(tmp_path / "model.bin", {}, {}, spec="TransformerSpec")
    with pytest.raises(ValueError, match="expected a WhisperSpec model.bin, got spec 'TransformerSpec'"):
        load_whisper(tmp_path, "cpu")
