"""Which float precision a CPU run computes in: bf16 where the CPU has bf16 matrix units, float32 elsewhere.

bf16 is only fast where hardware does the bf16 multiply-adds and oneDNN (torch's bf16 matmul path, and vLLM's CPU
build's) drives them. Without them torch falls back to a scalar loop: bf16 then costs 30x float32 instead of saving.
Measured on a 1024 x 576 x 1536 matmul on one thread (docs/cpu.md, "Which precision a CPU run uses"):

    Intel Xeon, AMX + AVX512-BF16         8.8x faster in bf16
    AMD EPYC (Zen 5), AVX512-BF16         4.5x faster in bf16
    AMD EPYC, AVX2 only                   30x slower in bf16

So the CPU twins (trainer and vLLM) and the CPU evaluation default to bf16 on the first two kinds and float32 on
the third; ``EXGRPO_CPU_PRECISION=bf16|fp32`` forces either. oneDNN's ``DNNL_MAX_CPU_ISA`` (e.g. ``AVX2``) hides
the units from torch as well, and the choice follows it.

``python -m exgrpo.precision`` prints the choice and its reason on one line, tab-separated, for the launchers
(the reason has no quote characters: it goes into a hydra override);
a bad ``EXGRPO_CPU_PRECISION`` is one line on stderr and exit status 2. Imports nothing of the project, and torch
only when asked (without torch, /proc/cpuinfo's flags decide).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV = "EXGRPO_CPU_PRECISION"
PRECISIONS = ("bf16", "fp32")
# The names each engine's config gives them: verl's FSDP dtype and vLLM's dtype, verl's mixed-precision dtypes.
TORCH_DTYPE = {"bf16": "bfloat16", "fp32": "float32"}


@dataclass(frozen=True)
class BF16Units:
    """What the CPU offers for bf16 matrix work, as torch and oneDNN see it."""

    amx: bool  # AMX tiles (Intel Xeon 4th generation on)
    avx512_bf16: bool  # AVX512-BF16 dot products (Intel Cooper Lake on, AMD Zen 4 on)
    onednn: bool  # oneDNN will run bf16 kernels here (False when DNNL_MAX_CPU_ISA caps it below them)
    seen_by: str = "torch"  # "torch", or "/proc/cpuinfo" where torch is not installed

    @property
    def usable(self) -> bool:
        return (self.amx or self.avx512_bf16) and self.onednn


@dataclass(frozen=True)
class Choice:
    precision: str  # "bf16" or "fp32"
    reason: str

    @property
    def torch_dtype(self) -> str:
        return TORCH_DTYPE[self.precision]


def detect_bf16_units() -> BF16Units:
    """This CPU's bf16 units as torch (its cpuinfo) and oneDNN report them; /proc/cpuinfo's flags without torch."""
    try:
        import torch
    except ImportError:
        return _units_from_cpuinfo()
    cpu = torch.cpu
    amx = bool(getattr(cpu, "_is_amx_tile_supported", lambda: False)())
    avx512_bf16 = bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)())
    onednn = torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return BF16Units(amx=amx, avx512_bf16=avx512_bf16, onednn=onednn)


def _units_from_cpuinfo(cpuinfo: str | None = None) -> BF16Units:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = set(value.split())
            break
    isa_cap = os.environ.get("DNNL_MAX_CPU_ISA", "").upper()
    capped = bool(isa_cap) and not isa_cap.startswith(("AVX512_CORE", "AVX10", "ALL"))  # oneDNN's ISA names
    return BF16Units(amx="amx_bf16" in flags, avx512_bf16="avx512_bf16" in flags, onednn=not capped,
                     seen_by="/proc/cpuinfo")


def choose(units: BF16Units, requested: str | None = None) -> Choice:
    """The precision for a CPU run: ``requested`` (``EXGRPO_CPU_PRECISION``) if given, else by ``units``.

    Raises ValueError naming the variable for a value other than bf16 or fp32.
    """
    if requested:
        if requested not in PRECISIONS:
            raise ValueError(f"{ENV}={requested}: use bf16 or fp32 (unset: chosen by the CPU's bf16 units)")
        return Choice(requested, f"{ENV}={requested}")
    found = [name for name, has in (("AMX", units.amx), ("AVX512-BF16", units.avx512_bf16)) if has]
    if units.usable:
        return Choice("bf16", f"{' and '.join(found)} units on this CPU run bf16 matmuls ({units.seen_by})")
    if found:
        cap = os.environ.get("DNNL_MAX_CPU_ISA")
        why = f"DNNL_MAX_CPU_ISA={cap}" if cap else "oneDNN does not use them"
        return Choice("fp32", f"{' and '.join(found)} units on this CPU are off for oneDNN ({why}): bf16 would "
                              "be emulated, far slower than float32")
    return Choice("fp32", f"this CPU has no AMX or AVX512-BF16 units ({units.seen_by}): bf16 would be emulated, "
                          "far slower than float32")


def cpu_precision(environ: Mapping[str, str] = os.environ) -> Choice:
    """The CPU precision in force for this process: ``EXGRPO_CPU_PRECISION`` if set, else this CPU's units."""
    requested = environ.get(ENV) or None
    return choose(BF16Units(False, False, False) if requested else detect_bf16_units(), requested)

def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--dtype"]):
        print("usage: python -m exgrpo.precision [--dtype]", file=sys.stderr)
        return 2
    try:
        choice = cpu_precision()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{choice.torch_dtype if args else choice.precision}\t{choice.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
