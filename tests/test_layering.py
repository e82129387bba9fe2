"""Imports point downward (docs/DESIGN.md section 3): every module of captum_cw has a layer, and no module
imports, anywhere in its code (function-local and TYPE_CHECKING imports included), a captum_cw module of its
own or a higher layer. The modules of one subpackage share its layer and may import each other."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "captum_cw"

# module or subpackage -> layer; a new module must be placed here (test_every_module_has_a_layer)
LAYERS = {
    # -1: the exceptions, importable from everywhere
    "captum_cw.errors": -1,
    # 0: no captum_cw imports but the exceptions; tensors, numbers, files, models and data
    "captum_cw.arguments": 0,
    "captum_cw.files": 0,
    "captum_cw.geometry": 0,
    "captum_cw.layer_aggregation": 0,
    "captum_cw.models": 0,
    "captum_cw.positions": 0,
    "captum_cw.selection": 0,
    "captum_cw.statistics": 0,
    "captum_cw.tasks": 0,
    # 1: a model's attention, read and registered; figures, written through files
    "captum_cw.architectures": 1,
    "captum_cw.capture": 1,
    "captum_cw.exclusions": 1,
    "captum_cw.metrics": 1,
    "captum_cw.plotting": 1,
    # 2-5: one forward pass, checked, its scores and the attributors
    "captum_cw.self_check": 2,
    "captum_cw.scan": 3,
    "captum_cw.interventions": 4,
    "captum_cw.scoring": 4,
    "captum_cw.target_contributions": 4,
    "captum_cw.knockout_gradients": 5,
    "captum_cw.attribution": 5,
    # 6: what is built on the attributors
    "captum_cw.llm": 6,
    "captum_cw.sources": 6,
    "captum_cw.sinks": 6,
    "captum_cw.token_contributions": 6,
    # 7: the faithfulness evaluation, views, integrations and the package's public names
    "captum_cw": 7,
    "captum_cw.evaluation": 7,
    "captum_cw.inseq_method": 7,
    "captum_cw.views": 7,
    # 8: the command line
    "captum_cw.cli": 8,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_sources() -> dict[str, str]:
    return {module_name(path): path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))}


def entry(module: str) -> str:
    r"""The table entry a module belongs to: the top-level module or subpackage of captum_cw (or the root)."""
    return ".".join(module.split(".")[:2])


def imported_modules(module: str, source: str, modules: set[str]) -> list[tuple[int, str]]:
    r"""``(line, module)`` for every captum_cw module that ``source`` imports anywhere."""
    is_package = any(other.startswith(module + ".") for other in modules)  # an __init__.py
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package upwards
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # "from captum_cw import attribution" imports the module captum_cw.attribution
                found.append((node.lineno, f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules
                              else target))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, str(node.args[0].value)))
    return [(line, name) for line, name in found if name == "captum_cw" or name.startswith("captum_cw.")]


def violations(sources: dict[str, str]) -> list[str]:
    r"""Every import of a module of the same or a higher layer (outside the importer's own subpackage)."""
    modules = set(sources)
    found = []
    for module, source in sources.items():
        mine = entry(module)
        for line, name in imported_modules(module, source, modules):
            theirs = entry(name)
            if theirs == mine:
                continue  # within one module or subpackage
            if LAYERS[theirs] >= LAYERS[mine]:
                found.append(f"{module}:{line} imports {name} (layer {LAYERS[theirs]}), but {mine} is in layer "
                             f"{LAYERS[mine]}: imports must point to a lower layer")
    return found


def test_every_module_has_a_layer():
    entries = {entry(module) for module in package_sources()}
    missing = sorted(entries - set(LAYERS))
    assert not missing, f"place these modules in a layer of LAYERS (and docs/DESIGN.md section 3): {missing}"
    assert not set(LAYERS) - entries, f"LAYERS names modules that do not exist: {sorted(set(LAYERS) - entries)}"


def test_imports_point_downward():
    problems = violations(package_sources())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("inserted", [
    "from captum_cw.cli import main\n",  # module level
    "def f():\n    import captum_cw.evaluation.report\n",  # function-local
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from captum_cw import scan\n",  # for types only
    "from captum_cw import layer_aggregation\nfrom captum_cw import models\n",  # same layer, other module
])
def test_an_upward_import_is_caught(inserted):
    sources = package_sources()
    sources["captum_cw.geometry"] += "\n" + inserted
    problems = violations(sources)
    assert problems and all(problem.startswith("captum_cw.geometry:") for problem in problems), problems


def test_imports_are_resolved():
    sources = package_sources()
    modules = set(sources)
    found = {name for _, name in imported_modules("captum_cw.evaluation.runner", sources["captum_cw.evaluation.runner"],
                                                  modules)}
    assert {"captum_cw.evaluation.protocols", "captum_cw.models", "captum_cw.tasks"} <= found  # local import too
    relative = "from . import records\nfrom .ranking import MODES\nfrom .. import statistics\n"
    assert [name for _, name in imported_modules("captum_cw.evaluation.report", relative, modules)] == [
        "captum_cw.evaluation.records", "captum_cw.evaluation.ranking", "captum_cw.statistics"]
    assert [name for _, name in imported_modules("captum_cw.evaluation", "from .runner import evaluate\n", modules)] \
        == ["captum_cw.evaluation.runner"]
