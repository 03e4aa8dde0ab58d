"""Reader for CTranslate2's ``model.bin`` (binary format version 6, little endian).

Layout: u32 version, string spec name, u32 revision, u32 variable count; per variable a string
name, u8 rank, u32 dims[rank], u8 dtype, u32 byte count, raw bytes; then u32 alias count and
(alias, target) string pairs. A string is a u16 length that counts a trailing NUL, the UTF-8
bytes, then the NUL. An int8 weight ``<name>`` comes with a float scale ``<name>_scale`` (one per
output row); ``read_ct2_model`` dequantizes it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

SUPPORTED_BINARY_VERSION = 6

# dtype codes of the format: 0 f32, 1 i8, 2 i16, 3 i32, 4 f16, 5 bf16.
_NUMPY_DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
}
_BF16_CODE = 5


@dataclass(frozen=True)
class Ct2Model:
    """The variables of one ``model.bin``, aliases resolved, int8 weights dequantized.

    Attributes:
        spec_name: the model spec, e.g. ``WhisperSpec``.
        revision: the spec revision.
        variables: name -> tensor on CPU, in the stored dtype (float16 / float32 / int).
        aliases: alias -> target name as stored (already resolved in ``variables``).
    """

    spec_name: str
    revision: int
    variables: dict[str, torch.Tensor]
    aliases: dict[str, str]

    def scalar(self, name: str) -> int:
        """An int scalar variable (flags, head counts) as a Python int."""
        return int(self.get(name).reshape(-1)[0].item())

    def get(self, name: str) -> torch.Tensor:
        """One variable; ``KeyError`` naming the missing key and the spec."""
        try:
            return self.variables[name]
        except KeyError:
            raise KeyError(
                f"{self.spec_name} model.bin has no variable {name!r} "
                f"({len(self.variables)} variables)"
            ) from None


class _Reader:
    def __init__(self, data: bytes, source: str) -> None:
        self.data = data
        self.offset = 0
        self.source = source

    def take(self, n: int) -> bytes:
        if self.offset + n > len(self.data):
            raise ValueError(
                f"{self.source}: truncated model.bin, need {n} bytes at offset {self.offset}, "
                f"file has {len(self.data)}"
            )
        out = self.data[self.offset : self.offset + n]
        self.offset += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int(struct.unpack("<H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def string(self) -> str:
        length = self.u16()
        raw = self.take(length)
        if length == 0 or raw[-1] != 0:
            raise ValueError(f"{self.source}: string at offset {self.offset - length} lacks its NUL")
        return raw[:-1].decode("utf-8")


def _decode_array(raw: bytes, dims: list[int], code: int, name: str) -> torch.Tensor:
    if code == _BF16_CODE:
        halves = np.frombuffer(raw, dtype="<u2").astype(np.int32) << 16
        return torch.from_numpy(halves.view(np.float32).copy()).to(torch.bfloat16).reshape(dims)
    if code not in _NUMPY_DTYPES:
        raise ValueError(f"variable {name!r} has unknown dtype code {code} (known: 0..5)")
    dtype = _NUMPY_DTYPES[code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if expected != len(raw):
        raise ValueError(f"variable {name!r}: dims {dims} x {dtype.itemsize} B != {len(raw)} bytes")
    return torch.from_numpy(np.frombuffer(raw, dtype=dtype).copy()).reshape(dims)


def _dequantize_int8(variables: dict[str, torch.Tensor]) -> None:
    for name in [n for n, t in variables.items() if t.dtype == torch.int8 and t.dim() >= 2]:
        scale = variables.pop(f"{name}_scale", None)
        if scale is None:
            raise ValueError(f"int8 weight {name!r} comes without its {name}_scale")
        rows = scale.float().reshape(-1, *([1] * (variables[name].dim() - 1)))
        variables[name] = variables[name].float() / rows


def read_ct2_model(path: str | Path) -> Ct2Model:
    """Parse a CTranslate2 ``model.bin``.

    Args:
        path: the ``model.bin`` file, or the directory holding it.
    Returns:
        The model's variables; int8 weights are dequantized to float32 (``w / scale`` per row).
    Raises:
        ValueError: a binary version other than 6, truncation, or an unknown dtype code.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "model.bin"
    reader = _Reader(path.read_bytes(), str(path))
    version = reader.u32()
    if version != SUPPORTED_BINARY_VERSION:
        raise ValueError(
            f"{path}: model.bin binary version {version}, only {SUPPORTED_BINARY_VERSION} is read"
        )
    spec_name = reader.string()
    revision = reader.u32()
    variables: dict[str, torch.Tensor] = {}
    for _ in range(reader.u32()):
        name = reader.string()
        dims = [reader.u32() for _ in range(reader.u8())]
        code = reader.u8()
        variables[name] = _decode_array(reader.take(reader.u32()), dims, code, name)
    aliases: dict[str, str] = {}
    for _ in range(reader.u32()):
        alias, target = reader.string(), reader.string()
        aliases[alias] = target
    _dequantize_int8(variables)
    for alias, target in aliases.items():
        if target not in variables:
            raise ValueError(f"{path}: alias {alias!r} points at missing variable {target!r}")
        variables[alias] = variables[target]
    return Ct2Model(spec_name, revision, variables, aliases)
