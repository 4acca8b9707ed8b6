"""The run scripts' hydra overrides, merged layer by layer with hydra's own parser and checked before a launch.

A run script stacks overrides: the reference run, the paper profile, the script's own, the CPU profile and its
preset, then yours. Passed to hydra as one list, a key set twice with different prefixes breaks the run: the paper
profile adds ``+reward.custom_reward_function.reward_kwargs.strict_format=true`` (a key verl's yaml does not have),
and a user's ``reward.custom_reward_function.reward_kwargs.strict_format=false`` after it is refused by hydra
("Could not override ..."), or, deduplicated by hand, loses the ``+`` hydra needs. Here every override is parsed by
``hydra.core.override_parser``, and the last layer's value wins whatever shape the layers wrote it in: a dotted key
(``exgrpo.rho=0.3``) or a dict on a node above it (``exgrpo={rho:0.2}``). hydra applies overrides in order, so an
override goes only when a later one leaves nothing of it (the same key or one above it, set to anything but a dict,
which hydra merges into the node, or deleted), and overrides of overlapping keys keep the order they were written in;
each key otherwise stays at its first place. The prefix is the one hydra needs for that key at that point: none for
a key the config has, ``+`` for one it lacks (where a layer asked to add it), ``++`` kept where one was written. A key
no layer may set (a typo) is refused in one line that names it, before anything starts; the merged list is then
applied by hydra exactly as the entry point will apply it, so anything else hydra would refuse is refused here too.

Used by ``run_scripts/_launch.sh``::

    python3 -m recipe.exgrpo.overrides --layer "reference run" a=1 b=2 --layer "your overrides" b=3

prints the merged overrides, each ending in a NUL byte (values may hold newlines: a chat template), and exits 2 with
``error: ...`` on one line for an override hydra would refuse.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import heapq
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


def _below(key: str, other: str) -> bool:
    """Whether ``key`` is ``other`` or a key inside it."""
    return key == other or key.startswith(other + ".")


def _overlap(a: str, b: str) -> bool:
    """Whether two keys touch the same node (one is the other or inside it): hydra's order between them matters."""
    return _below(a, b) or _below(b, a)


def _replaces(entry: Entry) -> bool:
    """Whether applying ``entry`` leaves nothing of what earlier overrides wrote at or below its key.

    hydra merges a dict value into the node there (keys the dict does not name keep what earlier overrides set);
    any other value takes the node's place, and a deletion removes it.
    """
    return entry.override.is_delete() or not isinstance(entry.override.value(), dict)


def _kept(entries: Sequence[Entry]) -> tuple[list[tuple[int, Entry]], set[str]]:
    """The entries a later one does not wholly undo, with their places; and the keys deleted after being set."""
    kept: list[tuple[int, Entry]] = []
    undone: set[str] = set()  # deleted keys that an earlier layer had set (itself or below it)
    for index, entry in enumerate(entries):
        if _replaces(entry):
            gone = [item for item in kept if _below(item[1].key, entry.key)]
            if gone and entry.override.is_delete():
                undone.add(entry.key)
            kept = [item for item in kept if item not in gone]
        kept.append((index, entry))
    return kept, undone


def _order(kept: Sequence[tuple[int, Entry]], first: dict[str, int]) -> list[Entry]:
    """Each entry at its key's first place, except that entries of overlapping keys keep their written order.

    Overrides of disjoint keys commute in hydra, so only overlapping pairs constrain; among the entries free to go
    next, the one whose key came first goes first (a topological order of the written order's overlaps).
    """
    successors: list[list[int]] = [[] for _ in kept]
    waiting = [0] * len(kept)
    for j, (_, later) in enumerate(kept):
        for i in range(j):
            if _overlap(kept[i][1].key, later.key):
                successors[i].append(j)
                waiting[j] += 1
    ready = [(first[entry.key], index, j) for j, (index, entry) in enumerate(kept) if not waiting[j]]
    heapq.heapify(ready)
    ordered = []
    while ready:
        *_, j = heapq.heappop(ready)
        ordered.append(kept[j][1])
        for k in successors[j]:
            waiting[k] -= 1
            if not waiting[k]:
                heapq.heappush(ready, (first[kept[k][1].key], kept[k][0], k))
    return ordered


def merge(entries: Sequence[Entry], base: DictConfig) -> list[str]:
    """The overrides hydra needs to end with each layer's settings applied in order, the last layer's winning.

    ``base`` is the recipe config composed with the config-group choices only, i.e. what plain overrides apply to.
    An override goes when a later one wholly undoes it (:func:`_replaces`); overrides of overlapping keys keep their
    written order, so a dotted key after a dict on a node above it wins, and the other way round (:func:`_order`).
    The merged overrides are applied to a copy of ``base`` one by one with hydra's own routine, so that each gets the
    prefix hydra needs at its place. A key the config has by then gets none, or the ``++`` the layer wrote, or its
    ``+`` before a dict or a list (hydra takes those on an existing key, and lets the dict add keys the node lacks).
    A key it lacks gets ``+`` if any layer added it or a key inside it, or if ``base`` had it (a later layer's
    setting of a node an earlier one deleted); else it is a key that cannot be set: refused, with the nearest existing
    keys. A deletion (``~key``) is passed on only if there is something to delete. What hydra refuses is refused in
    one line naming the override and its layer.
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    first: dict[str, int] = {}
    added: set[str] = set()
    for index, entry in enumerate(entries):
        first.setdefault(entry.key, index)
        if entry.override.type in (OverrideType.ADD, OverrideType.FORCE_ADD):
            added.add(entry.key)
    kept, undone = _kept(entries)
    kinds = {prefix: kind for kind, prefix in _PREFIX.items()}
    config = copy.deepcopy(base)  # the config as hydra has it after the overrides merged so far
    merged = []
    for entry in _order(kept, first):
        prefix = _prefix(entry, config, base, added, undone)
        if prefix is None:
            continue
        line = entry.override.input_line if entry.override.is_delete() else prefix + entry.text
        override = dataclasses.replace(entry.override, type=kinds[prefix], input_line=line)  # as hydra parses it
        try:
            ConfigLoaderImpl._apply_overrides_to_config([override], config)
        except (HydraException, OmegaConfBaseException) as error:
            raise OverrideError(f"{entry.describe()}: hydra refuses it: {_one_line(error)}") from None
        merged.append(line)
    return merged


def _prefix(entry: Entry, config: DictConfig, base: DictConfig, added: set[str], undone: set[str]) -> str | None:
    """The prefix hydra needs for ``entry`` on ``config`` (None: a deletion with nothing left to delete)."""
    key, kind = entry.key, entry.override.type
    exists = _exists(config, key)
    if kind == OverrideType.DEL:
        if OmegaConf.select(config, key, throw_on_missing=False) is not None:
            return _PREFIX[kind]
        if exists or key in undone or _exists(base, key):
            return None
        raise OverrideError(f"{entry.describe()}: the config has no {key} to delete")
    if exists and kind == OverrideType.ADD and isinstance(entry.override.value(), dict | list):
        prefix = "+"  # hydra takes this + (on a dict it also lets the merge add keys the node lacks)
    elif exists:
        prefix = "++" if kind == OverrideType.FORCE_ADD else ""
    elif kind == OverrideType.FORCE_ADD:
        prefix = "++"
    elif any(_below(other, key) for other in added) or _exists(base, key):
        prefix = "+"  # a layer added it, or a key inside it (which hydra would have created it for)
    else:
        near = _near(base, key)
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        raise OverrideError(
            f"{entry.describe()}: the config has no key {key}{hint}; to add a new key, write +{entry.text}"
        )
    return prefix


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
