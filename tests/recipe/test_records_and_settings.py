"""Record builders (replayed member, per-key ExGRPO fields) and the exgrpo section / verl option checks."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import yaml

pytest.importorskip("verl")

import torch  # noqa: E402
from omegaconf import OmegaConf, open_dict  # noqa: E402
from recipe_helpers import REPO, compose_config  # noqa: E402

from recipe.exgrpo.records import (  # noqa: E402
    IS_REPLAY_FIELD,
    PAST_LOG_PROBS_FIELD,
    ReplayedMember,
    exgrpo_fields,
    final_outputs,
    group_outcome_shares,
    parse_key,
    replay_record,
)
from recipe.exgrpo.settings import check_verl_settings, load_settings  # noqa: E402

BASE = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2"]


def live_record() -> dict:
    """A record with the fields verl's single-turn agent loop writes (agent_loop_tq._agent_loop_postprocess)."""
    prompts, responses = torch.tensor([1, 5, 6]), torch.tensor([9, 9, 9, 9, 2])
    return {
        "prompts": prompts, "responses": responses, "response_mask": torch.ones(5, dtype=torch.int64),
        "rollout_log_probs": torch.full((5,), -0.3), "rm_scores": torch.tensor([0, 0, 0, 0, 0.0]),
        "num_turns": 2, "metrics": {"generate_sequences": 0.1},
        "extra_fields": {"reward_extra_info": {"acc": 0.0}, "min_global_steps": 7, "max_global_steps": 7},
        "uid": "u1", "session_id": 0, "raw_prompt": [{"role": "user", "content": "1+1"}], "data_source": "toy",
        "reward_model": {"ground_truth": "2"}, "extra_info": {"qid": "q1"}, "index": 0, "global_steps": 7,
        "loss_mask": torch.ones(5, dtype=torch.int64), "input_ids": torch.cat([prompts, responses]),
        "position_ids": torch.arange(8), "multi_modal_inputs": {},
    }


def test_parse_and_final_outputs_follow_verl_key_format_and_last_index():
    assert parse_key("ab-c_3_1") == ("ab-c", 3, 1)
    with pytest.raises(ValueError, match="not of the form"):
        parse_key("nounderscore")
    groups = final_outputs(["u_0_0", "u_0_1", "u_1_0", "v_2_0"])
    assert groups == {"u": {0: "u_0_1", 1: "u_1_0"}, "v": {2: "v_2_0"}}


def test_group_outcome_shares_count_equal_groups_over_all_and_over_fresh_ones():
    # a: all wrong (fresh); b: mixed; c: all right (replay); d: all wrong + a replayed success (replay, mixed);
    # e: all 0.5 (graded: zero variance, neither all wrong nor all right); an empty group is not counted
    groups = {"a": [0.0, 0.0, 0.0], "b": [0.0, 1.0, 0.0], "c": [1.0, 1.0], "d": [0.0, 0.0, 1.0],
              "e": [0.5, 0.5], "f": []}
    shares = group_outcome_shares(groups, replay=["c", "d"])
    assert shares["exgrpo/groups_zero_variance"] == 3 / 5
    assert shares["exgrpo/groups_all_wrong"] == 1 / 5
    assert shares["exgrpo/groups_all_right"] == 1 / 5
    assert shares["exgrpo/fresh_groups_zero_variance"] == 2 / 3  # a, e of a, b, e
    assert shares["exgrpo/fresh_groups_all_wrong"] == 1 / 3
    assert shares["exgrpo/fresh_groups_all_right"] == 0.0
    other_scale = group_outcome_shares({"a": [-1.0, -1.0], "b": [0.0, 0.0]}, reward_min=-1.0, reward_max=0.0)
    assert other_scale["exgrpo/groups_all_wrong"] == other_scale["exgrpo/groups_all_right"] == 0.5
    assert np.isnan(group_outcome_shares({}, [])["exgrpo/groups_zero_variance"])
    assert np.isnan(group_outcome_shares({"r": [1.0, 0.0]}, ["r"])["exgrpo/fresh_groups_zero_variance"])


def test_replay_record_keeps_every_field_and_replaces_sequence_reward_and_bookkeeping():
    template = live_record()
    member = ReplayedMember("u1", "q1", "u1_3_0", np.array([7, 8, 2], np.int32),
                            np.array([-1.0, -2.0, -0.5], np.float32), step=3)
    live_tag = {"status": "success", "seq_len": 8, "global_steps": 7, "min_global_steps": 6, "max_global_steps": 6}
    record, tag = replay_record(template, live_tag, member, 3, 1.0, {"acc": 1.0})
    assert set(record) == set(template)
    assert record["responses"].tolist() == [7, 8, 2] and record["prompts"].tolist() == [1, 5, 6]
    assert record["input_ids"].tolist() == [1, 5, 6, 7, 8, 2]
    assert record["position_ids"].tolist() == list(range(6))
    assert record["response_mask"].tolist() == [1, 1, 1] == record["loss_mask"].tolist()
    assert record["rm_scores"].tolist() == [0.0, 0.0, 1.0]
    # Not pi_past: a placeholder the trainer overwrites with the current actor's log-probs (verl's rollout
    # diagnostics read it); the step range is the live group's, the collection step is ExGRPO's own field.
    assert record["rollout_log_probs"].tolist() == [0.0, 0.0, 0.0]
    assert record["session_id"] == 3 and record["uid"] == "u1"
    assert record["extra_fields"]["reward_extra_info"] == {"acc": 1.0}
    assert record["extra_fields"]["min_global_steps"] == record["extra_fields"]["max_global_steps"] == 7
    assert record["extra_fields"]["exgrpo_collected_step"] == 3
    assert tag["min_global_steps"] == tag["max_global_steps"] == 6
    assert tag["prompt_len"] == 3 and tag["response_len"] == 3 and tag["seq_len"] == 6
    assert tag["global_steps"] == 7 and "is_padding" not in tag
    assert template["responses"].tolist() == [9, 9, 9, 9, 2]  # the live record is not modified


def test_exgrpo_fields_cover_every_key_with_response_lengths_from_tags():
    keys = ["a_0_0", "a_3_0", "pad_0_0"]
    tags = [{"response_len": 4}, {"response_len": 2}, {"response_len": 1, "is_padding": True}]
    fields = exgrpo_fields(keys, tags, {"a_3_0": np.array([-0.5, -0.25], np.float32)})
    assert fields[IS_REPLAY_FIELD].tolist() == [0, 1, 0]
    past = fields[PAST_LOG_PROBS_FIELD].unbind()
    assert [t.tolist() for t in past] == [[0.0] * 4, [-0.5, -0.25], [0.0]]
    with pytest.raises(ValueError, match="past log-probs"):
        exgrpo_fields(keys, tags, {"a_3_0": np.zeros(3, np.float32)})


def test_recipe_yaml_composes_passes_verl_validation_and_ties_k_to_rollout_n():
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config = compose_config([*BASE, "actor_rollout_ref.rollout.n=6", "exgrpo.beta=0.3"])  # K follows n
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    core, recipe = load_settings(config)
    assert core.n_rollouts == 6 and core.beta == 0.3 and core.enable
    assert recipe.allow_empty_pool_on_resume is False
    check_verl_settings(config, core)
    assert config.data.gen_batch_size == 1 and config.algorithm.adv_estimator == "grpo"
    assert config.trainer.v1.trainer_mode == "sync"
    # The worker sees the same section through actor_rollout_ref.exgrpo.
    assert OmegaConf.to_container(config.actor_rollout_ref.exgrpo, resolve=True)["beta"] == 0.3


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("exgrpo.rhoo=0.5", "unknown exgrpo config key"),
        ("exgrpo.rho=1.5", "rho"),
        ("exgrpo.n_rollouts=3", "n_rollouts"),
        ("data.gen_batch_size=4", "gen_batch_size"),
        # verl's own separate_async values (a sync interval of 4 mini-batches, no weight-sync engine) fail as verl
        # would assert, before Ray starts (tests/recipe/test_separate_async_tq.py: the mode itself)
        ("trainer.v1.trainer_mode=separate_async", "checkpoint_engine.backend='naive' cannot update a rollout"),
        ("trainer.v1.trainer_mode=fully_async", "trainer_mode='fully_async': the ExGRPO recipe runs in sync, "
         "colocate_async, separate_async"),
        ("algorithm.adv_estimator=gae", "adv_estimator"),
        ("algorithm.rollout_correction.rollout_is=token", "rollout_is"),
        ("exgrpo.allow_empty_pool_on_resume=maybe", "allow_empty_pool_on_resume"),
        ("exgrpo.sample_poll_interval=0", r"exgrpo\.sample_poll_interval=0: must be seconds in \(0, 60\] or null"),
        ("exgrpo.sample_poll_interval=fast", "sample_poll_interval='fast'"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "loss_mode"),
        ("actor_rollout_ref.rollout.multi_turn.enable=true", "multi_turn"),
        ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.enable"),
        ("trainer.v1.sampler.custom_sampler.path=my_sampler.py", "trainer.v1.sampler.custom_sampler.path"),
        ("trainer.v1.sampler.custom_sampler.name=MySampler", "trainer.v1.sampler.custom_sampler.name"),
    ],
)
def test_bad_exgrpo_or_incompatible_verl_settings_fail_naming_the_key(override, message):
    config = compose_config(BASE)
    key, value = override.split("=")
    with open_dict(config):
        OmegaConf.update(config, key, yaml.safe_load(value), force_add=True)
    with pytest.raises(ValueError, match=message):
        core, _ = load_settings(config)
        check_verl_settings(config, core)


def test_the_help_and_the_yaml_name_only_the_pool_file_the_trainer_writes():
    import dataclasses
    import re

    from recipe.exgrpo.settings import POOL_FILE_NAME, RecipeSettings

    # the knob's help (where the yaml's comment moved) names the file; the yaml names no other
    knob = next(f for f in dataclasses.fields(RecipeSettings) if f.name == "allow_empty_pool_on_resume")
    assert POOL_FILE_NAME in knob.metadata["help"]
    text = (REPO / "recipe" / "exgrpo" / "config" / "exgrpo_trainer.yaml").read_text()
    assert set(re.findall(r"exgrpo_pool\.\w+", text)) <= {POOL_FILE_NAME}


def test_yaml_defaults_to_the_papers_group_size():
    assert compose_config(BASE).actor_rollout_ref.rollout.n == 8


def test_disabled_exgrpo_accepts_any_verl_grpo_batching():
    config = compose_config([*BASE, "exgrpo.enable=false", "data.gen_batch_size=null"])
    core, _ = load_settings(config)
    check_verl_settings(config, core)  # the on-policy baseline needs no ExGRPO-specific setting


def test_disabled_exgrpo_accepts_dynamic_sampling_and_a_custom_sampler():
    config = compose_config([*BASE, "exgrpo.enable=false", "algorithm.filter_groups.enable=true",
                             "trainer.v1.sampler.custom_sampler.path=my_sampler.py",
                             "trainer.v1.sampler.custom_sampler.name=MySampler"])
    core, _ = load_settings(config)
    check_verl_settings(config, core)  # only replay needs them off


def test_a_baseline_that_keeps_the_authors_loss_refuses_what_that_loss_cannot_honour():
    """enable=false with an authors' setting (the paper profile's GRPO script) still trains with the ExGRPO loss:
    rollout correction, a non-vanilla policy loss and distillation are refused at start-up, as with replay on;
    a plain baseline (verl's own loss) accepts them."""
    authors = [*BASE, "exgrpo.enable=false", "exgrpo.entropy_agg=micro_batch_token_mean"]
    for override, message in (("algorithm.rollout_correction.rollout_is=token", "rollout_is"),
                              ("actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "loss_mode"),
                              ("distillation.enabled=true", "distillation")):
        config = compose_config([*authors, override])
        core, _ = load_settings(config)
        with pytest.raises(ValueError, match=message):
            check_verl_settings(config, core)
        plain = compose_config([*BASE, "exgrpo.enable=false", override])
        check_verl_settings(plain, load_settings(plain)[0])


def test_the_grad_norm_guard_is_refused_off_the_fsdp_engines():
    for strategy, refused in (("megatron", True), ("fsdp2", False), ("fsdp", False)):
        config = compose_config([*BASE, "exgrpo.skip_step_grad_norm=500", f"actor_rollout_ref.actor.strategy={strategy}"])
        core, _ = load_settings(config)
        if refused:
            with pytest.raises(ValueError, match=r"skip_step_grad_norm=500 with actor_rollout_ref.actor.strategy=.megatron."):
                check_verl_settings(config, core)
        else:
            check_verl_settings(config, core)
    for enable in ("true", "false"):  # the baseline gets the guard too
        config = compose_config([*BASE, f"exgrpo.enable={enable}", "exgrpo.skip_step_grad_norm=500",
                                 "actor_rollout_ref.actor.strategy=megatron"])
        with pytest.raises(ValueError, match="grad-norm guard"):
            check_verl_settings(config, load_settings(config)[0])


def test_entry_point_prints_the_composed_job_config():
    """``python -m recipe.exgrpo.main_exgrpo --cfg job`` (hydra) prints the config without starting anything."""
    result = subprocess.run(
        [sys.executable, "-m", "recipe.exgrpo.main_exgrpo", "--cfg", "job", "exgrpo.rho=0.25"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    printed = OmegaConf.create(result.stdout)
    assert printed.exgrpo.rho == 0.25 and printed.data.gen_batch_size == 1
    assert printed.actor_rollout_ref.exgrpo.rho == 0.25 and printed.actor_rollout_ref.exgrpo.n_rollouts == 8


def test_old_pool_files_are_pruned_only_where_verl_removed_the_actor_checkpoint(tmp_path):
    from recipe.exgrpo.state import prune_pool_files
    from recipe.exgrpo.storage import record_removed_actor

    for step, has_actor in ((10, False), (20, True), (30, False)):
        folder = tmp_path / f"global_step_{step}"
        (folder / "actor").mkdir(parents=True) if has_actor else folder.mkdir()
        (folder / "exgrpo_pool.npz").write_bytes(b"x")
        (folder / "exgrpo_pending_fresh.json").write_text("{}")
    record_removed_actor([str(tmp_path / "global_step_10" / "actor")], step=30)  # what verl's rank 0 records
    removed = prune_pool_files(str(tmp_path), current_step=30)
    assert removed == [str(tmp_path / "global_step_10" / "exgrpo_pool.npz"),
                       str(tmp_path / "global_step_10" / "exgrpo_pending_fresh.json")]
    assert (tmp_path / "global_step_20" / "exgrpo_pool.npz").exists()
    assert (tmp_path / "global_step_30" / "exgrpo_pool.npz").exists()  # the step just saved is never touched
    assert (tmp_path / "global_step_30" / "exgrpo_pending_fresh.json").exists()


def test_trainer_maps_the_actor_role_to_the_exgrpo_worker_class():
    from verl.trainer.ppo.utils import Role

    from recipe.exgrpo.trainer import ExGRPOTrainer
    from recipe.exgrpo.worker import ExGRPOActorRolloutRefWorker

    config = compose_config([*BASE, "actor_rollout_ref.rollout.n=4"])
    trainer = ExGRPOTrainer(config, load_settings(config))
    trainer._init_resource_pool_mgr()
    actor_roles = [r for r in (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor) if r in trainer.role_worker_mapping]
    assert actor_roles
    for role in actor_roles:
        assert trainer.role_worker_mapping[role].__ray_actor_class__ is ExGRPOActorRolloutRefWorker


def test_the_trainer_looks_for_finished_groups_at_the_poll_interval_set():
    """verl builds its replay buffer with a 2-s poll its config cannot change; exgrpo.sample_poll_interval sets it
    (the CPU profile's 0.2 s), and null leaves verl's."""
    from recipe.exgrpo.trainer import ExGRPOTrainer

    for override, expected in ((), 2.0), (("exgrpo.sample_poll_interval=0.2",), 0.2):
        config = compose_config([*BASE, "actor_rollout_ref.rollout.n=4", *override])
        assert ExGRPOTrainer(config, load_settings(config)).replay_buffer.poll_interval == expected, override


# ----------------------------------------------------------------------------------------------- verl settings that
# verl accepts but that would break ExGRPO (or any run) without a word
def checked(overrides: list[str]) -> None:
    config = compose_config([*BASE, *overrides])
    check_verl_settings(config, load_settings(config)[0])


def test_several_local_updates_per_step_are_refused_naming_the_key_verl_reads():
    """verl's PPOTrainer reads trainer.v1.<trainer_mode>.parameter_sync_step (default 1) and runs _step_once that many
    times under one prepare_step; ExGRPO plans, inserts and collects once a step."""
    import inspect

    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    source = inspect.getsource(PPOTrainer.__init__)
    assert 'self.config.trainer.v1.get(self.trainer_mode, {}).get("parameter_sync_step", 1)' in source
    for value in (2, 4, 0):
        with pytest.raises(ValueError, match=rf"^trainer\.v1\.sync\.parameter_sync_step={value}: .*set it to 1"):
            checked([f"+trainer.v1.sync.parameter_sync_step={value}"])
    checked([])  # verl's sync: {} has no key: one update a step
    checked(["+trainer.v1.sync.parameter_sync_step=1"])
    # the baseline is stock verl GRPO, whose prepare_step and _step_once support it
    checked(["exgrpo.enable=false", "+trainer.v1.sync.parameter_sync_step=4"])
    # the asynchronous modes' own value (4 in verl's yaml) is not the sync trainer's
    assert compose_config(BASE).trainer.v1.separate_async.parameter_sync_step == 4
    # colocate_async reads its own section, which has no key in verl's yaml: one update a step
    checked(["trainer.v1.trainer_mode=colocate_async"])
    with pytest.raises(ValueError, match=r"^trainer\.v1\.colocate_async\.parameter_sync_step=2: .*set it to 1"):
        checked(["trainer.v1.trainer_mode=colocate_async", "+trainer.v1.colocate_async.parameter_sync_step=2"])


SDPA = "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
LEGACY_SP = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
FSDP_SP = "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"
ATTENTION = "actor_rollout_ref.model.override_config.attn_implementation"


@pytest.mark.parametrize("enable", ["true", "false"])
@pytest.mark.parametrize("sp_key", [LEGACY_SP, FSDP_SP])
@pytest.mark.parametrize(
    "attention",
    ["sdpa", "eager", "flex_attention", "paged|flash_attention_2", "kernels-community/flash-attn:flash_attn_func"],
)
def test_sequence_parallelism_over_unpatched_attention_is_refused_naming_both_keys(attention, sp_key, enable):
    with pytest.raises(ValueError) as error:
        checked([f"+{ATTENTION}={attention}", f"{sp_key}=2", f"exgrpo.enable={enable}"])
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"{ATTENTION}={attention!r} with {sp_key}=2: verl's Ulysses patch covers only "
        "flash_attention_2, flash_attention_3, flash_attention_4"
    )


def test_the_deprecated_sequence_parallel_key_is_named_when_it_is_the_one_verl_uses():
    with pytest.raises(ValueError, match=rf"with {LEGACY_SP}=4: "):
        checked([SDPA, f"{LEGACY_SP}=4", f"{FSDP_SP}=2"])


@pytest.mark.parametrize(
    "overrides",
    [
        [f"{FSDP_SP}=2"],  # verl's default attention: flash_attention_2
        [f"+{ATTENTION}=flash_attention_2", f"{LEGACY_SP}=2"],
        [f"+{ATTENTION}=flash_attention_3", f"{FSDP_SP}=4"],
        [f"+{ATTENTION}=kernels-community/flash-attn", f"{FSDP_SP}=2"],  # wrapped in transformers' flash path
        [SDPA],  # no sequence parallelism: each rank holds whole sequences (the CPU twin)
        [SDPA, f"{FSDP_SP}=1"],
        [SDPA, f"{FSDP_SP}=2", "actor_rollout_ref.actor.strategy=megatron"],  # the key is FSDP's only
    ],
)
def test_sequence_parallelism_is_accepted_over_the_attention_verl_patches_or_without_it(overrides):
    checked(overrides)


def test_the_accepted_attention_names_are_exactly_those_behind_the_flash_function_verl_patches():
    """verl's patch replaces _flash_attention_forward in transformers.integrations.flash_attention; every entry of
    transformers' attention table that calls another function is refused under sequence parallelism."""
    import inspect

    from transformers.integrations import flash_attention
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from verl.models.transformers import monkey_patch
    from verl.workers.config.model import HFModelConfig

    from recipe.exgrpo.settings import ULYSSES_ATTENTION

    patch_source = inspect.getsource(monkey_patch.apply_monkey_patch)
    assert "flash_attention._flash_attention_forward = _ulysses_flash_attention_forward" in patch_source
    assert 'override_config.get("attn_implementation", "flash_attention_2")' in inspect.getsource(
        HFModelConfig.__post_init__
    )
    patched = {name for name, fn in ALL_ATTENTION_FUNCTIONS.items() if fn is flash_attention.flash_attention_forward}
    assert patched == ULYSSES_ATTENTION
    for name in [*ALL_ATTENTION_FUNCTIONS.keys(), "eager"]:
        if name in patched:
            checked([f"+{ATTENTION}={name}", f"{FSDP_SP}=2"])
        else:
            with pytest.raises(ValueError, match="verl's Ulysses patch covers only"):
                checked([f"+{ATTENTION}={name}", f"{FSDP_SP}=2"])


def test_replay_weight_spread_by_staleness_from_a_hand_computation():
    import math

    from recipe.exgrpo.records import replay_weight_spread

    ln2 = math.log(2.0)
    rows = [(0, np.array([0.0, ln2])), (1, np.array([0.0])), (3, np.array([-ln2])), (2, np.array([0.0])),
            (None, np.array([5.0])), (0, np.array([]))]
    out = replay_weight_spread(rows)
    # staleness 0: w = 1, 2; 1: w = 1; 2+: w = 0.5, 1 (staleness 3 and 2); unknown staleness left out
    assert out == pytest.approx({
        "exgrpo/replay_w_mean/staleness_0": 1.5, "exgrpo/replay_w_mean/staleness_1": 1.0,
        "exgrpo/replay_w_mean/staleness_2+": 0.75,
        "exgrpo/replay_w_std/staleness_0": 0.5, "exgrpo/replay_log_w_abs/staleness_0": ln2 / 2,
        "exgrpo/replay_w_tokens/staleness_0": 2.0,
        "exgrpo/replay_w_std/staleness_1": 0.0, "exgrpo/replay_log_w_abs/staleness_1": 0.0,
        "exgrpo/replay_w_tokens/staleness_1": 1.0,
        "exgrpo/replay_w_std/staleness_2+": 0.25, "exgrpo/replay_log_w_abs/staleness_2+": ln2 / 2,
        "exgrpo/replay_w_tokens/staleness_2+": 2.0,
    })
    assert replay_weight_spread([]) == {} and replay_weight_spread([(None, np.array([1.0]))]) == {}


def test_stored_log_probs_is_one_of_two_and_rollout_needs_the_engines_log_probs():
    from recipe.exgrpo.main_exgrpo import prepare_exgrpo_config

    steps = "trainer.total_training_steps=5"
    assert prepare_exgrpo_config(compose_config([steps]))[1].stored_log_probs == "recomputed"
    assert prepare_exgrpo_config(compose_config([steps, "exgrpo.stored_log_probs=rollout"]))[1].stored_log_probs == (
        "rollout")
    with pytest.raises(ValueError, match=r"^exgrpo\.stored_log_probs='engine': must be one of recomputed, rollout$"):
        prepare_exgrpo_config(compose_config([steps, "exgrpo.stored_log_probs=engine"]))
    with pytest.raises(ValueError, match=r"^exgrpo\.stored_log_probs='rollout' with actor_rollout_ref\.rollout\."
                                         r"calculate_log_probs=false: "):
        prepare_exgrpo_config(compose_config([steps, "exgrpo.stored_log_probs=rollout",
                                              "actor_rollout_ref.rollout.calculate_log_probs=false"]))
