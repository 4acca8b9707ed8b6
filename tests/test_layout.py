"""The direction of imports between the project's parts, stated once and checked on every file.

The algorithm imports nothing of the rest, so it can be read, tested and reused alone; the verifier stands alone
too (verl loads it by file path, its workers start from it); the recipe, the embedded CPU mode and the tools build
on the algorithm; the preprocessors call the package, never the reverse. Lazy imports inside functions count.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("exgrpo", "recipe", "data_preprocess")

# part -> the parts it may import (besides itself)
ALLOWED = {
    "exgrpo.algorithm": set(),
    "exgrpo.verifier": set(),
    "exgrpo.cli": set(),
    "exgrpo.precision": set(),  # which float precision a CPU run uses: the launchers ask it, nothing imports it yet
    "exgrpo.progress": set(),  # tqdm on a terminal, a few lines in a log
    "exgrpo.embedded": {"exgrpo.algorithm", "exgrpo.verifier", "exgrpo.cli", "exgrpo.progress"},
    "exgrpo.tools": {"exgrpo.algorithm", "exgrpo.verifier", "exgrpo.cli", "exgrpo.progress"},
    "exgrpo.reward": {"exgrpo.verifier"},  # verl's reward path, kept
    "exgrpo.inspect_pool": {"exgrpo.tools"},  # the command users type, kept
    "exgrpo": set(),
    "recipe": {"exgrpo.algorithm", "exgrpo.verifier", "exgrpo.cli"},
    "data_preprocess": {"exgrpo.algorithm", "exgrpo.verifier", "exgrpo.cli", "exgrpo.embedded", "exgrpo.tools"},
}


def part_of(module: str) -> str:
    """The longest part name that ``module`` is or lies inside."""
    for part in sorted(ALLOWED, key=len, reverse=True):
        if module == part or module.startswith(part + "."):
            return part
    raise KeyError(f"{module} belongs to no part of the layout: add it to ALLOWED")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def first_party_imports(source: str, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every first-party import in ``source``, wherever it sits."""
    found = []
    package = module if module.count(".") == 0 else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from exgrpo import cli`` imports the submodule exgrpo.cli
            names = [f"{base}.{alias.name}" if base in ("exgrpo", "exgrpo.verifier", "exgrpo.algorithm",
                                                         "exgrpo.embedded", "exgrpo.tools", "data_preprocess")
                     else base for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in FIRST_PARTY]
    return found


def back_edges(source: str, module: str) -> list[str]:
    importer = part_of(module)
    edges = []
    for line, imported in first_party_imports(source, module):
        target = part_of(imported) if imported not in ("exgrpo",) else "exgrpo"
        if target != importer and target not in ALLOWED[importer]:
            edges.append(f"{module}:{line} imports {imported} ({importer} may not import {target})")
    return edges


def project_files() -> list[Path]:
    return sorted(path for top in FIRST_PARTY for path in (REPO / top).rglob("*.py"))


def test_every_import_between_parts_goes_the_allowed_way():
    edges = [edge for path in project_files() for edge in back_edges(path.read_text(), module_name(path))]
    assert edges == []


def test_the_check_sees_a_back_edge_wherever_it_is_written():
    lazy = "def f():\n    from recipe.exgrpo.trainer import ExGRPOTrainer\n"
    assert back_edges(lazy, "exgrpo.algorithm.pool") == [
        "exgrpo.algorithm.pool:2 imports recipe.exgrpo.trainer (exgrpo.algorithm may not import recipe)"]
    assert back_edges("from exgrpo import runner_helpers\n", "exgrpo.algorithm.pool") == [
        "exgrpo.algorithm.pool:1 imports exgrpo.runner_helpers (exgrpo.algorithm may not import exgrpo)"]
    assert back_edges("from ..embedded import runner\n", "exgrpo.algorithm.pool") == [
        "exgrpo.algorithm.pool:1 imports exgrpo.embedded.runner (exgrpo.algorithm may not import exgrpo.embedded)"]
    assert back_edges("import data_preprocess.common\n", "exgrpo.embedded.task") != []
    assert back_edges("from exgrpo.algorithm.pool import ExperiencePool\n", "recipe.exgrpo.trainer") == []


def test_every_project_file_belongs_to_a_part():
    for path in project_files():
        part_of(module_name(path))


def test_the_verifier_imports_only_the_standard_library_when_loaded():
    """Its workers start from it, and verl loads it in every reward process: nothing heavy at import time."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for path in sorted((REPO / "exgrpo" / "verifier").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: lazy imports inside functions run in the worker
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            outside = [n for n in names if n.split(".")[0] not in stdlib and not n.startswith("exgrpo.verifier")]
            assert outside == [], f"{path.name}:{node.lineno} imports {outside} at module level"


@pytest.mark.parametrize("part", ["exgrpo.algorithm", "exgrpo.verifier"])
def test_a_part_that_stands_alone_imports_in_a_fresh_interpreter_without_the_rest(part):
    """Importing the part loads no other part of the project (and neither verl nor Ray)."""
    import subprocess

    code = (f"import sys, {part}\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('exgrpo', 'recipe', 'data_preprocess',"
            " 'verl', 'ray'))\n"
            "print('\\n'.join(loaded))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert [m for m in loaded if m != "exgrpo" and part_of(m) != part] == []


def test_nothing_in_the_package_imports_verl_or_ray():
    """The package is what a laptop user installs: only the recipe (``recipe/``) may need verl and Ray."""
    found = []
    for path in sorted((REPO / "exgrpo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names if n.split(".")[0] in ("verl", "ray")]
    assert found == []


VERIFIER = REPO / "exgrpo" / "verifier"
VERIFIER_MODULES = sorted(module_name(path) for path in VERIFIER.glob("*.py") if path.stem != "__main__")


def verifier_import_graph() -> dict[str, set[str]]:
    """module -> the verifier modules it imports, lazy imports included (``__main__`` runs the pool: left out)."""
    graph = {}
    for path in sorted(VERIFIER.glob("*.py")):
        module = module_name(path)
        if path.stem != "__main__":
            graph[module] = {name for _, name in first_party_imports(path.read_text(), module)
                             if name in VERIFIER_MODULES and name != module}
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` as the modules along it (first repeated at the end), or [] if there is none."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once all it reaches is explored

    def visit(module: str, path: list[str]) -> list[str]:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":  # back on the current path: the cycle is the path since target
                chain = [*path, module]
                return chain[chain.index(target):] + [target]
            if target not in state:
                found = visit(target, [*path, module])
                if found:
                    return found
        state[module] = "done"
        return []

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [])
            if found:
                return found
    return []


def test_the_cycle_check_finds_a_cycle_through_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycle(graph) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    lazy = "def serve():\n    from exgrpo.verifier.boxed import boxed_score\n"
    assert {name for _, name in first_party_imports(lazy, "exgrpo.verifier.workers")} == {"exgrpo.verifier.boxed"}


def test_the_verifier_modules_import_one_another_without_a_cycle():
    """The authors' grader once took its brace scanner from ours, which imports the worker pool, which loads the
    authors' grader: what both use lives in the leaf module ``shared`` instead."""
    graph = verifier_import_graph()
    assert import_cycle(graph) == []
    assert graph["exgrpo.verifier.boxed"] == {"exgrpo.verifier.shared"}
    users = {module for module, targets in graph.items() if "exgrpo.verifier.shared" in targets}
    assert {"exgrpo.verifier.boxed", "exgrpo.verifier.grading", "exgrpo.verifier.graded",
            "exgrpo.verifier.workers"} <= users


def test_the_shared_verifier_module_is_a_leaf():
    """It imports nothing of the project, not even lazily: any verifier module may import it at any point."""
    source = (VERIFIER / "shared.py").read_text()
    assert first_party_imports(source, "exgrpo.verifier.shared") == []
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    imported = [alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
                for alias in node.names]
    imported += [node.module or "" for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)]
    assert [name for name in imported if name.split(".")[0] not in stdlib] == []


@pytest.mark.parametrize("first", VERIFIER_MODULES)
def test_each_verifier_module_imports_first_and_alone_in_a_fresh_interpreter(first):
    """Whichever verifier module a process imports first (verl loads one by path, the workers start from another),
    it imports with only the standard library beside it, and every other one imports after it."""
    import subprocess

    others = [m for m in VERIFIER_MODULES if m != first]
    code = ("import importlib, sys\n"
            "before = set(sys.modules)\n"
            f"importlib.import_module({first!r})\n"
            "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))\n"
            f"for name in {others!r}:\n"
            "    importlib.import_module(name)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    stdlib = set(sys.stdlib_module_names)
    assert [m for m in done.stdout.split() if m not in stdlib and m != "exgrpo"] == []
