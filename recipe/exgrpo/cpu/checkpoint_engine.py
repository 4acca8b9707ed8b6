"""A weight-sync engine for verl's ``CheckpointEngineRegistry`` that needs no accelerator: gloo over TCP.

verl's trainers that keep rollout and training apart (``PPOTrainerSeparateAsync``) refuse the ``naive`` engine,
and every other engine verl 0.9.1 ships needs CUDA, Ascend or an RDMA package. This one broadcasts the trainer's
weights to the rollout workers over a private ``torch.distributed`` gloo group, so a CPU-only cluster (or a GPU
one without NCCL between the two sides) can run the fully asynchronous trainer. Nothing in it is specific to a
recipe or an algorithm; it only uses verl's public engine interface.

Why gloo over TCP rather than shared memory: verl places rollout replicas and trainer ranks on any node of the Ray
cluster, so a transport that only works inside one node would fail on the layouts verl is built for; gloo works
within a node (loopback) and across nodes alike, and torch ships it everywhere.

The protocol mirrors verl's NCCL engine, so the two read alike:

- trainer rank 0 is the only sender (the other trainer ranks take rank -1 and only walk the weight generator,
  because producing each full tensor is itself collective over the trainer's group);
- the weights are cut into chunks of at most ``bucket_size`` bytes (verl's ``split_weight_chunks``), packed into
  a bucket and broadcast bucket by bucket, two buckets in flight at most (one being filled, one on the wire), so
  memory stays at two buckets per process plus, on a receiver, one tensor larger than a bucket while it is merged;
- each bucket is preceded by a fixed-size header and a JSON table of contents (names, dtypes, shapes, offsets),
  so a receiver needs no side channel and never unpickles what the network hands it.

Select it with ``actor_rollout_ref.rollout.checkpoint_engine.backend=gloo`` and make sure this module is imported
in every worker (``checkpoint_engine.custom_backend_module``, or any module ``VERL_USE_EXTERNAL_MODULES`` loads
that imports it). Keyword arguments go under ``checkpoint_engine.engine_kwargs.gloo``: ``timeout_s``,
``rebuild_group``, ``host``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)
from verl.workers.rollout.utils import ensure_async_iterator

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

BACKEND_NAME = "gloo"
DEFAULT_TIMEOUT_S = 600.0
# header: table-of-contents bytes, payload bytes, is_last, the sender's bucket size
_HEADER_FIELDS = 4
_SENDER_RANK = 0
# every chunk starts at a multiple of this in its bucket, so a receiver can view the bytes as any dtype in place
_ALIGNMENT = 16


class GlooCheckpointEngineError(RuntimeError):
    """A weight sync over gloo failed: a peer never joined, left mid-transfer, or disagrees on the protocol."""


@dataclass(frozen=True)
class GlooMasterMetadata:
    """Where the sender's rendezvous store listens; handed to every member of the group by ``build_topology``."""

    host: str
    port: int


def _node_ip() -> str:
    """This process's address as other nodes reach it: Ray's node IP in a Ray worker, loopback otherwise."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address().strip("[]")
    except ImportError:  # pragma: no cover - verl always installs ray
        pass
    return "127.0.0.1"


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGNMENT) * _ALIGNMENT


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise GlooCheckpointEngineError(f"gloo checkpoint engine: the sender named an unknown dtype {name!r}")
    return dtype


def _encode_toc(metas: list[TensorMeta], global_steps: int | None) -> bytes:
    tensors = [
        {
            "name": meta.name,
            "shape": list(meta.shape),
            "dtype": str(meta.dtype).removeprefix("torch."),
            "chunk_offset": meta.chunk_offset,
            "chunk_size": meta.chunk_size,
            "offset": meta.offset,
        }
        for meta in metas
    ]
    return json.dumps({"global_steps": global_steps, "tensors": tensors}).encode()


def _decode_toc(raw: bytes) -> tuple[int | None, list[TensorMeta]]:
    toc = json.loads(raw.decode())
    metas = [
        TensorMeta(
            name=entry["name"],
            shape=torch.Size(entry["shape"]),
            dtype=_dtype_from_name(entry["dtype"]),
            chunk_offset=entry["chunk_offset"],
            chunk_size=entry["chunk_size"],
            offset=entry["offset"],
        )
        for entry in toc["tensors"]
    ]
    return toc["global_steps"], metas


async def _contiguous(weights: Iterable | AsyncIterator) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
    # split_weight_chunks views each tensor as bytes, which only a contiguous tensor allows.
    async for name, weight in ensure_async_iterator(weights):
        yield name, weight.detach().contiguous()


@CheckpointEngineRegistry.register(BACKEND_NAME)
class GlooCheckpointEngine(CheckpointEngine):
    """Broadcasts the trainer's weights to rollout workers over a private gloo group, in bounded buckets.

    Args:
        bucket_size: Bytes per bucket (verl passes ``update_weights_bucket_megabytes << 20``). Every member must
            use the same value; a receiver checks it against the sender's.
        is_master: True on trainer rank 0, the sender; verl sets it on the trainer side.
        timeout_s: How long any member waits for the others: to join the group, and for each bucket. A peer that
            never comes raises :class:`GlooCheckpointEngineError` after this long instead of hanging the run.
        rebuild_group: Form a new group at every sync (the default; costs milliseconds on gloo and follows
            replicas that were added, removed or restarted) or keep the first one for the run's lifetime.
        host: The address the sender's rendezvous store listens on; by default this node's Ray IP.
    """

    def __init__(
        self,
        bucket_size: int,
        is_master: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        rebuild_group: bool = True,
        host: str | None = None,
    ) -> None:
        if bucket_size <= 0:
            raise ValueError(f"gloo checkpoint engine: bucket_size must be positive, got {bucket_size}")
        self.bucket_size = int(bucket_size)
        self.is_master = is_master
        self.timeout = timedelta(seconds=float(timeout_s))
        self.rebuild_group = rebuild_group
        self.host = host
        self.rank: int | None = None
        self.world_size: int | None = None
        self._master_store: TCPStore | None = None
        self._master_metadata: GlooMasterMetadata | None = None
        self._group: ProcessGroupGloo | None = None
        self._buffers: list[torch.Tensor] = []

    # ------------------------------------------------------------------------------------------- set-up
    def prepare(self) -> GlooMasterMetadata | None:
        """Open the sender's rendezvous store (on the master only) and return its address for the topology."""
        if self.is_master and (self._master_store is None or self._group is None or self.rebuild_group):
            host = self.host or _node_ip()
            # port 0: the OS picks a free port while the store binds it, so no other process can take it between
            # choosing and binding
            self._master_store = TCPStore(host, 0, None, True, self.timeout, wait_for_workers=False)
            self._master_metadata = GlooMasterMetadata(host=host, port=self._master_store.port)
        return self._master_metadata if self.is_master else None

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[GlooMasterMetadata | None]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Trainer rank 0 sends as rank 0, the other trainer ranks sit out (-1), rollout workers are 1..N."""
        master = metadata[0]
        if not isinstance(master, GlooMasterMetadata):
            raise GlooCheckpointEngineError(
                "gloo checkpoint engine: trainer rank 0 must be the sender (is_master=True), but its prepare() "
                f"returned {master!r}"
            )
        world_size = 1 + rollout_world_size
        actor_kwargs = {
            "rank": [_SENDER_RANK] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world_size] * actor_wg_world_size,
            "master_metadata": [master] * actor_wg_world_size,
        }
        rollout_kwargs = {
            "rank": list(range(1, world_size)),
            "world_size": [world_size] * rollout_world_size,
            "master_metadata": [master] * rollout_world_size,
        }
        return actor_kwargs, rollout_kwargs

    def init_process_group(self, rank: int, world_size: int, master_metadata: GlooMasterMetadata) -> None:
        """Join the weight-sync group; blocks until every member has joined or ``timeout_s`` has passed."""
        if rank < 0:
            self.rank, self.world_size = rank, world_size
            return
        if self._group is not None and not self.rebuild_group:
            if (self.rank, self.world_size) != (rank, world_size):
                raise GlooCheckpointEngineError(
                    f"gloo checkpoint engine: the topology changed (rank {self.rank}->{rank}, world size "
                    f"{self.world_size}->{world_size}) but rebuild_group=False keeps the first group; "
                    "set checkpoint_engine.engine_kwargs.gloo.rebuild_group=true"
                )
            self._allocate_buffers()
            return

        self._group = None
        address = f"{master_metadata.host}:{master_metadata.port}"
        try:
            if rank == _SENDER_RANK:
                if self._master_store is None:
                    raise GlooCheckpointEngineError("gloo checkpoint engine: rank 0 joined before prepare()")
                store = self._master_store
            else:
                store = TCPStore(
                    master_metadata.host, master_metadata.port, None, False, self.timeout, wait_for_workers=False
                )
            options = ProcessGroupGloo._Options()
            options._devices = [ProcessGroupGloo.create_device(hostname=self.host or _node_ip())]
            options._timeout = self.timeout
            # every member derives the same prefix from the address, without another round trip
            prefix = f"gloo_checkpoint_engine/{master_metadata.port}"
            self._group = ProcessGroupGloo(PrefixStore(prefix, store), rank, world_size, options)
        except GlooCheckpointEngineError:
            raise
        except RuntimeError as error:
            raise GlooCheckpointEngineError(
                f"gloo checkpoint engine: rank {rank} of {world_size} could not form the weight-sync group at "
                f"{address} within {self.timeout.total_seconds():g} s: a trainer rank or rollout worker never "
                f"joined or is unreachable (checkpoint_engine.engine_kwargs.gloo.timeout_s sets the limit). "
                f"Cause: {str(error).splitlines()[0]}"
            ) from error
        self.rank, self.world_size = rank, world_size
        self._allocate_buffers()
        logger.info("gloo checkpoint engine: rank %d of %d joined the group at %s", rank, world_size, address)

    def _allocate_buffers(self) -> None:
        if not self._buffers:
            self._buffers = [torch.empty(self.bucket_size, dtype=torch.uint8) for _ in range(2)]

    def finalize(self) -> None:
        """Free the two buckets; drop the group and the rendezvous store unless the group is kept."""
        self._buffers = []
        if self.rebuild_group:
            self._group = None
            self._master_store = None
            self._master_metadata = None
            self.rank = None
            self.world_size = None

    # ------------------------------------------------------------------------------------------- transfer
    async def _wait(self, works: list[Any], what: str) -> None:
        try:
            for work in works:
                await asyncio.to_thread(work.wait)
        except RuntimeError as error:
            raise GlooCheckpointEngineError(
                f"gloo checkpoint engine: rank {self.rank} failed while {what} (a peer left, or none answered "
                f"within {self.timeout.total_seconds():g} s). Cause: {str(error).splitlines()[0]}"
            ) from error

    def _broadcast(self, tensor: torch.Tensor) -> Any:
        options = torch.distributed.BroadcastOptions()
        options.rootRank = _SENDER_RANK
        options.rootTensor = 0
        return self._group.broadcast([tensor], options)

    def _start_bucket(
        self, buffer: torch.Tensor, length: int, metas: list[TensorMeta], is_last: bool, global_steps: int | None
    ) -> list[Any]:
        toc = torch.frombuffer(bytearray(_encode_toc(metas, global_steps)), dtype=torch.uint8)
        header = torch.tensor([toc.numel(), length, int(is_last), self.bucket_size], dtype=torch.int64)
        works = [self._broadcast(header), self._broadcast(toc)]
        if length:
            works.append(self._broadcast(buffer[:length]))
        # the tensors must outlive the transfer: keep them with the works
        works.append(_KeepAlive(header, toc))
        return works

    @torch.no_grad()
    async def send_weights(self, weights: Iterable | AsyncIterator, global_steps: int | None = None) -> dict:
        """Broadcast every (name, tensor) the generator yields; trainer ranks other than 0 only walk it."""
        if self.rank is None:
            raise GlooCheckpointEngineError("gloo checkpoint engine: send_weights before init_process_group")
        if self.rank < 0:
            async for _ in ensure_async_iterator(weights):
                pass
            return {}
        if self.rank != _SENDER_RANK:
            raise GlooCheckpointEngineError(f"gloo checkpoint engine: rank {self.rank} is a receiver, not the sender")

        start = time.perf_counter()
        filling, in_flight = self._buffers
        pending: list[Any] = []
        metas: list[TensorMeta] = []
        offset = total_bytes = buckets = 0
        async for meta, chunk in split_weight_chunks(_contiguous(weights), self.bucket_size):
            start_at = _aligned(offset)
            if start_at + meta.chunk_size > self.bucket_size:
                await self._wait(pending, f"sending bucket {buckets - 1}")
                pending = self._start_bucket(filling, offset, metas, False, global_steps)
                filling, in_flight = in_flight, filling
                buckets += 1
                total_bytes += offset
                metas, start_at = [], 0
            meta.offset = start_at
            metas.append(meta)
            filling[start_at : start_at + meta.chunk_size].copy_(chunk)
            offset = start_at + meta.chunk_size
        await self._wait(pending, f"sending bucket {buckets - 1}")
        pending = self._start_bucket(filling, offset, metas, True, global_steps)
        await self._wait(pending, f"sending the last bucket ({buckets})")
        buckets += 1
        total_bytes += offset
        seconds = time.perf_counter() - start
        logger.info("gloo checkpoint engine: sent %d bytes in %d buckets in %.2f s", total_bytes, buckets, seconds)
        return {
            "checkpoint_engine/payload_mbytes": total_bytes / (1 << 20),
            "checkpoint_engine/buckets": float(buckets),
            "checkpoint_engine/send_s": seconds,
        }

    def _receive_bucket(self, buffer: torch.Tensor) -> tuple[int | None, list[TensorMeta], bool]:
        """Blocking: one bucket's header, table of contents and payload (runs in a thread)."""
        header = torch.zeros(_HEADER_FIELDS, dtype=torch.int64)
        self._broadcast(header).wait()
        toc_bytes, length, is_last, sender_bucket_size = (int(value) for value in header)
        if sender_bucket_size != self.bucket_size:
            raise GlooCheckpointEngineError(
                f"gloo checkpoint engine: the sender's bucket is {sender_bucket_size} bytes, this receiver's "
                f"{self.bucket_size}; both sides must read the same checkpoint_engine.update_weights_bucket_megabytes"
            )
        toc = torch.zeros(toc_bytes, dtype=torch.uint8)
        self._broadcast(toc).wait()
        if length:
            self._broadcast(buffer[:length]).wait()
        global_steps, metas = _decode_toc(toc.numpy().tobytes())
        return global_steps, metas, bool(is_last)

    async def _receive_chunks(self, global_steps: int | None) -> AsyncGenerator[tuple[TensorMeta, torch.Tensor], None]:
        if self.rank is None or self.rank <= _SENDER_RANK:
            raise GlooCheckpointEngineError(
                f"gloo checkpoint engine: receive_weights on rank {self.rank}; only rollout workers (rank >= 1) "
                "receive, after init_process_group"
            )
        ready, receiving = self._buffers
        task = asyncio.ensure_future(self._receive_in_thread(ready, "receiving bucket 0"))
        bucket = 0
        while True:
            sender_steps, metas, is_last = await task
            if global_steps is not None and sender_steps is not None and sender_steps != global_steps:
                raise GlooCheckpointEngineError(
                    f"gloo checkpoint engine: the sender sends the weights of step {sender_steps}, this receiver "
                    f"expects step {global_steps}"
                )
            if not is_last:
                # the next bucket lands in the other buffer while this one's tensors are consumed
                bucket += 1
                task = asyncio.ensure_future(self._receive_in_thread(receiving, f"receiving bucket {bucket}"))
            for meta in metas:
                yield meta, ready[meta.offset : meta.offset + meta.chunk_size]
            if is_last:
                return
            ready, receiving = receiving, ready

    async def _receive_in_thread(self, buffer: torch.Tensor, what: str) -> tuple[int | None, list[TensorMeta], bool]:
        try:
            return await asyncio.to_thread(self._receive_bucket, buffer)
        except GlooCheckpointEngineError:
            raise
        except RuntimeError as error:
            raise GlooCheckpointEngineError(
                f"gloo checkpoint engine: rank {self.rank} failed while {what} (the sender left, or sent nothing "
                f"within {self.timeout.total_seconds():g} s). Cause: {str(error).splitlines()[0]}"
            ) from error

    @torch.no_grad()
    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Yield (name, tensor) as the buckets arrive.

        A tensor that fits in a bucket is a view of the receive buffer, valid until the next item is requested
        (as with verl's NCCL engine): a consumer that keeps it must copy it.
        """
        async for name, weight in merge_weight_chunks(self._receive_chunks(global_steps), self.bucket_size):
            yield name, weight


class _KeepAlive:
    """A finished 'work' that only holds tensors alive until the bucket's transfer has been waited for."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def wait(self) -> bool:
        return True
