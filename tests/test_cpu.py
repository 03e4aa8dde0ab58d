"""What oasr reads of the CPU (`oasr.cpu`): a /proc/cpuinfo text's first processor, the
benchmark's description of it, and the flags the dtype rule reads."""

from __future__ import annotations

import pytest

import oasr.cpu as cpu_facts

# two processors of a 2-vCPU Zen 4 EPYC, as /proc/cpuinfo lists them (flags cut short)
EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 avx512_vnni

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 avx512_vnni amx_bf16
"""
# an ARM machine's: no model name, no flags line (its "Features" name other instructions)
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics bf16 i8mm
CPU implementer\t: 0x41
"""


def test_the_first_processor_is_read_and_named_with_its_kernel_features() -> None:
    first = cpu_facts.first_processor(EPYC)
    assert first["model name"] == "AMD EPYC" and first["cpu family"] == "25"
    assert "amx_bf16" not in first["flags"].split()  # the second processor's line is not read
    described = cpu_facts.describe(first)
    assert described == {"cpu": "AMD EPYC", "cpu_family_model": "family 25 model 17",
                         "cpu_features": ["avx2", "avx512f", "avx512_bf16", "avx512_vnni"]}
    machine = {**described, "cpu_count": 2}
    assert cpu_facts.summary(machine) == \
        "AMD EPYC (family 25 model 17; avx2, avx512f, avx512_bf16, avx512_vnni)"


def test_a_cpu_without_x86_flags_is_named_by_the_platform() -> None:
    described = cpu_facts.describe(cpu_facts.first_processor(ARM))
    assert described["cpu_family_model"] is None and described["cpu_features"] == []
    assert described["cpu"]  # platform.processor() or platform.machine()
    assert cpu_facts.summary({**described}) == described["cpu"]


@pytest.mark.parametrize(("flags", "bf16", "int8"), [
    ({"avx2", "fma"}, False, False),
    ({"avx2", "avx512f", "avx512_vnni"}, False, True),
    ({"avx2", "avx512_bf16", "avx512_vnni"}, True, True),
    ({"amx_bf16", "amx_int8", "amx_tile"}, True, True),
])
def test_the_dtype_facts_follow_the_flags(monkeypatch: pytest.MonkeyPatch, flags: set[str],
                                          bf16: bool, int8: bool) -> None:
    monkeypatch.setattr(cpu_facts, "flags", lambda: frozenset(flags))
    assert cpu_facts.has_native_bf16() is bf16
    assert cpu_facts.has_int8_dot() is int8


def test_unreadable_flags_leave_bfloat16_to_torchs_own_query(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(cpu_facts, "flags", lambda: frozenset())
    for avx512_bf16, amx in ((False, False), (True, False), (False, True)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert cpu_facts.has_native_bf16() is (avx512_bf16 or amx)
    assert not cpu_facts.has_int8_dot()
