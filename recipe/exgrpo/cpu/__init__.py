"""verl 0.9.1 on a CPU: the platform, and the three fixes its GPU-only paths need, for the recipe's CPU mode.

verl has no CPU platform: it falls back to CUDA, whose device calls fail on a CPU-only torch. This module
registers one under the name ``cpu`` and is loaded in *every* process of a run (driver, Ray workers, vLLM's
engine process) by verl's own mechanism, ``VERL_USE_EXTERNAL_MODULES=recipe.exgrpo.cpu``, which
``verl/__init__.py`` imports. Registering is all it does unless the run asks for the CPU with
``VERL_PLATFORM=cpu``; then, in that process:

- verl's engine registry is pointed at the FSDP engine (``VERL_ENGINE_DEVICE=cuda``: the engines are
  registered for "cuda", and nothing in them needs CUDA once the platform answers for the device);
- the worker process group is created as plain ``cpu:gloo`` (verl would ask torch for the backend string
  ``cpu:gloo,cpu:gloo``, which torch rejects as a duplicate device);
- vLLM keeps linear weights as ordinary parameters (its CPU backend otherwise prepacks them for oneDNN and
  drops the ``Parameter``, so verl's in-place weight sync fails, or would update a stale copy);
- the device RNG is the CPU RNG, so a checkpoint's RNG state restores on resume.

The recipe's in-process tests install :class:`CPUPlatform` with ``platform_manager.set_platform``.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from contextlib import contextmanager
from typing import Any

from verl.plugin.platform import platform_manager
from verl.plugin.platform.platform_cuda import PlatformCUDA

PLATFORM_NAME = "cpu"
MODULE_NAME = __name__  # what VERL_USE_EXTERNAL_MODULES names

# ExGRPO in verl's separate_async trainer on this platform, as hydra overrides after a CPU twin's script (docs/cpu.md):
# one update a step (ExGRPO's parameter_sync_step, so the mini-batch is the step's batch), the rollout on a device
# of its own (Ray is told of two: the trainer's rank and the standalone vLLM), the weights sent after each step by
# the gloo engine (checkpoint_engine.py), vLLM's KV cache kept between updates (its CPU build has no sleep mode), and
# the cores split between the two, which run at once (the launcher gives each all of them: they take turns there).
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
_UPDATE_THREADS = max(1, _CORES // 2)  # the rest stay with vLLM's engine
SEPARATE_ASYNC_OVERRIDES = (
    f"++ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS='{_UPDATE_THREADS}'",
    f"++ray_kwargs.ray_init.runtime_env.env_vars.VLLM_CPU_NUM_OF_RESERVED_CPU='{_CORES - _UPDATE_THREADS}'",
    "trainer.v1.trainer_mode=separate_async", "trainer.v1.separate_async.parameter_sync_step=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=${data.train_batch_size}",
    "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1", "++ray_kwargs.ray_init.num_gpus=2",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
    "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.exgrpo.cpu.checkpoint_engine",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64",
    "actor_rollout_ref.rollout.free_cache_engine=false",
)


def cpu_mode_requested() -> bool:
    """True when this process runs verl on the CPU (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


class _CPUDeviceModule:
    """``torch.cpu`` plus what verl asks of a device module: memory queries (zeros) and the RNG (the CPU's)."""

    def __getattr__(self, name: str) -> Any:
        import torch

        if name in ("get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all"):
            return getattr(torch, name.removesuffix("_all"))
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name.startswith(("memory_", "max_memory_", "reset_")) or name in ("empty_cache", "ipc_collect"):
            return lambda *args, **kwargs: 0
        if name == "get_device_name":
            return lambda *args, **kwargs: "CPU"
        if name == "mem_get_info":
            return lambda *args, **kwargs: (0, 0)
        raise AttributeError(f"the CPU device module has no attribute {name!r}")


@platform_manager.PlatformRegistry.register(platform=PLATFORM_NAME)
class CPUPlatform(PlatformCUDA):
    """verl's CUDA platform with every device question answered by the CPU (device "cpu", backend gloo)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return _CPUDeviceModule()

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: the CPU is chosen explicitly with VERL_PLATFORM=cpu.
        return cpu_mode_requested()

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


# ---------------------------------------------------------------------------------------------- CPU mode fixes
GLOO_BACKEND = "cpu:gloo"


def _patch_process_group() -> None:
    """Workers create their group with ``cpu:gloo`` alone (verl's default string names the CPU twice)."""
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_exgrpo_cpu", False):
        return

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or GLOO_BACKEND)

    initialize_global_process_group_ray._exgrpo_cpu = True
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
    # engine_workers binds the name at its import; verl imports this module first, but be safe if it did not.
    workers = sys.modules.get("verl.workers.engine_workers")
    if workers is not None:
        workers.initialize_global_process_group_ray = initialize_global_process_group_ray


VLLM_OPS_MODULE = "vllm._custom_ops"


def _disable_onednn_prepack(ops: Any) -> None:
    ops._supports_onednn = False


class _VLLMOpsHook(importlib.abc.MetaPathFinder):
    """Turns vLLM's oneDNN weight prepacking off the moment ``vllm._custom_ops`` is imported.

    vLLM reads the flag when it loads a model, in whichever process that happens; this process may import vLLM
    only after verl (the rollout server) or hand it to a forked child, so the flag is set on import.
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname != VLLM_OPS_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _disable_onednn_prepack(module)


def _patch_vllm_weight_layout() -> None:
    if VLLM_OPS_MODULE in sys.modules:
        _disable_onednn_prepack(sys.modules[VLLM_OPS_MODULE])
    elif not any(isinstance(finder, _VLLMOpsHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _VLLMOpsHook())


def activate() -> None:
    """Apply the CPU mode to this process (idempotent); called at import when ``VERL_PLATFORM=cpu``."""
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    _patch_process_group()
    _patch_vllm_weight_layout()


if cpu_mode_requested():
    activate()
