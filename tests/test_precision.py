"""The CPU precision rule: bf16 where the CPU has bf16 matrix units that oneDNN drives, float32 elsewhere.

Both branches are fed here whatever CPU runs the suite; the detection is checked against lscpu's flags, and oneDNN's
DNNL_MAX_CPU_ISA (a real cap, measured to take torch's bf16 matmul from 535 to 2.9 GFLOP/s on an AVX512-BF16 CPU)
gives every machine the float32 branch end to end.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from exgrpo.precision import ENV, BF16Units, _units_from_cpuinfo, choose, cpu_precision, detect_bf16_units

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("amx", "avx512_bf16"), [(True, True), (True, False), (False, True)])
def test_bf16_where_amx_or_avx512_bf16_units_are_there_and_onednn_uses_them(amx, avx512_bf16):
    choice = choose(BF16Units(amx=amx, avx512_bf16=avx512_bf16, onednn=True))
    assert (choice.precision, choice.torch_dtype) == ("bf16", "bfloat16")
    named = [name for name, has in (("AMX", amx), ("AVX512-BF16", avx512_bf16)) if has]
    assert choice.reason.startswith(" and ".join(named) + " units on this CPU run bf16 matmuls")


def test_float32_without_units_or_when_onednn_is_capped_below_them(monkeypatch):
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    bare = choose(BF16Units(amx=False, avx512_bf16=False, onednn=True))
    assert (bare.precision, bare.torch_dtype) == ("fp32", "float32")
    assert "no AMX or AVX512-BF16 units" in bare.reason
    # units on the die, but oneDNN told not to use them
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    capped = choose(BF16Units(amx=False, avx512_bf16=True, onednn=False))
    assert capped.precision == "fp32" and "AVX512-BF16 units on this CPU are off for oneDNN (DNNL_MAX_CPU_ISA=AVX2)" \
        in capped.reason


@pytest.mark.parametrize("units", [BF16Units(True, True, True), BF16Units(False, False, False)])
def test_the_variable_forces_either_and_a_bad_value_names_it(units):
    for requested in ("bf16", "fp32"):
        assert choose(units, requested).precision == requested
        assert choose(units, requested).reason == f"{ENV}={requested}"
    with pytest.raises(ValueError, match=rf"^{ENV}=fp16: use bf16 or fp32"):
        choose(units, "fp16")


@given(st.booleans(), st.booleans(), st.booleans(), st.sampled_from(["", "AVX2", "AVX512_CORE", "SSE41"]))
def test_every_reason_fits_in_a_single_quoted_hydra_value(amx, avx512_bf16, onednn, cap):
    before = os.environ.pop("DNNL_MAX_CPU_ISA", None)  # the session's own value comes back after each example
    if cap:
        os.environ["DNNL_MAX_CPU_ISA"] = cap
    try:
        reason = choose(BF16Units(amx, avx512_bf16, onednn)).reason
    finally:
        os.environ.pop("DNNL_MAX_CPU_ISA", None)
        if before is not None:
            os.environ["DNNL_MAX_CPU_ISA"] = before
    assert reason and not set(reason) & {"'", '"', "\t", "\n"}


def _lscpu_flags() -> set[str]:
    if not Path("/proc/cpuinfo").exists():
        pytest.skip("needs Linux's /proc/cpuinfo")
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    pytest.skip("/proc/cpuinfo has no flags line (not x86)")


def test_detection_agrees_with_the_cpus_flags_and_the_fallback_reads_them_alike():
    # (DNNL_MAX_CPU_ISA is left as the session has it: oneDNN reads it once per process, at torch's first question)
    flags = _lscpu_flags()
    units = detect_bf16_units()
    assert units.amx == ("amx_tile" in flags) and units.avx512_bf16 == ("avx512_bf16" in flags)
    assert units.seen_by == "torch"
    fallback = _units_from_cpuinfo()
    assert (fallback.amx, fallback.avx512_bf16, fallback.seen_by) == (units.amx, units.avx512_bf16, "/proc/cpuinfo")
    assert fallback.usable == units.usable  # a cap in the environment counts alike
    # unset EXGRPO_CPU_PRECISION: the rule over this CPU's units
    assert cpu_precision({}) == choose(units)
    assert cpu_precision({ENV: "fp32"}).precision == "fp32"


def test_cpuinfo_fallback_reads_the_first_flags_line_and_onednns_cap(monkeypatch):
    text = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t\t: amx_bf16\n"
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert _units_from_cpuinfo(text) == BF16Units(False, True, True, "/proc/cpuinfo")
    for cap, onednn in (("AVX2", False), ("avx512_core_bf16", True), ("AVX512_CORE_AMX", True), ("ALL", True)):
        monkeypatch.setenv("DNNL_MAX_CPU_ISA", cap)
        assert _units_from_cpuinfo(text).onednn is onednn, cap
    assert _units_from_cpuinfo("") == BF16Units(False, False, True, "/proc/cpuinfo")


def _command(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != ENV}
    return subprocess.run([sys.executable, "-m", "exgrpo.precision", *args], capture_output=True, text=True,
                          env={**base, **env}, cwd=REPO, timeout=120)


def test_the_command_prints_the_choice_and_why_and_refuses_a_bad_value_in_one_line():
    done = _command()
    choice = cpu_precision({})
    assert done.returncode == 0 and done.stdout == f"{choice.precision}\t{choice.reason}\n"
    assert _command("--dtype", **{ENV: "fp32"}).stdout == f"float32\t{ENV}=fp32\n"
    bad = _command(**{ENV: "fp16"})
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.splitlines()) == 1
    assert bad.stderr.startswith(f"error: {ENV}=fp16: use bf16 or fp32")


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_onednn_capped_at_avx2_gives_float32_on_any_x86_cpu():
    """DNNL_MAX_CPU_ISA=AVX2 is how an AMX or AVX512-BF16 machine takes the AVX2-only machines' branch: oneDNN then
    reports no bf16 support to torch, and the command picks float32, naming the cap where units exist."""
    if not torch.cpu._is_avx2_supported():
        pytest.skip("needs an x86 CPU with AVX2 (DNNL_MAX_CPU_ISA names x86 ISAs)")
    done = _command(DNNL_MAX_CPU_ISA="AVX2")
    assert done.returncode == 0 and done.stdout.startswith("fp32\t"), done.stdout + done.stderr
    units = detect_bf16_units()
    if units.amx or units.avx512_bf16:
        assert "DNNL_MAX_CPU_ISA=AVX2" in done.stdout


def test_the_choice_covers_every_combination():
    for amx, avx512_bf16, onednn in itertools.product((False, True), repeat=3):
        expected = "bf16" if (amx or avx512_bf16) and onednn else "fp32"
        assert choose(BF16Units(amx, avx512_bf16, onednn)).precision == expected
