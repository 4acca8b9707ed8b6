"""The launcher's check of its hydra arguments (recipe/exgrpo/overrides.py): hydra composes them as the entry point
will, and what it would refuse is refused in one line naming the argument and its layer, before anything starts.
The layers' precedence is hydra's own (groups in the defaults list, then the arguments in order, the last winning)."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from recipe_helpers import compose_config  # noqa: E402
from test_run_scripts import data_dir, fake_model, run_script  # noqa: E402, F401  (data_dir is a fixture)

from recipe.exgrpo import overrides as ov  # noqa: E402


def checked(*layers):
    """Check ``(layer name, arguments)`` pairs as the launcher does; the arguments as one list, in order."""
    args = []
    for name, items in layers:
        args += [ov.LAYER_FLAG, name, *items]
    ov.check(ov.parse_layers(args))
    return [line for _, items in layers for line in items]


def test_a_users_plain_value_for_a_key_the_profile_adds_wins_and_a_plus_on_an_existing_key_is_refused():
    strict = "reward.custom_reward_function.reward_kwargs.strict_format"
    out = checked(("the launcher", ["profile=paper", "trainer.total_training_steps=700"]),
                  ("your overrides", [f"{strict}=false", "exgrpo.rho=0.25", "trainer.nnodes=2"]))
    config = compose_config(out)
    assert config.reward.custom_reward_function.reward_kwargs.strict_format is False
    assert config.exgrpo.rho == 0.25 and config.trainer.nnodes == 2
    # hydra's rule: + adds a key; on one the config has (from verl's yaml or a profile) it is refused, with the fix
    for key in ("trainer.nnodes=2", f"{strict}=false"):
        with pytest.raises(ov.OverrideError) as error:
            checked(("the launcher", ["profile=paper"]), ("your overrides", [f"+{key}"]))
        message = str(error.value)
        assert message.startswith(f"+{key} (your overrides): hydra refuses it: Could not append to config. An item is "
                                  f"already at '{key.split('=')[0]}'") and "\n" not in message, message
        assert f"Either remove + prefix: '{key}'" in message


def test_force_add_deletion_and_group_choices_are_hydras_own():
    out = checked(("launcher", ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                                "trainer.logger=[console]"]),
                  ("user", ["++trainer.project_name=mine", "~trainer.logger", "actor@actor_rollout_ref.actor=dp_actor",
                            "trainer.nnodes=3"]))
    config = compose_config(out)
    assert "logger" not in config.trainer and config.trainer.project_name == "mine" and config.trainer.nnodes == 3
    assert config.actor_rollout_ref.actor.strategy == "fsdp"  # verl's dp_actor group
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"


def test_a_key_that_cannot_be_set_is_refused_naming_it_its_layer_and_the_nearest_keys():
    with pytest.raises(ov.OverrideError) as error:
        checked(("your overrides", ["trainer.total_training_step=3"]))
    message = str(error.value)
    assert message.startswith("trainer.total_training_step=3 (your overrides): the config has no key ")
    assert "did you mean trainer.total_training_steps?" in message
    assert "to add a new key, write +trainer.total_training_step=3" in message
    with pytest.raises(ov.OverrideError, match=r"the config has no actor_rollout_ref.nothing to delete"):
        checked(("user", ["~actor_rollout_ref.nothing"]))
    with pytest.raises(ov.OverrideError, match=r"data.train_batch_size=\[1 \(user\): not a hydra override"):
        ov.parse_layers([ov.LAYER_FLAG, "user", "data.train_batch_size=[1"])
    with pytest.raises(ov.OverrideError, match=r"a sweep"):
        ov.parse_layers([ov.LAYER_FLAG, "user", "exgrpo.rho=0.1,0.5"])
    with pytest.raises(ov.OverrideError, match=r"--cfg \(user\): the run scripts take hydra overrides"):
        ov.parse_layers([ov.LAYER_FLAG, "user", "--cfg"])
    # a config group choice that does not exist: hydra's reason, on one line
    with pytest.raises(ov.OverrideError, match=r"config group choice profile=papr \(user\): .*Could not find "
                                               r"'profile/papr'") as error:
        checked(("user", ["profile=papr"]))
    assert "\n" not in str(error.value)
    bad = "actor_rollout_ref.model.custom_chat_template='{{ m['x'] }}\n'"
    with pytest.raises(ov.OverrideError) as error:  # a chat template's newline: the message stays on one line
        ov.parse_layers([ov.LAYER_FLAG, "user", bad])
    assert "\n" not in str(error.value) and "}}\\n' (user): not a hydra override" in str(error.value)


def test_file_search_path_composes_the_same_config_as_the_recipes_pkg_search_path(tmp_path, data_dir):  # noqa: F811
    """The module composes through file:// (no verl import); the entry point through pkg://. Same config, and the
    check's way of finding a refused argument (hydra's override routine on the config composed from the group
    choices, one argument at a time) equals a full composition."""
    env = {"MODEL_PATH": str(fake_model(tmp_path / "model")), "DATA_DIR": str(data_dir), "DRY_RUN": "1"}
    lines = run_script("qwen2.5_math_7b_exgrpo.sh", {**env, "EXGRPO_DEVICE": "cpu", "MAX_PROMPT_LENGTH": "29",
                                                     "MAX_RESPONSE_LENGTH": "24"}).stdout.splitlines()
    assert lines
    reference = OmegaConf.to_container(compose_config(lines), resolve=False)
    assert OmegaConf.to_container(ov.compose(lines), resolve=False) == reference
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    entries = ov.parse_layers([ov.LAYER_FLAG, "launcher", *lines])
    groups = [entry.line for entry in entries if ov._is_group(entry)]
    assert groups == ["profile=paper", "device=cpu", "precision=bf16"] or groups[:2] == ["profile=paper", "device=cpu"]
    applied = ov.compose(groups)
    for entry in entries:
        if entry.line not in groups:
            ConfigLoaderImpl._apply_overrides_to_config([entry.override], applied)
    assert OmegaConf.to_container(applied, resolve=False) == reference


STRICT_OFF = "reward.custom_reward_function.reward_kwargs.strict_format=false"


def test_the_issue_command_composes_on_gpu_and_cpu_with_the_users_value(tmp_path, data_dir):  # noqa: F811
    """`bash run_scripts/qwen2.5_math_7b_exgrpo.sh ...strict_format=false` was refused by hydra at start-up."""
    env = {"MODEL_PATH": str(fake_model(tmp_path / "model")), "DATA_DIR": str(data_dir), "DRY_RUN": "1"}
    twin = {"EXGRPO_DEVICE": "cpu", "MAX_PROMPT_LENGTH": "29", "MAX_RESPONSE_LENGTH": "24"}
    # On the CPU, two of the CPU profile's +keys overridden plainly too (on a GPU nothing adds them: refused there).
    cpu_keys = ("ray_kwargs.ray_init.num_gpus=2", "actor_rollout_ref.rollout.enable_sleep_mode=true")
    for extra, args in (({}, ()), (twin, cpu_keys)):
        result = run_script("qwen2.5_math_7b_exgrpo.sh", {**env, **extra}, STRICT_OFF, *args)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        # printed as given: hydra's order makes it win over the paper profile's value
        assert STRICT_OFF in lines and not any(line.endswith("strict_format=true") for line in lines)
        config = compose_config(lines)
        assert config.reward.custom_reward_function.reward_kwargs.strict_format is False
        if args:
            assert config.ray_kwargs.ray_init.num_gpus == 2 and config.actor_rollout_ref.rollout.enable_sleep_mode
    result = run_script("qwen2.5_math_7b_exgrpo.sh", env, cpu_keys[0])
    assert result.returncode == 2 and "has no key ray_kwargs.ray_init.num_gpus" in result.stderr


def test_the_launcher_refuses_a_key_it_cannot_set_in_one_line_before_anything_starts(tmp_path, data_dir):  # noqa: F811
    env = {"MODEL_PATH": str(fake_model(tmp_path / "model")), "DATA_DIR": str(data_dir), "CKPT_DIR": "ck"}
    for extra in ({"DRY_RUN": "1"}, {}):  # a real launch stops at the same line, before Ray or the trainer
        result = run_script("qwen2.5_math_7b_exgrpo.sh", {**env, **extra}, "trainer.total_training_step=3",
                            cwd=tmp_path)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.splitlines() == [
            "error: trainer.total_training_step=3 (your overrides): the config has no key trainer.total_training_step"
            " (did you mean trainer.total_training_steps?); to add a new key, write +trainer.total_training_step=3"
        ]
        assert not (tmp_path / "ck").exists()


def test_a_dotted_key_after_a_dict_on_its_parent_wins_in_what_hydra_composes():
    """A profile's ``exgrpo.rho=0.1``, a later layer's ``exgrpo={rho:0.2}``, your ``exgrpo.rho=0.3``: the arguments
    keep their written order, so yours wins (a merge that kept each key at its first place once gave 0.2)."""
    for profile, layer in (("exgrpo.rho=0.1", "exgrpo={rho:0.2}"), ("++exgrpo.rho=0.1", "+exgrpo={rho:0.2}")):
        out = checked(("profile", [profile, "trainer.total_training_steps=7"]), ("script", [layer]),
                      ("user", ["exgrpo.rho=0.3"]))
        config = compose_config(out)
        assert config.exgrpo.rho == 0.3 and config.actor_rollout_ref.exgrpo.rho == 0.3
        assert config.exgrpo.beta == 0.1 and config.trainer.total_training_steps == 7  # nothing else touched


def test_a_dict_after_a_dotted_key_wins_and_keeps_what_it_does_not_name():
    """The reverse: a later dict beats an earlier dotted key it names; hydra merges a dict into the node, so the
    earlier layers' keys it does not name (beta, and a key the profile adds) keep their values."""
    out = checked(("profile", ["profile=paper", "exgrpo.rho=0.1", "exgrpo.beta=0.25"]),
                  ("user", ["exgrpo={rho:0.2,mu:0.75}", "reward.custom_reward_function.reward_kwargs={}"]))
    config = compose_config(out)
    assert (config.exgrpo.rho, config.exgrpo.beta, config.exgrpo.mu) == (0.2, 0.25, 0.75)
    assert config.reward.custom_reward_function.reward_kwargs.strict_format is True
    # A value that is not a dict takes the node's place.
    out = checked(("profile", ["profile=paper"]), ("user", ["reward.custom_reward_function.reward_kwargs=null"]))
    assert compose_config(out).reward.custom_reward_function.reward_kwargs is None


SHAPES = ["exgrpo.rho=0.1", "++exgrpo.rho=0.15", "exgrpo={rho:0.2}", "~exgrpo.beta", "+exgrpo.new=1",
          "+exgrpo.rho=0.4", "exgrpo.nope=1"]


def test_the_check_refuses_exactly_what_hydra_refuses_and_names_the_argument():
    """Every pair of argument shapes over a node and its keys: the check passes where hydra composes the pair, and
    otherwise refuses in one line that names the argument hydra stopped at (the second when the first alone
    composes)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    def composes(*lines: str) -> bool:
        try:
            ov.compose(list(lines))
            return True
        except (HydraException, OmegaConfBaseException):
            return False

    alone = {shape: composes(shape) for shape in SHAPES}  # hydra on each shape by itself, once (~0.5 s a compose)
    refused = 0
    for first, second in itertools.product(SHAPES, repeat=2):
        if composes(first, second):
            checked(("a", [first]), ("b", [second]))
            continue
        refused += 1
        with pytest.raises(ov.OverrideError) as error:
            checked(("a", [first]), ("b", [second]))
        message = str(error.value)
        stopped = f"{second} (b)" if alone[first] else f"{first} (a)"
        assert message.startswith(stopped) and "\n" not in message, (first, second, message)
    assert 10 < refused < 40  # of 49: both sides seen


@pytest.mark.parametrize("switch, field, value", [("exgrpo.shaping=false", "shaping", False),
                                                  ("exgrpo.select=random", "select", "random"),
                                                  ("exgrpo.sigma=1000.0", "sigma", 1000.0)])
def test_an_ablations_switch_on_the_exgrpo_section_reaches_the_config_the_actor_workers_build_their_loss_from(
        switch, field, value):
    """The paper's ablations are switched on the top-level section; the actor workers receive only
    actor_rollout_ref, and read the section there (``worker_exgrpo_config``)."""
    from recipe.exgrpo.worker import worker_exgrpo_config

    default = getattr(worker_exgrpo_config(compose_config([]).actor_rollout_ref), field)
    assert default != value
    assert getattr(worker_exgrpo_config(compose_config([switch]).actor_rollout_ref), field) == value
