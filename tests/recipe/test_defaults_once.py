"""Each default once: the ``exgrpo:`` section's defaults and help live in the dataclasses (``ExGRPOConfig`` in
exgrpo/algorithm/config.py, ``RecipeSettings`` in recipe/exgrpo/settings.py). The recipe yaml restates the keys only
because hydra needs them to take ``exgrpo.rho=0.3`` as an override; these tests hold every restated value to the
dataclasses, keep the embedded CPU configs and the launch layer from restating them, and keep the profiles to the
values that differ from them (a profile writing a default would be a second copy of it)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from recipe_helpers import REPO, compose_config  # noqa: E402

from exgrpo.algorithm.config import ExGRPOConfig  # noqa: E402
from exgrpo.embedded.runner import load_config  # noqa: E402
from recipe.exgrpo.settings import RecipeSettings, load_settings  # noqa: E402

CONFIG = REPO / "recipe" / "exgrpo" / "config"
FIELDS = [*dataclasses.fields(ExGRPOConfig), *dataclasses.fields(RecipeSettings)]
DEFAULTS = {f.name: f.default for f in FIELDS}


def test_the_recipe_yaml_holds_exactly_the_dataclasses_keys_at_their_defaults():
    section = yaml.safe_load((CONFIG / "exgrpo_trainer.yaml").read_text())["exgrpo"]
    assert list(section) == [f.name for f in FIELDS]  # every key, in the dataclasses' order, nothing else
    for name, value in section.items():
        if name == "n_rollouts":  # tied to the rollout count, which the yaml sets to the default K
            assert value == "${actor_rollout_ref.rollout.n}"
            continue
        assert value == DEFAULTS[name] and type(value) is type(DEFAULTS[name]), name
    composed = compose_config([])
    core, recipe = load_settings(composed)
    assert core == ExGRPOConfig() and recipe == RecipeSettings()


def test_every_field_has_help_and_the_yaml_does_not_repeat_it():
    for f in FIELDS:
        assert len(f.metadata.get("help", "")) > 20, f.name
    text = (CONFIG / "exgrpo_trainer.yaml").read_text()
    section = text[text.index("\nexgrpo:"):]
    for f in FIELDS:  # a key's line carries no description of its own (the help is the dataclass's)
        line = next(line for line in section.splitlines() if line.strip().startswith(f"{f.name}:"))
        assert "#" not in line or f.name == "n_rollouts", line


@pytest.mark.parametrize("name", ["cpu_tiny.yaml", "cpu_twin.yaml"])
def test_the_embedded_configs_take_the_defaults_from_the_dataclass(name):
    path = REPO / "exgrpo" / "embedded" / "configs" / name
    assert not yaml.safe_load(path.read_text())["exgrpo"]  # nothing restated
    assert load_config(path).exgrpo == ExGRPOConfig()
    assert load_config(path, ["exgrpo.rho=0.25"]).exgrpo.rho == 0.25  # still a knob


def _profile_values(path) -> dict:
    values = yaml.safe_load(path.read_text()) or {}
    values.pop("defaults", None)
    return values


@pytest.mark.parametrize("path", sorted(CONFIG.glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_config_group_sets_only_exgrpo_values_that_differ_from_the_defaults(path):
    section = _profile_values(path).get("exgrpo", {}) or {}
    assert set(section) <= set(DEFAULTS), sorted(set(section) - set(DEFAULTS))
    for name, value in section.items():
        assert value != DEFAULTS[name], f"{path.name} restates exgrpo.{name}={value!r}, the default"


def test_the_launch_layer_restates_no_exgrpo_default():
    """No run script passes an ``exgrpo.<key>=<default>`` (rho=0.5 was written in five places)."""
    pattern = re.compile(r"exgrpo\.([a-z_]+)=([^\s\"']+)")
    for path in sorted((REPO / "run_scripts").glob("*.sh")):
        for key, raw in pattern.findall(path.read_text()):
            if key in DEFAULTS:
                assert yaml.safe_load(raw) != DEFAULTS[key], f"{path.name} restates exgrpo.{key}={raw}"


def test_the_paper_profile_differs_from_the_defaults_exactly_where_the_authors_did():
    """The profile's exgrpo values, composed, are the dataclass's defaults except the authors' switches."""
    paper = OmegaConf.to_container(compose_config(["profile=paper"]).exgrpo, resolve=True)
    changed = {k for k, v in paper.items() if k != "n_rollouts" and v != DEFAULTS[k]}
    assert changed == {"clip_fresh_after_start", "loss_horizon", "entropy_agg", "skip_step_grad_norm",
                       "retire_before_start", "collect_on_start_step", "rebucket_unsolved", "max_per_question"}
