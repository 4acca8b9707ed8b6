"""Fixtures for the verl recipe's CPU tests: one local Ray + TransferQueue, one tiny FSDP2 actor worker.

Both are session-scoped because they are the slow part (Ray + TransferQueue start in ~15-40 s on two
cores, the worker in ~10 s); every test that needs them shares them. Nothing here imports verl at module
level, so without verl the whole folder skips instead of failing.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for path in (str(REPO), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

from recipe_helpers import build_actor_worker, engine_config  # noqa: E402

if importlib.util.find_spec("verl") is None:  # pragma: no cover - depends on the environment
    collect_ignore_glob = ["test_*.py"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from tiny_assets import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def tq_cluster():
    """A local Ray (2 CPUs, no dashboard) with TransferQueue on one storage unit; shut down at session end."""
    ray = pytest.importorskip("ray")
    tq = pytest.importorskip("transfer_queue")
    from omegaconf import OmegaConf

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    conf = OmegaConf.create(
        {
            "enable": True,
            "metrics": {"enabled": False, "port": 0},
            "backend": {
                "storage_backend": "SimpleStorage",
                "SimpleStorage": {"total_storage_size": 4096, "num_data_storage_units": 1},
            },
        }
    )
    tq.init(conf)
    try:
        yield tq
    finally:
        tq.close()
        if started_ray:
            ray.shutdown()


@pytest.fixture(scope="session")
def cpu_engine_env():
    """The recipe's CPU platform + a one-process gloo group, for the whole session; restored afterwards."""
    import torch
    import torch.distributed as dist
    from verl.plugin.platform import platform_manager

    from recipe.exgrpo.cpu import CPUPlatform

    saved_env = {k: os.environ.get(k) for k in ("VERL_ENGINE_DEVICE", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                               "MASTER_ADDR", "MASTER_PORT")}
    os.environ.update(VERL_ENGINE_DEVICE="cuda", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    previous_platform = platform_manager._current_platform
    platform_manager.set_platform(CPUPlatform())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # verl would ask for "cpu:gloo,cpu:gloo" (a duplicate) on this platform; a plain gloo group comes first.
    created_group = not dist.is_initialized()
    if created_group:
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        if created_group and dist.is_initialized():
            dist.destroy_process_group()
        torch.set_num_threads(threads)
        platform_manager._current_platform = previous_platform
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def actor_worker(cpu_engine_env, tiny_model_dir):
    """The ExGRPO worker (ExGRPO loss installed) over the tiny Qwen2, shared by the engine and step tests."""
    return build_actor_worker(engine_config(tiny_model_dir))
