"""The checkpointed ExGRPO state beside verl's own: the pool, the deferred fresh rows and (asynchronous modes) the
groups in flight, saved before verl's tracker file names the step, restored on resume, and pruned with the actor
checkpoints verl rotates away.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import NamedTuple

from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

from exgrpo.algorithm.composition import FreshRow
from exgrpo.algorithm.pool import ExperiencePool, remove_stale_temporaries, write_atomically
from recipe.exgrpo import faults
from recipe.exgrpo.settings import IN_FLIGHT_FILE_NAME, PENDING_FILE_NAME, POOL_FILE_NAME
from recipe.exgrpo.storage import actor_removed, clear_removed_actor

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

PENDING_STATE_VERSION = 1
IN_FLIGHT_STATE_VERSION = 1


def save_pending_qids(path: str | os.PathLike, qids: list[str]) -> None:
    """Write deferred question ids as a small json file, atomically and durably like the pool, no pickles."""
    payload = json.dumps({"version": PENDING_STATE_VERSION, "qids": [str(q) for q in qids]}).encode()
    write_atomically(path, lambda f: f.write(payload))


def load_pending_qids(path: str | os.PathLike) -> list[str]:
    """Read :func:`save_pending_qids`'s file; an unreadable one is an error naming the path."""
    try:
        with open(path) as f:
            state = json.load(f)
        if int(state["version"]) != PENDING_STATE_VERSION:
            raise ValueError(f"version {state['version']}, this code reads {PENDING_STATE_VERSION}")
        return [str(q) for q in state["qids"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"deferred fresh rows file {path} is unreadable: {err!r}") from err


def save_in_flight(path: str | os.PathLike, groups: Mapping[str, tuple[str, bool]],
                   staleness: Mapping[tuple[str, int], int] | None = None) -> None:
    """Write the groups submitted and not yet trained (verl's uid -> question id, replayed or not), atomically.

    Asynchronous modes checkpoint them inside TransferQueue's state and re-issue them on resume under the same
    uids; this file tells the resumed trainer which of them are replay groups (K - 1 rollouts, a stored member to
    insert) and which question each one is. ``staleness`` ((question, step collected) -> its group's staleness
    then) goes beside them, for the w metrics by staleness of trajectories collected before a resume; a file
    without it (written before it existed) reads as none known.
    """
    state = {"version": IN_FLIGHT_STATE_VERSION,
             "groups": {str(uid): [str(qid), bool(replay)] for uid, (qid, replay) in groups.items()},
             "staleness": [[str(qid), int(step), int(s)] for (qid, step), s in sorted((staleness or {}).items())]}
    payload = json.dumps(state).encode()
    write_atomically(path, lambda f: f.write(payload))


class InFlight(NamedTuple):
    """What :func:`save_in_flight` wrote: the groups (uid -> question id, replayed or not) and the staleness map."""

    groups: dict[str, tuple[str, bool]]
    staleness: dict[tuple[str, int], int]


def load_in_flight(path: str | os.PathLike) -> InFlight:
    """Read :func:`save_in_flight`'s file in one pass; an unreadable one is an error naming the path (and the part,
    groups or staleness map). A file without the staleness map (written before it existed) reads as none known."""
    try:
        with open(path) as f:
            state = json.load(f)
        if int(state["version"]) != IN_FLIGHT_STATE_VERSION:
            raise ValueError(f"version {state['version']}, this code reads {IN_FLIGHT_STATE_VERSION}")
        groups = {}
        for uid, (qid, replay) in state["groups"].items():
            if not isinstance(replay, bool):
                raise ValueError(f"group {uid!r}: the replay flag {replay!r} is not a boolean")
            groups[str(uid)] = (str(qid), replay)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"in-flight groups file {path} is unreadable: {err!r}") from err
    try:
        staleness = {(str(qid), int(step)): int(s) for qid, step, s in state.get("staleness", [])}
    except (ValueError, TypeError) as err:
        raise ValueError(f"in-flight groups file {path}: its staleness map is unreadable: {err!r}") from err
    return InFlight(groups, staleness)


class ExGRPOStateMixin:
    """Saving and restoring the ExGRPO state with verl's checkpoints, over a verl V1 trainer.

    Reads the trainer's ``pool``, ``exgrpo_config``, ``exgrpo_settings``, ``fresh_source`` and ``question_index``;
    the asynchronous mode's class adds its groups in flight (``save_in_flight`` / ``load_in_flight``).
    """

    def _save_checkpoint(self):
        """Deferred fresh rows and pool first, then the parent (which writes the tracker file last): the tracker
        never names a step whose ExGRPO files are missing.

        Before anything, the step folder's record of a removed actor goes (an earlier launch's, that rotated this
        step away): the files saved now must never sit beside it (``storage.actor_removed``)."""
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        clear_removed_actor(folder)
        if self.exgrpo_enabled:
            pending = self.fresh_source.pending_qids()
            save_pending_qids(os.path.join(folder, PENDING_FILE_NAME), pending)
            faults.reach("pool_save", self.global_steps)
            self.pool.save(os.path.join(folder, POOL_FILE_NAME))
            in_flight = self.save_in_flight(folder)
            # Printed, not logged: the resumed run prints the restored pool's digest the same way, for comparison.
            print(f"[exgrpo] saved pool of step {self.global_steps}: {len(self.pool)} questions, {len(pending)} "
                  f"deferred fresh questions{in_flight}, state {self.pool.state_digest()}", flush=True)
            faults.reach("tracker", self.global_steps)
        super()._save_checkpoint()
        if self.exgrpo_enabled and self.config.trainer.get("max_actor_ckpt_to_keep", None):
            prune_pool_files(self.config.trainer.default_local_dir, self.global_steps)
            remove_checkpoint_temporaries(self.config.trainer.default_local_dir)

    def _resume_folder(self) -> str | None:
        """The global_step_N folder the parent just resumed from (same resolution as its _load_checkpoint)."""
        trainer = self.config.trainer
        if trainer.resume_mode == "auto":
            folder = trainer.default_local_dir
            if not os.path.isabs(folder):
                folder = os.path.join(os.getcwd(), folder)
            return find_latest_ckpt_path(folder)
        if trainer.resume_mode == "resume_path":
            folder = trainer.resume_from_path
            return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)
        return None

    def _load_checkpoint(self):
        if self.exgrpo_enabled:  # before anything is saved: saves a hard kill interrupted left temporary files
            remove_checkpoint_temporaries(self.config.trainer.default_local_dir)
        super()._load_checkpoint()
        if self.exgrpo_enabled and self.global_steps > 0:
            folder = self._resume_folder()
            self.load_pool(folder)
            self.load_pending_fresh(folder)
            self.load_in_flight(folder)

    def save_in_flight(self, folder: str) -> str:
        """The mode's groups in flight, saved beside the pool; returns what the save line says of them. The
        synchronous mode trains every group in the step that submits it: nothing to save."""
        return ""

    def load_in_flight(self, folder: str | None) -> None:
        """The mode's groups in flight of a resumed step (none in the synchronous mode)."""

    def load_pending_fresh(self, folder: str | None) -> None:
        """Put the fresh rows the resumed step had deferred back in front of the dataloader, by question id.

        A checkpoint without the file (written before it existed) restores none, with a warning; a question no
        longer in the training set is dropped with a warning.
        """
        path = os.path.join(folder, PENDING_FILE_NAME) if folder else None
        if path is None or not os.path.isfile(path):
            logger.warning(f"ExGRPO: no {PENDING_FILE_NAME} in the resumed checkpoint; no deferred fresh rows restored")
            return
        qids = load_pending_qids(path)
        print(f"[exgrpo] restored {len(qids)} deferred fresh questions of step {self.global_steps}", flush=True)
        index = self.question_index() if qids else {}
        missing = [qid for qid in qids if qid not in index]
        if missing:
            logger.warning(f"ExGRPO: {len(missing)} deferred questions are not in the training set: {missing[:5]}")
        self.fresh_source.restore_pending(FreshRow(q, self.train_dataset[index[q]]) for q in qids if q in index)

    def load_pool(self, folder: str | None) -> None:
        """Restore the pool of a resumed step; a missing or corrupt file stops the run unless opted out."""
        path = os.path.join(folder, POOL_FILE_NAME) if folder else None
        try:
            if path is None:
                raise FileNotFoundError("the resumed checkpoint folder could not be determined")
            self.pool = ExperiencePool.load(path, config=self.exgrpo_config)
            print(f"[exgrpo] restored pool of step {self.global_steps} from {path}: {len(self.pool)} questions, "
                  f"state {self.pool.state_digest()}", flush=True)
        except (FileNotFoundError, ValueError) as err:
            if not self.exgrpo_settings.allow_empty_pool_on_resume:
                raise RuntimeError(
                    f"ExGRPO cannot resume step {self.global_steps}: {err}. The experience pool is part of the "
                    "training state; set exgrpo.allow_empty_pool_on_resume=true to continue with an empty pool "
                    "(and the delayed-start latch off) instead"
                ) from err
            logger.warning(f"ExGRPO: {err}; continuing with an empty pool (exgrpo.allow_empty_pool_on_resume=true)")
            self.pool = ExperiencePool(self.exgrpo_config, seed=self.exgrpo_settings.seed)


def prune_pool_files(root: str, current_step: int) -> list[str]:
    """Delete ExGRPO files of older steps whose actor checkpoint verl removed (max_actor_ckpt_to_keep).

    verl deletes only ``global_step_N/actor``; a pool file left behind can be gigabytes and is useless without
    the weights it belongs to (the deferred-rows file goes with it). A step's files go only when both the record
    verl's rank 0 leaves beside the folder it removed (``storage.record_removed_actor``) and the folder's absence
    say so (``storage.actor_removed``): on a node that does not see the checkpoint folder every ``actor/`` is
    absent, and a record beside an ``actor/`` that is there is an earlier launch's. Steps verl never rotated (those
    an earlier launch saved: its list of kept checkpoints starts empty at each launch) are never touched. Returns
    the deleted paths.
    """
    removed = []
    if not os.path.isdir(root):
        return removed
    for name in os.listdir(root):
        if not name.startswith("global_step_"):
            continue
        try:
            step = int(name.split("global_step_")[-1])
        except ValueError:
            continue
        folder = os.path.join(root, name)
        if step >= current_step or not actor_removed(folder):
            continue
        for path in (os.path.join(folder, name) for name in (POOL_FILE_NAME, PENDING_FILE_NAME, IN_FLIGHT_FILE_NAME)):
            if os.path.isfile(path):
                os.remove(path)
                removed.append(path)
    return removed



def remove_checkpoint_temporaries(root: str) -> list[str]:
    """Remove the temporary files of ExGRPO saves a hard kill interrupted, in every ``global_step_N`` under ``root``.

    Called when no save is running (start-up, after a save's pruning); a pool-sized leftover would otherwise stay
    in its checkpoint folder for good. Returns the removed paths.
    """
    if not os.path.isdir(root):
        return []
    return [str(path) for name in sorted(os.listdir(root)) if name.startswith("global_step_")
            for path in remove_stale_temporaries(os.path.join(root, name))]

