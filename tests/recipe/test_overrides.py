"""The launcher's override merge (recipe/exgrpo/overrides.py): hydra's parser, the last layer wins, the prefix hydra
needs, and a one-line refusal of what hydra would refuse, before anything starts."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from recipe_helpers import REPO, compose_config  # noqa: E402
from test_run_scripts import data_dir, fake_model, run_script  # noqa: E402, F401  (data_dir is a fixture)

from recipe.exgrpo import overrides as ov  # noqa: E402


@pytest.fixture(scope="module")
def base():
    return ov.compose([])


def merged(base, *layers):
    args = []
    for name, items in layers:
        args += [ov.LAYER_FLAG, name, *items]
    return ov.merge(ov.parse_layers(args), base)


def test_the_last_layer_wins_at_the_first_place_and_keeps_the_plus_hydra_needs(base):
    strict = "reward.custom_reward_function.reward_kwargs.strict_format"
    out = merged(
        base,
        ("profile", [f"+{strict}=true", "trainer.total_training_steps=700", "exgrpo.rho=0.5"]),
        ("user", [f"{strict}=false", "exgrpo.rho=0.25", "+trainer.nnodes=2"]),
    )
    # strict_format is not in verl's yaml: the profile's + stays on the user's value; exgrpo.rho is (no prefix);
    # the user's + on trainer.nnodes, a key the yaml has, would be refused by hydra ("An item is already at"): gone.
    assert out == [f"+{strict}=false", "trainer.total_training_steps=700", "exgrpo.rho=0.25", "trainer.nnodes=2"]
    config = compose_config(out)
    assert config.reward.custom_reward_function.reward_kwargs.strict_format is False
    assert config.exgrpo.rho == 0.25 and config.trainer.nnodes == 2


def test_force_add_is_kept_deletion_wins_and_group_choices_pass_through(base):
    out = merged(
        base,
        ("launcher", ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                      "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
                      "trainer.logger=[console]"]),
        ("user", ["++trainer.project_name=mine", "~actor_rollout_ref.actor.fsdp_config.mixed_precision",
                  "~trainer.logger"]),
    )
    # mixed_precision is not in the yaml: deleting it drops what the launcher added and passes nothing on;
    # trainer.logger is: the deletion goes to hydra, and the launcher's value is gone.
    assert out == ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa", "~trainer.logger",
                   "++trainer.project_name=mine"]
    config = compose_config(out)
    assert "logger" not in config.trainer and config.trainer.project_name == "mine"
    assert "mixed_precision" not in config.actor_rollout_ref.actor.fsdp_config
    group = "actor@actor_rollout_ref.actor=dp_actor"
    args = [ov.LAYER_FLAG, "user", group, "trainer.nnodes=3"]
    with_group = ov.merge_layers(args)
    assert with_group == [group, "trainer.nnodes=3"]


def test_a_key_that_cannot_be_set_is_refused_naming_it_its_layer_and_the_nearest_keys(base):
    with pytest.raises(ov.OverrideError) as error:
        merged(base, ("your overrides", ["trainer.total_training_step=3"]))
    message = str(error.value)
    assert message.startswith("trainer.total_training_step=3 (your overrides): the config has no key ")
    assert "did you mean trainer.total_training_steps?" in message
    assert "to add a new key, write +trainer.total_training_step=3" in message
    with pytest.raises(ov.OverrideError, match=r"the config has no actor_rollout_ref.nothing to delete"):
        merged(base, ("user", ["~actor_rollout_ref.nothing"]))
    with pytest.raises(ov.OverrideError, match=r"data.train_batch_size=\[1 \(user\): not a hydra override"):
        ov.parse_layers([ov.LAYER_FLAG, "user", "data.train_batch_size=[1"])
    with pytest.raises(ov.OverrideError, match=r"a sweep"):
        ov.parse_layers([ov.LAYER_FLAG, "user", "exgrpo.rho=0.1,0.5"])
    with pytest.raises(ov.OverrideError, match=r"--cfg \(user\): the run scripts take hydra overrides"):
        ov.parse_layers([ov.LAYER_FLAG, "user", "--cfg"])
    # The final check is hydra's own composition step: what it refuses (here an add on a key that has a value,
    # which merge() never passes on) is refused in one line too.
    with pytest.raises(ov.OverrideError, match=r"hydra refuses the merged overrides: Could not append to config. An "
                                               r"item is already at 'trainer.nnodes'"):
        ov.check(["+trainer.nnodes=2"], base)


def test_file_search_path_composes_the_same_config_as_the_recipes_pkg_search_path(tmp_path, data_dir):  # noqa: F811
    """The module composes through file:// (no verl import); the entry point through pkg://. Same config, and the
    module's shortcut for the second step (hydra's override routine on the base) equals a full composition."""
    env = {"MODEL_PATH": str(fake_model(tmp_path / "model")), "DATA_DIR": str(data_dir), "DRY_RUN": "1"}
    lines = run_script("qwen2.5_math_7b_exgrpo.sh", {**env, "EXGRPO_DEVICE": "cpu", "MAX_PROMPT_LENGTH": "29",
                                                     "MAX_RESPONSE_LENGTH": "24"}).stdout.splitlines()
    assert lines
    reference = OmegaConf.to_container(compose_config(lines), resolve=False)
    assert OmegaConf.to_container(ov.compose(lines), resolve=False) == reference
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    applied = ov.compose([])
    ConfigLoaderImpl._apply_overrides_to_config(ov.OverridesParser.create().parse_overrides(lines), applied)
    assert OmegaConf.to_container(applied, resolve=False) == reference


def test_values_round_trip_byte_for_byte_nul_separated():
    template = '{% for m in messages %}\n{{ m["content"] }}=x\n{% endfor %}'
    lines = [f"actor_rollout_ref.model.custom_chat_template='{template}'", "trainer.experiment_name='a b=c'"]
    result = subprocess.run([sys.executable, "-m", "recipe.exgrpo.overrides", ov.LAYER_FLAG, "user", *lines],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\0") == [*lines, ""]
    assert compose_config(lines).actor_rollout_ref.model.custom_chat_template == template
    bad = "actor_rollout_ref.model.custom_chat_template='{{ m['x'] }}\n'"
    with pytest.raises(ov.OverrideError) as error:  # the message stays on one line
        ov.parse_layers([ov.LAYER_FLAG, "user", bad])
    assert "\n" not in str(error.value) and "}}\\n' (user): not a hydra override" in str(error.value)


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
        assert f"+{STRICT_OFF}" in lines and not any(line.endswith("strict_format=true") for line in lines)
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


def test_the_cached_base_config_equals_a_fresh_composition_and_follows_the_yaml(tmp_path):
    """The base config is cached under a fingerprint of the yaml files it reads: the cached copy behaves as the
    composed one (same content, unknown keys refused), and a changed group choice composes afresh."""
    fresh = ov.compose([])
    first = ov.base_config([], cache_dir=tmp_path)
    cached = ov.base_config([], cache_dir=tmp_path)  # read back from the file just written
    assert len(list(tmp_path.glob("base-*.yaml"))) == 1
    for config in (first, cached):
        assert OmegaConf.to_container(config, resolve=False) == OmegaConf.to_container(fresh, resolve=False)
    assert OmegaConf.is_missing(cached.actor_rollout_ref.rollout, "name")  # ??? survives the round trip
    with pytest.raises(ov.OverrideError, match="Could not override 'trainer.nope'"):
        ov.check(["trainer.nope=1"], cached)
    other = ov.base_config(["actor@actor_rollout_ref.actor=dp_actor"], cache_dir=tmp_path)
    assert len(list(tmp_path.glob("base-*.yaml"))) == 2 and other.actor_rollout_ref.actor.strategy == "fsdp"


def test_a_dotted_key_after_a_dict_on_its_parent_wins_in_what_hydra_composes(base):
    """The issue's case: a profile's ``exgrpo.rho=0.1``, a later layer's ``exgrpo={rho:0.2}``, your ``exgrpo.rho=0.3``.
    Kept at its first place, your value came before the dict and the run used 0.2."""
    for profile, layer in (("exgrpo.rho=0.1", "exgrpo={rho:0.2}"), ("++exgrpo.rho=0.1", "+exgrpo={rho:0.2}")):
        out = merged(base, ("profile", [profile, "trainer.total_training_steps=7"]), ("script", [layer]),
                     ("user", ["exgrpo.rho=0.3"]))
        assert out.index("exgrpo.rho=0.3") > out.index(layer), out
        config = compose_config(out)
        assert config.exgrpo.rho == 0.3 and config.actor_rollout_ref.exgrpo.rho == 0.3
        assert config.exgrpo.beta == 0.1 and config.trainer.total_training_steps == 7  # nothing else touched


def test_a_dict_after_a_dotted_key_wins_and_keeps_what_it_does_not_name(base):
    """The reverse: a later dict beats an earlier dotted key it names; hydra merges a dict into the node, so the
    earlier layers' keys it does not name (beta, and an added key) keep their values."""
    strict = "reward.custom_reward_function.reward_kwargs.strict_format"
    out = merged(base, ("profile", ["exgrpo.rho=0.1", "exgrpo.beta=0.25", f"+{strict}=true"]),
                 ("user", ["exgrpo={rho:0.2,mu:0.75}", "reward.custom_reward_function.reward_kwargs={}"]))
    config = compose_config(out)
    assert (config.exgrpo.rho, config.exgrpo.beta, config.exgrpo.mu) == (0.2, 0.25, 0.75)
    assert config.reward.custom_reward_function.reward_kwargs.strict_format is True
    # A value that is not a dict takes the node's place: what earlier layers set inside it goes, and the node the
    # profile's + created (verl's yaml has no reward_kwargs) takes the user's plain override with that +.
    out = merged(base, ("profile", [f"+{strict}=true", "exgrpo.rho=0.1"]),
                 ("user", ["reward.custom_reward_function.reward_kwargs=null"]))
    assert out == ["exgrpo.rho=0.1", "+reward.custom_reward_function.reward_kwargs=null"]
    assert compose_config(out).reward.custom_reward_function.reward_kwargs is None


def test_the_merged_list_resolves_as_every_layer_applied_in_order_whatever_shapes_they_wrote():
    """Every sequence of three layers (one override each) over a node and its keys, in every shape: where hydra
    accepts the layers as one list, the merged list resolves to the same config (applied by hydra's own routine)."""
    import itertools

    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    small = OmegaConf.create({"exgrpo": {"rho": 0.5, "beta": 0.1}, "trainer": {"nnodes": 1}})
    OmegaConf.set_struct(small, True)
    shapes = ["exgrpo.rho=0.1", "++exgrpo.rho=0.15", "exgrpo={rho:0.2}", "+exgrpo={rho:0.25,beta:0.3}",
              "exgrpo.beta=0.7", "~exgrpo.beta", "+exgrpo.new=1", "exgrpo={new:2}", "exgrpo={}", "+exgrpo.extra.x=1",
              "exgrpo.extra=null"]
    parser = ov.OverridesParser.create()
    parsed = {line: parser.parse_overrides([line])[0] for line in shapes}

    def resolved(overrides):
        config = copy.deepcopy(small)
        ConfigLoaderImpl._apply_overrides_to_config(list(overrides), config)
        return OmegaConf.to_container(config)

    compared = 0
    for layers in itertools.product(shapes, repeat=3):
        try:
            expected = resolved(parsed[line] for line in layers)
        except (ov.HydraException, ov.OmegaConfBaseException):  # hydra refuses the raw list (what merging is for)
            continue
        out = ov.merge([ov.Entry(parsed[line], f"layer {i}") for i, line in enumerate(layers)], small)
        assert resolved(parser.parse_overrides(out)) == expected, (layers, out)
        compared += 1
    assert compared > 600  # of 1331 (684 with hydra 1.3.8): not a corner of the shapes
