"""The gloo weight-sync engine (``recipe/exgrpo/cpu/checkpoint_engine.py``) between real processes.

Modelled on verl's checkpoint-engine tests (a sender with a model's weights, receivers that must end with the same
weights, several syncs in a row, with the group rebuilt or kept), without Ray or a model: the parent process plays
verl's ``CheckpointEngineManager`` (prepare on every member, ``build_topology``, ``init_process_group`` on every
member at once, send and receive, finalize), each member is a process from a fork server that has imported verl
once. The weights mix bf16, fp32, int64 and bool, NaN/inf/-0.0, a 0-dim tensor, tensors larger than a bucket and
many small ones of odd sizes, and must arrive bit-identical, by name, dtype and shape, in the sender's order.
Failures must be one clear error within the configured timeout, never a hang.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from verl.checkpoint_engine import CheckpointEngineRegistry  # noqa: E402

from recipe.exgrpo.cpu.checkpoint_engine import (  # noqa: E402
    BACKEND_NAME,
    GlooCheckpointEngine,
    GlooCheckpointEngineError,
    GlooMasterMetadata,
)

BUCKET = 4096  # bytes; the two large tensors below span several buckets
HOST = "127.0.0.1"
REPLY_TIMEOUT_S = 90.0  # generous for a loaded 2-core machine; a hang fails the test instead of blocking it
LARGER_THAN_BUCKET = {"embed.weight", "lm_head.weight"}


# ------------------------------------------------------------------------------------------------ the weights
def model_weights(seed: int) -> dict[str, torch.Tensor]:
    """A small model's state dict, different for each seed, identical in every process for the same seed."""
    gen = torch.Generator().manual_seed(seed)
    weights = {
        "embed.weight": torch.randn(300, 8, generator=gen),  # fp32, 9,600 bytes: 3 chunks
        "lm_head.weight": torch.randn(40, 70, generator=gen).to(torch.bfloat16),  # 5,600 bytes: 2 chunks
        "special": torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 1e-45], dtype=torch.float32),
        "step": torch.tensor(seed, dtype=torch.int64),  # 0-dim
        "mask": torch.rand(13, generator=gen) > 0.5,
    }
    for layer in range(30):  # many small tensors of odd byte sizes: every offset after them needs aligning
        weights[f"layers.{layer}.norm.weight"] = torch.randn(3 + layer, generator=gen).to(torch.bfloat16)
        weights[f"layers.{layer}.proj.weight"] = torch.randn(5, 7, generator=gen)
    return weights


def ten_equal_tensors(seed: int) -> dict[str, torch.Tensor]:
    """Ten fp32 tensors of 400 bytes each: a bucket count that can be worked out by hand."""
    gen = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(100, generator=gen) for i in range(10)}


WEIGHT_SETS = {"model": model_weights, "ten": ten_equal_tensors}


def as_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def described(weights: dict[str, torch.Tensor]) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    return [(name, str(t.dtype), tuple(t.shape), as_bytes(t)) for name, t in weights.items()]


# ------------------------------------------------------------------------------------------------ a member process
def _member(conn: multiprocessing.connection.Connection, engine_kwargs: dict[str, Any]) -> None:
    """One member of the group: runs the commands the parent sends, answers ("ok", result) or ("error", text)."""
    engine = CheckpointEngineRegistry.new(BACKEND_NAME, **engine_kwargs)
    while True:
        command, kwargs = conn.recv()
        if command == "stop":
            return
        try:
            conn.send(("ok", _COMMANDS[command](engine, **kwargs)))
        except Exception as error:  # the parent asserts on the text
            conn.send(("error", f"{type(error).__name__}: {error}"))


def _send(engine: GlooCheckpointEngine, seed: int, global_steps: int | None, weight_set: str = "model") -> dict:
    weights = WEIGHT_SETS[weight_set](seed)
    return asyncio.run(engine.send_weights(iter(weights.items()), global_steps=global_steps))


def _receive(engine: GlooCheckpointEngine, global_steps: int | None) -> dict:
    async def collect() -> dict:
        buffers = {t.untyped_storage().data_ptr() for t in engine._buffers}
        received, copied = [], []
        async for name, weight in engine.receive_weights(global_steps=global_steps):
            # the engine's contract: a view is valid until the next item, so keep bytes, not the tensor
            received.append((name, str(weight.dtype), tuple(weight.shape), as_bytes(weight)))
            if weight.untyped_storage().data_ptr() not in buffers:
                copied.append(name)
        return {"weights": received, "copied": copied}

    return asyncio.run(collect())


_COMMANDS = {
    "prepare": lambda engine: engine.prepare(),
    "init": lambda engine, **kwargs: engine.init_process_group(**kwargs),
    "send": _send,
    "receive": _receive,
    "finalize": lambda engine: engine.finalize(),
}


class Group:
    """The members of one weight-sync group, driven as verl's CheckpointEngineManager drives them."""

    def __init__(self, context, n_receivers: int, sender_kwargs: dict | None = None, receiver_kwargs=None) -> None:
        base = {"bucket_size": BUCKET, "host": HOST}
        kwargs = [{**base, "is_master": True, **(sender_kwargs or {})}]
        kwargs += [{**base, **(receiver_kwargs or {})} for _ in range(n_receivers)]
        self.conns, self.processes = [], []
        for member_kwargs in kwargs:
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_member, args=(child_end, member_kwargs), daemon=True)
            process.start()
            self.conns.append(parent_end)
            self.processes.append(process)

    def ask(self, members: list[int], command: str, **kwargs) -> list[tuple[str, Any]]:
        for member in members:
            self.conns[member].send((command, kwargs))
        return [self.answer(member) for member in members]

    def answer(self, member: int) -> tuple[str, Any]:
        if not self.conns[member].poll(REPLY_TIMEOUT_S):
            raise AssertionError(f"member {member} gave no answer in {REPLY_TIMEOUT_S} s (a hang)")
        return self.conns[member].recv()

    def connect(self) -> None:
        everyone = list(range(len(self.conns)))
        metadata = [result for status, result in self.ask(everyone, "prepare") if status == "ok"]
        actor_kwargs, rollout_kwargs = GlooCheckpointEngine.build_topology(1, len(everyone) - 1, metadata)
        per_member = [{key: values[0] for key, values in actor_kwargs.items()}]
        per_member += [{key: values[i] for key, values in rollout_kwargs.items()} for i in range(len(everyone) - 1)]
        for member, kwargs in zip(everyone, per_member, strict=True):
            self.conns[member].send(("init", kwargs))
        assert [self.answer(member) for member in everyone] == [("ok", None)] * len(everyone)

    def sync(self, seed: int, global_steps: int | None = None) -> tuple[dict, list[dict]]:
        """One weight update: the sender sends, every receiver receives, all finalize; returns what they said."""
        receivers = list(range(1, len(self.conns)))
        self.conns[0].send(("send", {"seed": seed, "global_steps": global_steps}))
        for member in receivers:
            self.conns[member].send(("receive", {"global_steps": global_steps}))
        sent = self.answer(0)
        received = [self.answer(member) for member in receivers]
        assert sent[0] == "ok", sent
        assert all(status == "ok" for status, _ in received), received
        assert self.ask(list(range(len(self.conns))), "finalize") == [("ok", None)] * len(self.conns)
        return sent[1], [result for _, result in received]

    def close(self) -> None:
        for conn, process in zip(self.conns, self.processes, strict=True):
            if process.is_alive():
                try:
                    conn.send(("stop", {}))
                except OSError:
                    pass
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


@pytest.fixture(scope="module")
def context():
    """Processes forked from a server that imported verl once (a spawn per member costs ~10-30 s here)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["recipe.exgrpo.cpu.checkpoint_engine", "torch"])
    return ctx


def _group(context, request, *args, **kwargs) -> Group:
    group = Group(context, *args, **kwargs)
    request.addfinalizer(group.close)
    return group


# ------------------------------------------------------------------------------------------------ the tests
def test_the_engine_is_registered_under_gloo_and_verl_builds_it_as_its_workers_do():
    assert CheckpointEngineRegistry.get("gloo") is GlooCheckpointEngine
    # verl's trainer worker passes is_master and bucket_size, then engine_kwargs[backend] as keywords
    engine = CheckpointEngineRegistry.new("gloo", is_master=True, bucket_size=1 << 20, timeout_s=5, rebuild_group=False)
    assert (engine.is_master, engine.bucket_size, engine.timeout.total_seconds(), engine.rebuild_group) == (
        True,
        1 << 20,
        5.0,
        False,
    )


def test_topology_makes_trainer_rank_0_the_sender_sits_other_trainer_ranks_out_and_numbers_the_rollout_after_it():
    master = GlooMasterMetadata(host="10.0.0.1", port=1234)
    actor, rollout = GlooCheckpointEngine.build_topology(2, 3, [master, None, None, None, None])
    assert actor == {"rank": [0, -1], "world_size": [4, 4], "master_metadata": [master, master]}
    assert rollout == {"rank": [1, 2, 3], "world_size": [4, 4, 4], "master_metadata": [master] * 3}


def test_topology_refuses_metadata_whose_first_member_is_not_the_sender():
    with pytest.raises(GlooCheckpointEngineError, match="trainer rank 0 must be the sender"):
        GlooCheckpointEngine.build_topology(1, 1, [None, GlooMasterMetadata(host=HOST, port=1)])


def test_a_trainer_rank_outside_the_group_walks_the_whole_generator_and_sends_nothing():
    walked = []

    def weights() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in model_weights(0).items():
            walked.append(name)  # on a real trainer each step here is a collective over the trainer's ranks
            yield name, tensor

    engine = GlooCheckpointEngine(bucket_size=BUCKET)
    engine.init_process_group(rank=-1, world_size=3, master_metadata=GlooMasterMetadata(host=HOST, port=1))
    assert asyncio.run(engine.send_weights(weights())) == {}
    assert walked == list(model_weights(0))


@pytest.mark.parametrize("rebuild_group", [True, False], ids=["group-rebuilt", "group-kept"])
@pytest.mark.parametrize("n_receivers", [1, 2])
def test_every_receiver_gets_bit_identical_weights_by_name_dtype_and_shape_at_every_sync(
    context, request, n_receivers, rebuild_group
):
    group = _group(context, request, n_receivers, {"rebuild_group": rebuild_group}, {"rebuild_group": rebuild_group})
    expected_bytes = sum(t.nbytes for t in model_weights(0).values())
    for sync, seed in enumerate([11, 12, 11]):  # new weights, then back: each sync must deliver what was sent
        group.connect()
        metrics, received = group.sync(seed, global_steps=sync)
        for result in received:
            assert result["weights"] == described(model_weights(seed))
            # bounded memory: only a tensor larger than a bucket is allocated; every other one is a bucket view
            assert set(result["copied"]) == LARGER_THAN_BUCKET
        assert metrics["checkpoint_engine/buckets"] > 3
        # alignment pads each chunk's start to 16 bytes at most
        padding = metrics["checkpoint_engine/payload_mbytes"] * (1 << 20) - expected_bytes
        assert 0 <= padding < 16 * len(model_weights(0))


def test_buckets_are_filled_in_order_and_flushed_when_the_next_tensor_does_not_fit(context, request):
    # ten 400-byte tensors in 1,024-byte buckets: two per bucket (a third would need 1,200 bytes), so 5 buckets
    group = _group(context, request, 1, {"bucket_size": 1024}, {"bucket_size": 1024})
    group.connect()
    group.conns[0].send(("send", {"seed": 3, "global_steps": None, "weight_set": "ten"}))
    group.conns[1].send(("receive", {"global_steps": None}))
    sent, received = group.answer(0), group.answer(1)
    assert sent[0] == "ok" and received[0] == "ok", (sent, received)
    assert sent[1]["checkpoint_engine/buckets"] == 5.0
    assert sent[1]["checkpoint_engine/payload_mbytes"] * (1 << 20) == 4000
    assert received[1]["weights"] == described(ten_equal_tensors(3))


def test_a_sender_whose_receiver_never_joins_fails_within_the_timeout_naming_the_cause():
    engine = GlooCheckpointEngine(bucket_size=BUCKET, is_master=True, timeout_s=2, host=HOST)
    master = engine.prepare()
    start = time.monotonic()
    with pytest.raises(GlooCheckpointEngineError, match=r"rank 0 of 2 could not form .* never joined"):
        engine.init_process_group(rank=0, world_size=2, master_metadata=master)
    assert time.monotonic() - start < 30


def test_a_receiver_whose_sender_is_gone_fails_within_the_timeout_naming_the_address():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    engine = GlooCheckpointEngine(bucket_size=BUCKET, timeout_s=2, host=HOST)
    start = time.monotonic()
    with pytest.raises(GlooCheckpointEngineError, match=rf"rank 1 of 2 could not form .* at {HOST}:{port}"):
        engine.init_process_group(rank=1, world_size=2, master_metadata=GlooMasterMetadata(host=HOST, port=port))
    assert time.monotonic() - start < 30


def test_a_receiver_waiting_for_weights_that_never_come_fails_within_the_timeout(context, request):
    group = _group(context, request, 1, {"timeout_s": 3}, {"timeout_s": 3})
    group.connect()
    start = time.monotonic()
    status, text = group.ask([1], "receive", global_steps=None)[0]
    assert status == "error"
    assert "GlooCheckpointEngineError" in text and "while receiving bucket 0" in text
    assert time.monotonic() - start < 60


def test_a_receiver_with_another_bucket_size_refuses_the_weights_naming_the_setting(context, request):
    group = _group(context, request, 1, {"timeout_s": 5}, {"bucket_size": 2 * BUCKET, "timeout_s": 5})
    group.connect()
    group.conns[0].send(("send", {"seed": 0, "global_steps": None}))
    status, text = group.ask([1], "receive", global_steps=None)[0]
    assert status == "error" and "update_weights_bucket_megabytes" in text
    group.close()  # the receiver leaves: the sender must fail, not hang
    assert group.answer(0)[0] == "error"


def test_a_receiver_expecting_another_step_refuses_the_weights(context, request):
    group = _group(context, request, 1, {"timeout_s": 5}, {"timeout_s": 5})
    group.connect()
    group.conns[0].send(("send", {"seed": 0, "global_steps": 5}))
    status, text = group.ask([1], "receive", global_steps=6)[0]
    assert status == "error" and "weights of step 5" in text and "expects step 6" in text
