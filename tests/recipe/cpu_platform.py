"""Test-only: a verl "platform" that is the CPU, so verl's FSDP2 engine runs without a GPU.

verl 0.9.1 has no CPU platform: it falls back to CUDA, whose device calls fail on a CPU-only torch. This
subclass of verl's CUDA platform reports device "cpu", the gloo backend and no-op memory/sync calls; with
``VERL_ENGINE_DEVICE=cuda`` the engine registry still hands out the FSDP engine. Never used outside tests.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

from verl.plugin.platform import platform_manager
from verl.plugin.platform.platform_cuda import PlatformCUDA


class _CPUDeviceModule:
    """``torch.cpu`` plus the memory queries verl makes on a device module, answered with zeros."""

    def __getattr__(self, name: str) -> Any:
        import torch

        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name.startswith(("memory_", "max_memory_", "reset_")) or name in ("empty_cache", "ipc_collect"):
            return lambda *args, **kwargs: 0
        if name == "get_device_name":
            return lambda *args, **kwargs: "CPU"
        if name == "mem_get_info":
            return lambda *args, **kwargs: (0, 0)
        raise AttributeError(f"CPU test device module has no attribute {name!r}")


class CPUTestPlatform(PlatformCUDA):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return _CPUDeviceModule()

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self) -> str:  # a string: verl passes it to torch as a device
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: Any) -> None:
        return None

    def synchronize(self, device_index: Any = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        return None

    def manual_seed_all(self, seed: int) -> None:
        return None

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def is_ipc_supported(self) -> bool:
        return False

    def get_collective_module(self) -> None:
        return None

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None


@contextmanager
def cpu_platform():
    """Install the CPU platform for the duration of the block, then restore whatever was there."""
    previous = platform_manager._current_platform
    platform_manager.set_platform(CPUTestPlatform())
    try:
        yield
    finally:
        platform_manager._current_platform = previous
