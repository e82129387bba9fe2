"""No module of captum_cw reaches into another's privates: no ``_name`` is imported from a captum_cw module, and no
``_name`` that captum_cw defines is read off anything but ``self`` or ``cls`` (``other_module._name``,
``self.attributor._prepare(...)``). Modules talk through public functions (docs/DESIGN.md, "Scoring")."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "captum_cw"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_privates(trees: dict[Path, ast.Module]) -> set[str]:
    r"""Every private name captum_cw defines: functions, classes, module-level names and ``self._x`` attributes."""
    names = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return {name for name in names if _private(name)}


def violations(trees: dict[Path, ast.Module]) -> list[str]:
    ours = defined_privates(trees)
    found = []
    for path, tree in trees.items():
        where = path.relative_to(PACKAGE.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("captum_cw"):
                found += [f"{where}:{node.lineno} imports {alias.name} from {node.module}"
                          for alias in node.names if _private(alias.name)]
            elif (isinstance(node, ast.Attribute) and node.attr in ours
                  and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                found.append(f"{where}:{node.lineno} reads {ast.unparse(node)}")
    return found


def package_trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_uses_anothers_privates():
    problems = violations(package_trees())
    assert not problems, "call a public function instead:\n" + "\n".join(problems)


def test_the_check_finds_each_kind_of_reach():
    trees = package_trees()
    reaching = ast.parse("from captum_cw.attribution import _count_heads\n"
                         "import captum_cw.scoring as scoring\n"
                         "scoring._reduce_heads(x, m)\n"
                         "self.attributor._refuse_outside(a, b, c)\n"
                         "self._own_helper()\n")
    found = violations({**trees, PACKAGE / "reaching.py": reaching})
    assert [line.split(" ", 1)[1] for line in found] == [
        "imports _count_heads from captum_cw.attribution", "reads scoring._reduce_heads",
        "reads self.attributor._refuse_outside"]
