"""What a run on several nodes needs from storage, and the loss scale across nodes.

The start-up check (``recipe/exgrpo/storage.py``): the driver's marker in the checkpoint folder and the model's
fingerprint, as each node sees them, with one-line refusals that name the folder and the node; the pool files are
pruned only where verl recorded removing the actor checkpoint (here with verl's real FSDP checkpoint manager) and it
is gone, never on a folder's absence alone nor on a record an earlier launch left beside a step saved again; and the
authors' loss scale counts every node's GPUs over the sequence-parallel size verl itself resolves from its two keys.
The same checks on a real two-node Ray cluster are in ``test_multinode.py`` (slow).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("verl")

from recipe_helpers import REPO, compose_config, entry_point_command  # noqa: E402

from recipe.exgrpo.storage import (  # noqa: E402
    MARKER_NAME,
    REMOVED_ACTOR_RECORD,
    StorageError,
    check_views,
    node_view,
    write_marker,
)


def model_folder(path: Path, text: str = '{"model_type": "qwen2"}') -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(text)
    return path


# ---------------------------------------------------------------------------------------------- the start-up check
def test_a_node_that_sees_the_drivers_marker_and_model_passes(tmp_path):
    model = model_folder(tmp_path / "model")
    token = write_marker(str(tmp_path / "ckpt"), str(model))
    marker = json.loads((tmp_path / "ckpt" / MARKER_NAME).read_text())
    assert marker["token"] == token and len(token) == 32
    check_views({"head": node_view(str(tmp_path / "ckpt"), str(model)),
                 "worker": node_view(str(tmp_path / "ckpt"), str(model))}, token)
    assert write_marker(str(tmp_path / "ckpt"), str(model)) != token  # each launch its own token


def test_a_node_without_the_marker_is_refused_in_one_line_naming_the_folder_and_the_node(tmp_path):
    model = model_folder(tmp_path / "model")
    token = write_marker(str(tmp_path / "shared"), str(model))
    (tmp_path / "local").mkdir()  # what a node with its own disk at that path would see: an empty folder
    views = {"10.0.0.1 (Ray node aaaa)": node_view(str(tmp_path / "shared"), str(model)),
             "10.0.0.2 (Ray node bbbb)": node_view(str(tmp_path / "local"), str(model))}
    with pytest.raises(StorageError) as error:
        check_views(views, token)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"checkpoint folder {tmp_path / 'local'} (trainer.default_local_dir) is not the "
                              "driver's on node 10.0.0.2 (Ray node bbbb): it holds no marker")


def test_a_stale_marker_from_another_launch_is_refused(tmp_path):
    model = model_folder(tmp_path / "model")
    old = write_marker(str(tmp_path / "ckpt"), str(model))
    new = write_marker(str(tmp_path / "elsewhere"), str(model))
    assert old != new
    # a node whose copy of the path kept the previous launch's marker
    with pytest.raises(StorageError, match="it holds the marker of another launch"):
        check_views({"worker": node_view(str(tmp_path / "ckpt"), str(model))}, new)


def test_a_relative_checkpoint_folder_means_another_folder_on_a_node_with_another_working_directory(tmp_path,
                                                                                                     monkeypatch):
    """verl's default checkpoint folder is relative: each process resolves it against its own working directory."""
    model = model_folder(tmp_path / "model")
    (tmp_path / "driver").mkdir()
    (tmp_path / "raylet").mkdir()
    monkeypatch.chdir(tmp_path / "driver")
    token = write_marker("checkpoints/run", str(model))
    assert (tmp_path / "driver" / "checkpoints" / "run" / MARKER_NAME).is_file()
    monkeypatch.chdir(tmp_path / "raylet")
    with pytest.raises(StorageError, match=rf"checkpoint folder {tmp_path / 'raylet' / 'checkpoints' / 'run'} "):
        check_views({"worker": node_view("checkpoints/run", str(model))}, token)


def test_a_node_without_the_model_or_with_another_model_is_refused_naming_the_model_path(tmp_path):
    model = model_folder(tmp_path / "model")
    token = write_marker(str(tmp_path / "ckpt"), str(model))
    view = node_view(str(tmp_path / "ckpt"), str(model))
    (model / "config.json").write_text('{"model_type": "llama"}')  # what a node with another copy would read
    with pytest.raises(StorageError, match=rf"^model path {model} \(actor_rollout_ref.model.path\) is not the "
                                           r"driver's on node worker: another config.json"):
        check_views({"head": view, "worker": node_view(str(tmp_path / "ckpt"), str(model))}, token)
    (model / "config.json").unlink()
    model.rmdir()
    with pytest.raises(StorageError, match="on node worker: no model folder there"):
        check_views({"worker": node_view(str(tmp_path / "ckpt"), str(model))}, token)


def test_a_model_the_driver_does_not_see_as_a_folder_is_left_to_verl(tmp_path):
    """A hub id or a URL: verl fetches it on each node itself, so there is nothing to compare."""
    token = write_marker(str(tmp_path / "ckpt"), "Qwen/Qwen2.5-Math-7B")
    assert json.loads((tmp_path / "ckpt" / MARKER_NAME).read_text())["model_config_sha256"] is None
    check_views({"worker": node_view(str(tmp_path / "ckpt"), "Qwen/Qwen2.5-Math-7B")}, token)


def test_an_unwritable_checkpoint_folder_stops_the_entry_point_in_one_line_before_ray(tmp_path):
    import harness
    from tiny_assets import build_tiny_model_dir

    model = build_tiny_model_dir(tmp_path / "model")
    train, val = harness.write_dataset(tmp_path / "data")
    (tmp_path / "a_file").write_text("")
    folder = tmp_path / "a_file" / "ckpt"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "EXGRPO_DEBUG")}
    result = subprocess.run(entry_point_command(model, train, val, f"trainer.default_local_dir={folder}"),
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    ours = [line for line in result.stderr.splitlines() if line.startswith("error:")]  # the rest: verl's warnings
    assert len(ours) == 1 and ours[0].startswith(
        f"error: checkpoint folder {folder} (trainer.default_local_dir) is not writable: "), result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == ours[0] and "Traceback" not in result.stderr
    assert "ray init" not in result.stdout.lower()


# ---------------------------------------------------------------------------------------------- pruning
def test_old_pool_files_are_pruned_only_where_verl_recorded_removing_the_actor_checkpoint(tmp_path):
    """Step 10: verl's record -> pruned. Step 15: no actor folder and no record (a node that cannot see it, or a
    save verl never rotated) -> kept. Step 20: the actor is there -> kept. Step 30, the step just saved: untouched."""
    from recipe.exgrpo.state import prune_pool_files
    from recipe.exgrpo.storage import record_removed_actor

    for step, has_actor in ((10, False), (15, False), (20, True), (30, False)):
        folder = tmp_path / f"global_step_{step}"
        (folder / "actor").mkdir(parents=True) if has_actor else folder.mkdir()
        (folder / "exgrpo_pool.npz").write_bytes(b"x")
        (folder / "exgrpo_pending_fresh.json").write_text("{}")
    assert record_removed_actor([str(tmp_path / "global_step_10" / "actor")], step=12) == [
        str(tmp_path / "global_step_10" / REMOVED_ACTOR_RECORD)]
    record_removed_actor([str(tmp_path / "global_step_30" / "actor")], step=31)
    removed = prune_pool_files(str(tmp_path), current_step=30)
    assert removed == [str(tmp_path / "global_step_10" / "exgrpo_pool.npz"),
                       str(tmp_path / "global_step_10" / "exgrpo_pending_fresh.json")]
    for step in (15, 20, 30):
        assert (tmp_path / f"global_step_{step}" / "exgrpo_pool.npz").exists(), step
        assert (tmp_path / f"global_step_{step}" / "exgrpo_pending_fresh.json").exists(), step
    assert prune_pool_files(str(tmp_path), current_step=30) == []  # the record stays; pruning again is a no-op


def test_the_worker_records_exactly_the_actor_checkpoints_verls_checkpoint_manager_removed(actor_worker, tmp_path):
    """verl's FSDP checkpoint manager (the real one, in the ExGRPO worker) saves three steps keeping two: it
    removes step 1's actor folder while saving step 3, and the worker's record says so, at step 3, and nothing
    else; a save that removes nothing records nothing."""
    manager = actor_worker.actor.engine.checkpoint_manager
    before = list(manager.previous_saved_paths)
    manager.previous_saved_paths = []
    try:
        for step in (1, 2, 3):
            actor_worker.save_checkpoint(str(tmp_path / f"global_step_{step}" / "actor"), None, step, 2)
            records = sorted(p.parent.name for p in tmp_path.glob(f"*/{REMOVED_ACTOR_RECORD}"))
            assert records == ([] if step < 3 else ["global_step_1"]), (step, records)
    finally:
        manager.previous_saved_paths = before
    assert not (tmp_path / "global_step_1" / "actor").exists()
    assert (tmp_path / "global_step_2" / "actor").is_dir() and (tmp_path / "global_step_3" / "actor").is_dir()
    record = json.loads((tmp_path / "global_step_1" / REMOVED_ACTOR_RECORD).read_text())
    assert record == {"removed": str(tmp_path / "global_step_1" / "actor"), "at_step": 3}


def test_a_record_beside_an_actor_that_is_there_is_stale_and_prunes_nothing(tmp_path):
    """The rule is record AND no ``actor/``: step 10 (both) is pruned; step 20 (a record, but its actor is there,
    as after a later launch saved that step again) keeps its pool."""
    from recipe.exgrpo.state import prune_pool_files
    from recipe.exgrpo.storage import actor_removed, record_removed_actor

    for step in (10, 20):
        folder = tmp_path / f"global_step_{step}"
        folder.mkdir()
        (folder / "exgrpo_pool.npz").write_bytes(b"x")
        record_removed_actor([str(folder / "actor")], step=25)
    (tmp_path / "global_step_20" / "actor").mkdir()
    assert actor_removed(str(tmp_path / "global_step_10")) and not actor_removed(str(tmp_path / "global_step_20"))
    assert prune_pool_files(str(tmp_path), current_step=30) == [str(tmp_path / "global_step_10" / "exgrpo_pool.npz")]
    assert (tmp_path / "global_step_20" / "exgrpo_pool.npz").is_file()


def test_a_new_launch_saving_a_step_an_earlier_launch_rotated_away_keeps_that_steps_pool(actor_worker, tmp_path,
                                                                                         monkeypatch):
    """Launch 1 saves steps 1-3 keeping two: verl's real checkpoint manager removes step 1's actor, the worker
    records it, and the trainer prunes step 1's pool. Launch 2 in the same folder (``trainer.resume_mode=disable``:
    verl's list of kept checkpoints starts empty) saves step 1 again: the old record goes, so the next save's
    pruning keeps step 1's pool beside its actor, and that step resumes; once launch 2's verl rotates step 1 away
    in turn (its save of step 3), the pool goes with it."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from exgrpo.algorithm.config import ExGRPOConfig
    from exgrpo.algorithm.pool import ExperiencePool
    from recipe.exgrpo.composition import dataset_stream
    from recipe.exgrpo.trainer import ExGRPOTrainer

    def verl_save(trainer):  # the parent's save, reduced to the actor (the part that rotates)
        path = tmp_path / f"global_step_{trainer.global_steps}" / "actor"
        actor_worker.save_checkpoint(str(path), None, trainer.global_steps, 2)

    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", verl_save)
    config = ExGRPOConfig(n_rollouts=4)

    def launch():
        trainer = ExGRPOTrainer.__new__(ExGRPOTrainer)  # the save path only: no workers, no dataset
        trainer.config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path),
                                                       "max_actor_ckpt_to_keep": 2}})
        trainer.trainer_mode = "sync"  # what verl's __init__ reads from trainer.v1.trainer_mode
        trainer.exgrpo_enabled = True
        trainer.pool = ExperiencePool(config, seed=0)
        stored = trainer.pool.update("q-1", [1.0, 0.0, 0.0, 0.0], [[5, 6], [7], [8], [9]], [[-0.5, -0.25], [-1.0],
                                                                                          [-1.0], [-1.0]], step=1)
        assert stored == "stored"
        trainer._fresh_source = dataset_stream(lambda: {}, 1)
        actor_worker.actor.engine.checkpoint_manager.previous_saved_paths = []  # what a new launch starts with
        return trainer

    def save(trainer, step):
        trainer.global_steps = step
        trainer._save_checkpoint()

    def state(step):
        folder = tmp_path / f"global_step_{step}"
        return ((folder / "actor").is_dir(), (folder / "exgrpo_pool.npz").is_file(),
                (folder / REMOVED_ACTOR_RECORD).is_file())

    manager = actor_worker.actor.engine.checkpoint_manager
    before = list(manager.previous_saved_paths)
    try:
        first = launch()
        for step in (1, 2, 3):
            save(first, step)
        assert [state(step) for step in (1, 2, 3)] == [(False, False, True), (True, True, False), (True, True, False)]
        second = launch()
        save(second, 1)
        assert state(1) == (True, True, False)  # the record of launch 1 went before anything was written
        save(second, 2)  # pruning runs (nothing rotated): step 1's pool stays beside its actor
        assert state(1) == (True, True, False)
        assert len(ExperiencePool.load(tmp_path / "global_step_1" / "exgrpo_pool.npz", config=config)) == 1
        save(second, 3)  # launch 2's own rotation of step 1: recorded, and the pool goes with the actor
        assert [state(step) for step in (1, 2, 3)] == [(False, False, True), (True, True, False), (True, True, False)]
    finally:
        manager.previous_saved_paths = before


# ---------------------------------------------------------------------------------------------- loss scale
PAPER = ["exgrpo.loss_horizon=8192", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
         "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
         "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
         "trainer.total_training_steps=700"]


@pytest.mark.parametrize(
    ("gpus", "nodes", "legacy_sp", "fsdp_sp", "ranks"),
    [
        (8, 1, 1, 1, 8),
        (8, 2, 1, 1, 16),  # every node's GPUs are data-parallel ranks
        (8, 2, 1, 4, 4),  # fsdp_config's key alone
        (8, 2, 4, 1, 4),  # the deprecated key alone
        (8, 2, 4, 2, 4),  # both: verl copies the deprecated key over fsdp_config's (above 1), so 16 / 4
        (8, 2, 2, 4, 8),  # both, the other way round: 16 / 2
        (4, 4, 1, 2, 8),
    ],
)
def test_the_authors_loss_scale_counts_all_nodes_and_the_sequence_parallel_size_verl_uses(gpus, nodes, legacy_sp,
                                                                                          fsdp_sp, ranks):
    """Factor = 8192 x data-parallel ranks / (64 x 8 sequences per mini-batch), with the ranks counted by hand and
    checked against the sequence-parallel size verl's own FSDPActorConfig ends up with."""
    from verl.utils.config import omega_conf_to_dataclass

    from recipe.exgrpo.main_exgrpo import prepare_exgrpo_config
    from recipe.exgrpo.settings import data_parallel_size

    config = compose_config([*PAPER, f"trainer.n_gpus_per_node={gpus}", f"trainer.nnodes={nodes}",
                             f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={legacy_sp}",
                             f"actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size={fsdp_sp}"])
    verl_sp = omega_conf_to_dataclass(config.actor_rollout_ref.actor).fsdp_config.ulysses_sequence_parallel_size
    assert gpus * nodes // verl_sp == ranks == data_parallel_size(config)
    prepare_exgrpo_config(config)
    assert config.actor_rollout_ref.actor.loss_scale_factor == pytest.approx(8192 * ranks / 512)


def test_a_sequence_parallel_size_that_does_not_divide_the_gpus_names_the_key_verl_uses():
    from recipe.exgrpo.main_exgrpo import prepare_exgrpo_config

    config = compose_config([*PAPER, "trainer.n_gpus_per_node=8", "trainer.nnodes=2",
                             "actor_rollout_ref.actor.ulysses_sequence_parallel_size=3",
                             "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2"])
    with pytest.raises(ValueError, match=r"^actor_rollout_ref.actor.ulysses_sequence_parallel_size=3 does not divide "
                                         r"the 16 GPUs of the run"):
        prepare_exgrpo_config(config)


def test_the_authors_loss_scale_is_refused_off_fsdp():
    from recipe.exgrpo.settings import RecipeSettings, apply_loss_horizon

    config = compose_config([*PAPER, "actor_rollout_ref.actor.strategy=megatron"])
    with pytest.raises(ValueError, match=r"exgrpo.loss_horizon=8192 with actor_rollout_ref.actor.strategy='megatron'"):
        apply_loss_horizon(config, RecipeSettings(loss_horizon=8192))
