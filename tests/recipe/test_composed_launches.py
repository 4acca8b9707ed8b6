"""Every launch that worked before the launch layer moved to hydra config groups composes the same final config.

The fixtures (tests/recipe/fixtures/composed/, first written by ``python tests/recipe/launches.py`` on 4da1df5, when
the layers were bash arrays merged by a parser of our own, and regenerated only where a commit changed a run on
purpose, saying so) hold each launch's resolved config, flat, as its differences
from one launch's. Here each launch is run
again as a user types it (same environment variables, same overrides after the script's name) with ``DRY_RUN=1``;
the lines it prints are composed with hydra's compose API over ``exgrpo_trainer``, exactly as printed, and compared
key by key. The CPU twins among them are the launches tests/recipe/test_cpu_verl_e2e.py makes, so this is also the
proof that those still compose their old configuration.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

from launches import (  # noqa: E402
    BASE,
    LAUNCHER,
    LAUNCHES,
    MODEL_SCRIPTS,
    compose_launch,
    flat,
    prepare_workdir,
    read_fixture,
)
from recipe_helpers import REPO  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "composed"
VENV_BIN = Path(sys.executable).parent
# One launch of each kind for the fast tier (each script's GPU paper run, both CPU precisions, the preset, the bare
# launcher, the knobs, a running cluster, users' overrides); the e2e tier composes all of them.
FAST = ("qwen2.5_math_7b_exgrpo.gpu", "qwen2.5_math_7b_grpo.cpu.fp32", "llama3.1_8b_instruct_exgrpo.gpu.recipe",
        "launcher.cpu.paper.bf16", "cpu_verl_exgrpo.recipe.fp32.learn", "qwen2.5_math_7b_exgrpo.gpu.knobs",
        "multinode", "user.dict_then_key")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("launches").resolve()
    prepare_workdir(folder, REPO)
    return folder


# Keys added to the recipe yaml since the fixtures were recorded, with the default every launch composes: a launch may
# differ from its fixture by these alone (absent before, this value now). None since the last regeneration (the CPU
# twin's 4,096-token micro-batches, entropy kept for the backward and eager attention, from step_profile.py).
ADDED_SINCE: dict[str, object] = {}


def differences(name: str, workdir: Path) -> dict[str, tuple[str, str]]:
    """``{key: (before, now)}`` for every key whose resolved value (or type) differs from the fixture, keys added
    since (:data:`ADDED_SINCE`) holding their default excepted."""
    lines, config = compose_launch(name, REPO, workdir, VENV_BIN)
    now, before = flat(config), read_fixture(name, FIXTURES)
    shown = {key: (json.dumps(before.get(key, "<absent>")), json.dumps(now.get(key, "<absent>")))
             for key in now.keys() | before.keys()}
    launch = LAUNCHES[name]
    profile = launch.env.get("EXGRPO_PROFILE", "paper" if launch.script in MODEL_SCRIPTS else "recipe")
    assert lines[0] == f"profile={profile}", lines[:3]  # the group choices are printed as hydra takes them
    on_cpu = launch.env.get("EXGRPO_DEVICE") == "cpu" or launch.script == "cpu_verl_exgrpo.sh"
    assert ("device=cpu" in lines) is on_cpu
    added = {key: ('"<absent>"', json.dumps(value)) for key, value in ADDED_SINCE.items()}
    return {key: pair for key, pair in shown.items() if pair[0] != pair[1] and added.get(key) != pair}


def test_the_fixtures_cover_every_script_and_every_launch_has_one():
    assert sorted(path.stem for path in FIXTURES.glob("*.json")) == sorted([*LAUNCHES, BASE])
    scripts = {launch.script for launch in LAUNCHES.values()}
    on_disk = {path.name for path in (REPO / "run_scripts").glob("*_exgrpo.sh")} | {
        path.name for path in (REPO / "run_scripts").glob("*_grpo.sh")}
    assert on_disk - {"cpu_tiny_exgrpo.sh"} | {LAUNCHER} == scripts  # the runner's script launches no verl


@pytest.mark.parametrize("name", FAST)
def test_a_launch_of_each_kind_composes_what_it_composed_before(name, workdir):
    assert differences(name, workdir) == {}


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(set(LAUNCHES) - set(FAST)))
def test_every_other_launch_composes_what_it_composed_before(name, workdir):
    assert differences(name, workdir) == {}
