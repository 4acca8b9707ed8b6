"""The run scripts' hydra overrides, merged layer by layer with hydra's own parser and checked before a launch.

A run script stacks overrides: the reference run, the paper profile, the script's own, the CPU profile and its
preset, then yours. Passed to hydra as one list, a key set twice with different prefixes breaks the run: the paper
profile adds ``+reward.custom_reward_function.reward_kwargs.strict_format=true`` (a key verl's yaml does not have),
and a user's ``reward.custom_reward_function.reward_kwargs.strict_format=false`` after it is refused by hydra
("Could not override ..."), or, deduplicated by hand, loses the ``+`` hydra needs. Here every override is parsed by
``hydra.core.override_parser``; for each key the last layer's value wins, and its prefix is the one hydra needs for
that key in the recipe's composed yaml: none for a key the yaml has, ``+`` for one it lacks (where a layer asked to
add it), ``++`` kept where one was written. A key no layer may set (a typo) is refused in one line that names it,
before anything starts; the merged list is then composed by hydra exactly as the entry point will compose it, so
anything else hydra would refuse is refused here too.

Used by ``run_scripts/_launch.sh``::

    python3 -m recipe.exgrpo.overrides --layer "reference run" a=1 b=2 --layer "your overrides" b=3

prints the merged overrides, each ending in a NUL byte (values may hold newlines: a chat template), and exits 2 with
``error: ...`` on one line for an override hydra would refuse.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import importlib.metadata
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
CACHE_DIR = Path(__file__).resolve().parents[2] / "cache" / "overrides"  # the repository's cache/ (not committed)
LAYER_FLAG = "--layer"
_PREFIX = {OverrideType.CHANGE: "", OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++", OverrideType.DEL: "~"}


class OverrideError(ValueError):
    """An override hydra would refuse; the message names it, the layer it came from and the fix."""


@dataclass(frozen=True)
class Entry:
    """One parsed override and the layer that gave it."""

    override: Override
    layer: str

    @property
    def text(self) -> str:
        """``key=value`` as written, without the prefix (the value's quoting kept byte for byte)."""
        line = self.override.input_line or ""
        return line[len(_PREFIX[self.override.type]):]

    @property
    def key(self) -> str:
        return self.override.key_or_group

    def describe(self) -> str:
        return f"{_shown(self.override.input_line or '')} ({self.layer})"


def _shown(text: str) -> str:
    """An override as a message shows it: on one line (a chat template's newlines written as \\n)."""
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


def _fingerprint(group_lines: Sequence[str]) -> str:
    """What the composed base config depends on: the yaml files (path, size, mtime), the group choices, versions."""
    digest = hashlib.sha256()
    for name in ("hydra-core", "omegaconf"):
        digest.update(f"{name}={importlib.metadata.version(name)}\n".encode())
    for folder in (CONFIG_DIR, Path(verl_config_dir())):
        for path in sorted(folder.rglob("*.yaml")):
            stat = path.stat()
            digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    digest.update("\0".join(group_lines).encode())
    return digest.hexdigest()[:20]


def base_config(group_lines: Sequence[str], cache_dir: Path | None = CACHE_DIR) -> DictConfig:
    """The recipe config composed with the config-group choices only: what the value overrides apply to.

    Composing costs most of a launch's check (~1 s of CPU on a small machine, for every launch and dry run), so the
    result is kept in ``cache_dir`` under a fingerprint of every yaml file it reads; a changed file, verl version or
    group choice composes afresh. ``cache_dir=None`` always composes.
    """
    path = None if cache_dir is None else cache_dir / f"base-{_fingerprint(group_lines)}.yaml"
    if path is not None and path.is_file():
        config = OmegaConf.load(path)
        OmegaConf.set_struct(config, True)  # as hydra returns it: unknown keys refused
        return config
    config = compose(group_lines)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            scratch = path.with_suffix(f".{os.getpid()}.tmp")
            OmegaConf.save(config, scratch)
            os.replace(scratch, path)  # atomic: a concurrent launch reads the old file or the new one
        except OSError:
            pass  # a read-only checkout composes every time
    return config


def parse_layers(argv: Sequence[str]) -> list[Entry]:
    """``--layer NAME override...`` groups into parsed entries, in order."""
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


def _is_group(entry: Entry, search_path: Sequence[str]) -> bool:
    """A config-group choice (``actor@actor_rollout_ref.actor=megatron_actor``): it goes to the defaults list.

    Hydra tells a group from a key by whether a folder of that name is on its search path; so does this.
    """
    if entry.override.package is not None:
        return True
    return any(Path(folder, entry.key).is_dir() for folder in search_path)


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


def merge(entries: Sequence[Entry], base: DictConfig) -> list[str]:
    """Each key once, at its first place, with its last value and the prefix hydra needs in ``base``.

    ``base`` is the recipe config composed with the config-group choices only, i.e. what plain overrides apply to.
    A key ``base`` has gets no prefix (a ``+`` on it would be refused), or ``++`` where the winning layer wrote it.
    A key ``base`` lacks gets ``+`` if any layer added it (so a later plain override of it keeps working), else it is
    a key that cannot be set: refused, with the nearest existing keys. A deletion (``~key``) wins like a value:
    the key's earlier settings and those of its children are dropped, and ``~key`` is passed on only if ``base``
    holds something to delete.
    """
    order: list[str] = []
    last: dict[str, Entry] = {}
    added: set[str] = set()
    undone: set[str] = set()  # deleted keys that an earlier layer had set (itself or below it)
    for entry in entries:
        key = entry.key
        if entry.override.is_delete():
            children = [k for k in order if k.startswith(key + ".")]
            if children or key in last:
                undone.add(key)
            for other in children:
                order.remove(other)
                last.pop(other)
        if key not in last:
            order.append(key)
        last[key] = entry
        if entry.override.type in (OverrideType.ADD, OverrideType.FORCE_ADD):
            added.add(key)
    merged = []
    for key in order:
        entry = last[key]
        kind = entry.override.type
        exists = _exists(base, key)
        if kind == OverrideType.DEL:
            if OmegaConf.select(base, key, throw_on_missing=False) is not None:
                merged.append(entry.override.input_line)
            elif not exists and key not in undone:
                raise OverrideError(f"{entry.describe()}: the config has no {key} to delete")
            continue
        if exists:
            prefix = "++" if kind == OverrideType.FORCE_ADD else ""
        elif kind == OverrideType.FORCE_ADD:
            prefix = "++"
        elif key in added:
            prefix = "+"
        else:
            near = _near(base, key)
            hint = f" (did you mean {' or '.join(near)}?)" if near else ""
            raise OverrideError(
                f"{entry.describe()}: the config has no key {key}{hint}; to add a new key, write +{entry.text}"
            )
        merged.append(prefix + entry.text)
    return merged


def check(merged: Sequence[str], base: DictConfig) -> None:
    """Apply ``merged`` to a copy of ``base`` with hydra's own routine for value overrides, which raises what a
    launch would raise (a wrong type for a typed node, a value its parser rejects).

    ``ConfigLoaderImpl._apply_overrides_to_config`` is the step of hydra's composition that applies command-line
    values to the config composed from the defaults list; calling it here instead of composing a second time saves
    a second or so per launch (tests/recipe/test_overrides.py checks the result equals a full composition).
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    config = copy.deepcopy(base)
    overrides = OverridesParser.create().parse_overrides(list(merged))
    try:
        ConfigLoaderImpl._apply_overrides_to_config(overrides, config)
    except (HydraException, OmegaConfBaseException) as error:
        raise OverrideError(f"hydra refuses the merged overrides: {_one_line(error)}") from None


def _one_line(error: BaseException) -> str:
    text = str(error)
    cause = error.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text = f"{text}: {cause}"
    return " ".join(text.split())


def merge_layers(argv: Sequence[str]) -> list[str]:
    """The merged override list of ``--layer NAME override...`` groups, checked by composing it with hydra."""
    entries = parse_layers(argv)
    search_path = (str(CONFIG_DIR), verl_config_dir())
    hydra_own, groups, values = [], [], []
    for entry in entries:  # hydra's own settings, config-group choices, config values
        if entry.key == "hydra" or entry.key.startswith("hydra."):
            hydra_own.append(entry)
        elif _is_group(entry, search_path):
            groups.append(entry)
        else:
            values.append(entry)
    group_lines = list({(e.key, e.override.package): e.override.input_line for e in groups}.values())
    try:
        base = base_config(group_lines)
    except (HydraException, OmegaConfBaseException) as error:
        raise OverrideError(f"config group choice {' '.join(group_lines)}: {_one_line(error)}") from None
    merged = merge(values, base)
    check(merged, base)
    merged = group_lines + merged
    return merged + [e.override.input_line for e in hydra_own]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        merged = merge_layers(args)
    except OverrideError as error:
        if os.environ.get("EXGRPO_DEBUG") == "1":
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2
    sys.stdout.write("".join(f"{line}\0" for line in merged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
