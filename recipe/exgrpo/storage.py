"""Storage on a cluster: what every node must see, and which actor checkpoints verl removed.

On several nodes, the processes that read and write a run's files are spread out: each node's actor rank writes
its shard of ``global_step_N/actor``, whichever node hosts the TaskRunner writes the pool, the deferred rows,
``data.pt`` and the tracker file, and every rank and rollout server loads the model. A checkpoint folder on one
node's local disk gives a run that trains for hours and then cannot resume (or resumes from a mixture), so start-up
checks it: the driver writes a marker holding a fresh token into the checkpoint folder (:func:`write_marker`), the
token reaches every Ray worker through the job's environment, and the TaskRunner has one task on every other alive
node read the marker and the model's ``config.json`` (:func:`check_every_node`). A node that sees another file, or
none, stops the run with one line naming the folder and the node.

verl removes old actor checkpoints itself (``max_actor_ckpt_to_keep``) on the node of actor rank 0. The pool file
of a step is useless without its weights and is removed with them, but only when both hold (:func:`actor_removed`):
verl's rank 0 recorded removing that step's ``actor/`` (:func:`record_removed_actor`), and the folder is gone. The
absence alone is no evidence: a node that cannot see the checkpoint folder sees no ``actor/`` anywhere, and would
delete every older pool (it sees no record either). The record alone is not enough: a later launch in the same
folder (``trainer.resume_mode=disable``, or a rerun that saves a step an earlier launch rotated away) saves that step
anew beside the old record, and pruning on it would delete a pool whose actor is there, so that resuming from the step
fails. Saving a step therefore clears its folder's record first (:func:`clear_removed_actor`).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
from collections.abc import Iterable, Mapping
from typing import Any

MARKER_NAME = ".exgrpo_storage_marker.json"
TOKEN_ENV = "EXGRPO_STORAGE_TOKEN"  # the driver's token, in every Ray worker's environment (the job's runtime_env)
REMOVED_ACTOR_RECORD = "exgrpo_actor_removed.json"  # in global_step_N/: verl removed global_step_N/actor
PROBE_TIMEOUT_S = 300  # a probe task needs a worker process on its node (runtime env set-up included)


class StorageError(ValueError):
    """A path the run needs is not the same on every node (one line: the path, the node, the fix)."""


def is_local_path(path: str) -> bool:
    """A filesystem path, not a URL (``hdfs://``, ``s3://``, ...) that verl copies to local storage itself."""
    return "://" not in str(path)


def model_fingerprint(model_path: str) -> str | None:
    """sha256 of the model folder's ``config.json``; None when the path is not a local model folder (a hub id)."""
    if not is_local_path(model_path) or not os.path.isdir(model_path):
        return None
    try:
        with open(os.path.join(model_path, "config.json"), "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def write_marker(checkpoint_dir: str, model_path: str) -> str:
    """Write a fresh marker into ``checkpoint_dir`` (created if missing) and return its token.

    Relative paths are taken from this process's working directory, as verl's workers take them from theirs: a
    relative folder that means another place on another node is caught by the check.
    """
    folder = os.path.abspath(checkpoint_dir)
    try:
        os.makedirs(folder, exist_ok=True)
        token = secrets.token_hex(16)
        marker = {"token": token, "host": socket.gethostname(), "model_path": model_path,
                  "model_config_sha256": model_fingerprint(model_path)}
        tmp = os.path.join(folder, MARKER_NAME + ".tmp")
        with open(tmp, "w") as handle:
            json.dump(marker, handle)
        os.replace(tmp, os.path.join(folder, MARKER_NAME))
    except OSError as error:
        raise StorageError(f"checkpoint folder {folder} (trainer.default_local_dir) is not writable: {error}") from None
    return token


def node_view(checkpoint_dir: str, model_path: str) -> dict[str, Any]:
    """What this process sees of the run's paths: the marker (None if unreadable) and the model's fingerprint."""
    folder = os.path.abspath(checkpoint_dir)
    try:
        with open(os.path.join(folder, MARKER_NAME)) as handle:
            marker = json.load(handle)
        marker = marker if isinstance(marker, dict) else None
    except (OSError, ValueError):
        marker = None
    return {"checkpoint_dir": folder, "marker": marker, "model_path": model_path,
            "model_config_sha256": model_fingerprint(model_path)}


def check_views(views: Mapping[str, Mapping[str, Any]], token: str) -> None:
    """Refuse the first node (by label) whose view differs from the driver's marker or from the model it recorded.

    The model's expected fingerprint is the one the driver wrote into the marker; a driver that saw no local model
    folder (a hub id, a URL) recorded none, and the model is not checked.
    """
    for node, view in views.items():
        marker = view["marker"] or {}
        if marker.get("token") != token:
            found = "no marker" if not marker else "the marker of another launch"
            raise StorageError(
                f"checkpoint folder {view['checkpoint_dir']} (trainer.default_local_dir) is not the driver's on node "
                f"{node}: it holds {found}; every node must see the same checkpoint folder (shared storage, same "
                "absolute path)"
            )
        model_sha = marker.get("model_config_sha256")
        if model_sha is not None and view["model_config_sha256"] != model_sha:
            found = "no model folder there" if view["model_config_sha256"] is None else "another config.json"
            raise StorageError(
                f"model path {view['model_path']} (actor_rollout_ref.model.path) is not the driver's on node {node}: "
                f"{found}; every node must see the same model folder (shared storage, same absolute path)"
            )


def check_every_node(checkpoint_dir: str, model_path: str, token: str | None = None) -> int:
    """Check, from inside the cluster, that every alive node sees the driver's marker and model; returns the nodes.

    Runs in the TaskRunner: its own node reads the files directly, every other alive node through one zero-CPU task
    pinned to it (Ray's node-affinity scheduling, not soft). The token comes from the driver's environment
    (:data:`TOKEN_ENV`); without one (the trainer built by other code than this entry point) nothing is checked.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    token = token or os.environ.get(TOKEN_ENV)
    if not token:
        return 0
    here = ray.get_runtime_context().get_node_id()
    views = {_label(here, ray.util.get_node_ip_address()): node_view(checkpoint_dir, model_path)}
    probe = ray.remote(num_cpus=0)(node_view)
    refs = {
        _label(node["NodeID"], node.get("NodeManagerAddress", "?")): probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote(checkpoint_dir, model_path)
        for node in ray.nodes()
        if node.get("Alive") and node["NodeID"] != here
    }
    _, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
    if pending:
        late = [label for label, ref in refs.items() if ref in pending]
        raise StorageError(f"node(s) {', '.join(late)} did not answer the storage check within {PROBE_TIMEOUT_S} s")
    views.update({label: ray.get(ref) for label, ref in refs.items()})
    check_views(views, token)
    return len(views)


def _label(node_id: str, ip: str) -> str:
    return f"{ip} (Ray node {node_id[:8]})"


# ---------------------------------------------------------------------------------------------- removed checkpoints
def record_removed_actor(paths: Iterable[str], step: int) -> list[str]:
    """Record, beside each ``global_step_N/actor`` verl has just removed, that it did (at save ``step``).

    Called on the process that removed them (actor rank 0), after verl's removal, so a record never names a
    checkpoint whose weights still exist. Returns the record files written.
    """
    written = []
    for path in paths:
        folder = os.path.dirname(os.path.abspath(str(path).rstrip("/")))
        if not os.path.isdir(folder):
            continue
        record = os.path.join(folder, REMOVED_ACTOR_RECORD)
        tmp = record + ".tmp"
        with open(tmp, "w") as handle:
            json.dump({"removed": os.path.abspath(str(path)), "at_step": int(step)}, handle)
        os.replace(tmp, record)
        written.append(record)
    return written


def actor_removed(step_folder: str) -> bool:
    """Whether this step's actor checkpoint is gone for good: verl's rank 0 recorded removing it, and it is absent.

    A record beside an ``actor/`` that exists is stale (a later save of the same step), never a reason to prune.
    """
    return os.path.isfile(os.path.join(step_folder, REMOVED_ACTOR_RECORD)) and not os.path.exists(
        os.path.join(step_folder, "actor")
    )


def clear_removed_actor(step_folder: str) -> bool:
    """Remove the record in a step folder about to be saved again (an earlier launch's); returns whether one was there.

    Called before anything of the step is written, so no file of the new save ever sits beside an old record.
    """
    try:
        os.remove(os.path.join(step_folder, REMOVED_ACTOR_RECORD))
    except FileNotFoundError:
        return False
    return True
