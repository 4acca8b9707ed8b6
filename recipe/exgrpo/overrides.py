"""The run scripts' hydra arguments, checked by composing them before a launch, with a one-line error.

A run script passes hydra its config-group choices (``profile=paper``, ``device=cpu``, ...), the values that depend
on the machine, the script's own overrides and yours, in that order; hydra composes them as the entry point will, the
last value of a key winning. What hydra would refuse (a key the config lacks, a ``+`` on a key it has, a value of the
wrong type) would otherwise stop the launch after the cluster started, in a multi-line traceback; here the arguments
are composed first, and a refusal is one line naming the argument and the layer it came from (with the nearest
existing keys for a typo). hydra's own parser reads every argument (``hydra.core.override_parser``).

Used by ``run_scripts/_launch.sh``::

    python3 -m recipe.exgrpo.overrides --layer "the launcher" profile=paper a=1 --layer "your overrides" b=3

exits 0 silently, or 2 with ``error: ...`` on one line.
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

CONFIG_DIR = Path(__file__).resolve().parent / "config"
CONFIG_NAME = "exgrpo_trainer"
LAYER_FLAG = "--layer"
_PREFIX = {OverrideType.CHANGE: "", OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++", OverrideType.DEL: "~"}


class OverrideError(ValueError):
    """An argument hydra would refuse; the message names it, the layer it came from and the fix."""


@dataclass(frozen=True)
class Entry:
    """One parsed argument and the layer that gave it."""

    override: Override
    layer: str

    @property
    def line(self) -> str:
        return self.override.input_line or ""

    @property
    def key(self) -> str:
        return self.override.key_or_group

    def describe(self) -> str:
        return f"{_shown(self.line)} ({self.layer})"


def _shown(text: str) -> str:
    """An argument as a message shows it: on one line (a chat template's newlines written as \\n)."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def verl_config_dir() -> str:
    """verl's own config folder, found without importing verl.

    The recipe yaml reaches verl's configs through ``pkg://verl.trainer.config``, which imports verl and with it
    torch: ~7 s on a small machine, for every launch and every dry run. The same files through ``file://`` compose
    the same config in under a second (``tests/recipe/test_overrides.py`` compares the two).
    """
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise OverrideError(f"{sys.executable} cannot find verl: activate the environment verl is installed in")
    folder = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    if not (folder / "ppo_trainer.yaml").is_file():
        raise OverrideError(f"{folder}/ppo_trainer.yaml not found: is verl 0.9.1 installed?")
    return str(folder)


def compose(overrides: Sequence[str]) -> DictConfig:
    """The recipe config as the entry point composes it, from ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    search = f"hydra.searchpath=[file://{verl_config_dir()}]"
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name=CONFIG_NAME, overrides=[search, *overrides])


def parse_layers(argv: Sequence[str]) -> list[Entry]:
    """``--layer NAME argument...`` groups into parsed entries, in order; what hydra cannot parse is refused."""
    parser = OverridesParser.create()
    entries: list[Entry] = []
    layer = None
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == LAYER_FLAG:
            if i + 1 >= len(args):
                raise OverrideError(f"{LAYER_FLAG} needs a layer name")
            layer = args[i + 1]
            i += 2
            continue
        if layer is None:
            raise OverrideError(f"{arg!r} comes before any {LAYER_FLAG} NAME")
        if arg.startswith("-"):
            raise OverrideError(f"{arg} ({layer}): the run scripts take hydra overrides (key=value) only")
        try:
            (override,) = parser.parse_overrides([arg])
        except OverrideParseException as error:
            reason = " ".join(str(error).split("See https://")[0].split())
            raise OverrideError(f"{_shown(arg)} ({layer}): not a hydra override ({reason})") from None
        if override.is_sweep_override():
            raise OverrideError(f"{_shown(arg)} ({layer}): a sweep; the run scripts launch one run (no multirun)")
        entries.append(Entry(override, layer))
        i += 1
    return entries


def _is_group(entry: Entry) -> bool:
    """A config-group choice (``profile=paper``, ``actor@actor_rollout_ref.actor=dp_actor``): hydra tells a group
    from a key by whether a folder of that name is on its search path; so does this."""
    if entry.override.package is not None:
        return True
    return any(Path(folder, entry.key).is_dir() for folder in (str(CONFIG_DIR), verl_config_dir()))


def _exists(config: DictConfig, key: str) -> bool:
    """Whether ``key`` is a node of ``config`` (its value may be null), as a plain override needs."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(config, parent, throw_on_missing=False) if parent else config
    return isinstance(node, DictConfig) and leaf in node.keys()  # `in node` is False for a ??? (missing) value


def _near(config: DictConfig, key: str) -> list[str]:
    """Keys of ``key``'s nearest existing parent that look like it (a typo's likely meaning)."""
    parts = key.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        prefix = ".".join(parts[:depth])
        node = OmegaConf.select(config, prefix, throw_on_missing=False) if prefix else config
        if isinstance(node, DictConfig):
            names = difflib.get_close_matches(parts[depth], [str(k) for k in node.keys()], n=3, cutoff=0.6)
            return [".".join([*parts[:depth], name]) for name in names]
    return []


def _one_line(error: BaseException) -> str:
    text = str(error)
    cause = error.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text = f"{text}: {cause}"
    return " ".join(text.split())


def _refusal(entry: Entry, config: DictConfig, error: BaseException) -> OverrideError:
    """The one line for ``entry``, which hydra refused on ``config`` (the config before it)."""
    key, kind = entry.key, entry.override.type
    if kind == OverrideType.CHANGE and not _exists(config, key):
        near = _near(config, key)
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        return OverrideError(f"{entry.describe()}: the config has no key {key}{hint}; to add a new key, write "
                             f"+{_shown(entry.line)}")
    if kind == OverrideType.DEL and not _exists(config, key):
        return OverrideError(f"{entry.describe()}: the config has no {key} to delete")
    return OverrideError(f"{entry.describe()}: hydra refuses it: {_one_line(error)}")


def check(entries: Sequence[Entry]) -> None:
    """Compose ``entries`` as the entry point will; if hydra refuses, raise the one line for the first argument it
    refuses (found by applying the value overrides one by one, with hydra's own routine, to the config composed
    from the group choices)."""
    lines = [entry.line for entry in entries]
    try:
        compose(lines)
        return
    except (HydraException, OmegaConfBaseException) as error:
        composed_error = error
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    groups = [e for e in entries if not e.key.startswith("hydra.") and e.key != "hydra" and _is_group(e)]
    try:
        config = compose([e.line for e in groups])
    except (HydraException, OmegaConfBaseException) as error:
        raise OverrideError(f"config group choice {' '.join(e.describe() for e in groups)}: "
                            f"{_one_line(error)}") from None
    for entry in entries:
        if entry in groups or entry.key == "hydra" or entry.key.startswith("hydra."):
            continue
        before = copy.deepcopy(config)
        try:
            ConfigLoaderImpl._apply_overrides_to_config([entry.override], config)
        except (HydraException, OmegaConfBaseException) as error:
            raise _refusal(entry, before, error) from None
    raise OverrideError(f"hydra refuses the arguments: {_one_line(composed_error)}")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        check(parse_layers(args))
    except OverrideError as error:
        if os.environ.get("EXGRPO_DEBUG") == "1":
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
