"""The library's layers run one way: the library never imports the runner (the command line),
scripts import the installed package, and tests use the library, not scripts or other tests."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY_TREES = ("bridge_recipes", "perf_recipes")
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
TESTS = sorted((ROOT / "tests").rglob("*.py"))


def _imports(path: Path) -> list[str]:
    """Every module an ``import`` or ``from ... import`` in ``path`` names, with each imported
    name of a ``from`` import as a submodule candidate (``from a import b`` gives a and a.b)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


def _library_modules() -> list[Path]:
    return [
        p
        for tree in LIBRARY_TREES
        for p in sorted((ROOT / tree).rglob("*.py"))
        if "runner" not in p.relative_to(ROOT / tree).parts
    ]


def _is_runner(module: str) -> bool:
    return module == "bridge_recipes.runner" or module.startswith("bridge_recipes.runner.")


def test_library_modules_never_import_the_runner():
    modules = _library_modules()
    assert len(modules) > 20 and ROOT / "bridge_recipes/config/builder.py" in modules
    offenders = {str(p.relative_to(ROOT)): m for p in modules for m in _imports(p) if _is_runner(m)}
    assert offenders == {}, "library modules import bridge_recipes.runner: move what they need into the library"


def test_the_check_sees_a_runner_import(tmp_path):
    """The walk above finds each spelling of an import of the runner."""
    for line in (
        "from bridge_recipes.runner.checks import check",
        "from bridge_recipes.runner import cli",
        "from bridge_recipes import runner",
        "import bridge_recipes.runner.launch",
        "def f():\n    from bridge_recipes.runner import launch",
    ):
        path = tmp_path / "m.py"
        path.write_text(line + "\n")
        assert any(_is_runner(m) for m in _imports(path)), line
    path.write_text("from bridge_recipes.recipes import registry\nimport bridge_recipes.plan.layout\n")
    assert not any(_is_runner(m) for m in _imports(path))


def test_importing_the_package_imports_neither_torch_nor_megatron():
    code = (
        "import sys, json, bridge_recipes\n"
        "bridge_recipes.build, bridge_recipes.runner_args\n"
        "print(json.dumps(sorted(m for m in ('torch', 'megatron', 'transformer_engine') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def _touches_sys_path(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            return True
    return False


def test_scripts_do_not_change_sys_path():
    assert len(SCRIPTS) >= 8
    offenders = [str(p.relative_to(ROOT)) for p in SCRIPTS if _touches_sys_path(p)]
    assert offenders == [], "scripts import the installed package (pip install -e .): no sys.path changes"


def _loads_a_module_from_a_file(path: Path) -> bool:
    names = {"spec_from_file_location", "SourceFileLoader", "run_path", "load_source"}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr in names:
            return True
        if isinstance(node, ast.Name) and node.id in names:
            return True
        if isinstance(node, ast.ImportFrom) and any(a.name in names for a in node.names):
            return True
    return False


def test_tests_use_the_library_not_scripts_or_other_tests():
    assert len(TESTS) > 20
    imports_tests = {
        str(p.relative_to(ROOT)): m for p in TESTS for m in _imports(p) if m == "tests" or m.startswith("tests.")
    }
    assert imports_tests == {}, "tests import other tests: move shared code into the library or a fixture"
    loads_files = [str(p.relative_to(ROOT)) for p in TESTS if _loads_a_module_from_a_file(p)]
    assert loads_files == [], "tests load files as modules: call the library, or run the script as a process"


@pytest.mark.parametrize("tool", ["sys.path.insert(0, 'x')", "from importlib.util import spec_from_file_location"])
def test_the_checks_see_path_changes_and_file_loading(tmp_path, tool):
    path = tmp_path / "m.py"
    path.write_text(f"import sys\n{tool}\n")
    assert _touches_sys_path(path) or _loads_a_module_from_a_file(path)
    path.write_text("import sys\nsys.exit(0)\n")
    assert not _touches_sys_path(path) and not _loads_a_module_from_a_file(path)


@pytest.mark.parametrize("script", ["scripts/run_recipe.py", "scripts/compare_losses.py", "scripts/inspect_rows.py"])
def test_scripts_run_from_outside_the_checkout(tmp_path, script):
    """A script runs by path from any folder: it imports the installed package, not its neighbours."""
    p = subprocess.run([sys.executable, str(ROOT / script), "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage:")


# --- packages import one way ---------------------------------------------------------------------
# A unit is a subpackage of bridge_recipes (bench, plan, logs, hf, ...) or one of its top-level modules.
# The floors: what each unit may import from the library, besides itself. A unit imports only units
# listed below it here, so the list reads bottom-up: helpers and hardware facts, the model and what
# changes how it runs, the data, the training process's pieces, the recipes, the Hugging Face road,
# a run's config, and the command line and the tools above all of them.
FLOORS = {
    "utils": set(),
    "models": set(),
    "hardware": {"utils"},
    "patches": set(),
    "logs": {"models", "hardware"},
    # the plan reads the run's features from the config it is given, never from their modules
    "plan": {"models", "hardware"},
    "features": {"hardware", "models", "patches", "plan"},
    # conversations and their rendering below the rows built from them, both below image datasets
    "chat": {"utils", "patches"},
    "data": {"chat", "models", "utils"},
    "vl": {"chat", "data", "utils"},
    "training": {"data", "utils"},
    "recipe_config": {"features", "utils"},
    "recipes": {"data", "features", "hardware", "models", "plan", "recipe_config"},
    "hf": {"data", "hardware", "models", "recipes", "training", "utils", "vl"},
    "config": {"data", "features", "hardware", "hf", "models", "recipe_config", "recipes", "utils"},
    "evaluate": {"chat", "data", "hf", "utils"},
    "bench": {"config", "data", "features", "hardware", "logs", "models", "plan", "recipes", "utils"},
    "runner": {
        "config",
        "data",
        "features",
        "hardware",
        "hf",
        "models",
        "patches",
        "plan",
        "recipes",
        "training",
        "utils",
        "vl",
    },
}
RECIPE_DEFINITIONS = ("bridge_recipes.recipes.qwen", "bridge_recipes.recipes.qwen_vl", "perf_recipes")


def _unit(module: str, root: Path) -> str | None:
    parts = module.split(".")
    if parts[0] != "bridge_recipes" or len(parts) < 2:
        return None
    if (root / parts[1] / "__init__.py").is_file() or (root / f"{parts[1]}.py").is_file():
        return parts[1]
    return None


def _unit_graph(root: Path) -> dict[str, set[str]]:
    """unit -> the units its modules import (at module level or inside functions)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        src = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if src == "__init__":
            continue
        for m in _imports(path):
            unit = _unit(m, root)
            if unit and unit != src:
                graph.setdefault(src, set()).add(unit)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one unit (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_packages():
    graph = _unit_graph(ROOT / "bridge_recipes")
    assert {"bench", "plan", "logs", "hf", "runner"} <= set(graph)
    assert _cycles(graph) == []


def test_every_unit_has_its_floor():
    """A new package or root module states what it may import: the floors list every unit."""
    units = {p.stem for p in (ROOT / "bridge_recipes").iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert units - {"__init__"} == set(FLOORS)


@pytest.mark.parametrize("unit", sorted(FLOORS))
def test_units_import_nothing_above_their_floor(unit):
    above = _unit_graph(ROOT / "bridge_recipes").get(unit, set()) - FLOORS[unit]
    assert above == set(), f"bridge_recipes.{unit} imports {sorted(above)}"


def _is_definition(module: str) -> bool:
    return any(module == d or module.startswith(d + ".") for d in RECIPE_DEFINITIONS)


def test_the_library_reaches_recipe_definitions_through_the_registry():
    offenders = {}
    for path in _library_modules():
        if path.is_relative_to(ROOT / "bridge_recipes/recipes") or path.is_relative_to(ROOT / "perf_recipes"):
            continue
        bad = [m for m in _imports(path) if _is_definition(m)]
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}, (
        "import recipes through bridge_recipes.recipes.registry; move shared facts below the recipes"
    )


def _script_paths(path: Path) -> list[str]:
    """Strings of ``path`` that name a file under scripts/ or build a path into it (docstrings aside)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value.startswith("scripts/") and node.value.endswith((".py", ".sh")):
                out.append(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant):
            if node.right.value == "scripts":  # ROOT / "scripts" / ...
                out.append(node.right.value)
    return out


def test_the_library_starts_its_own_entry_points_not_scripts_by_path():
    offenders = {str(p.relative_to(ROOT)): s for p in _library_modules() if (s := _script_paths(p))}
    assert offenders == {}, "start the package's own entry point: python -m bridge_recipes..."


def test_module_names_do_not_reuse_a_package_name():
    """A module named like another package of the library (hf/runner.py beside runner/) says two things."""
    packages = {p.name for p in (ROOT / "bridge_recipes").iterdir() if (p / "__init__.py").is_file()}
    clashes = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "bridge_recipes").rglob("*.py")
        if p.stem in packages and p.parent.name != p.stem
    ]
    assert clashes == []


def test_the_layer_checks_see_a_cycle_a_recipe_import_and_a_script_path(tmp_path):
    root = tmp_path / "bridge_recipes"
    for pkg, body in {
        "plan": "from bridge_recipes.bench import x\n",
        "bench": "from bridge_recipes.plan import y\nfrom bridge_recipes.recipes.qwen.policy import Z\n",
        "recipes": "",
    }.items():
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
        (root / pkg / "m.py").write_text(body)
    graph = _unit_graph(root)
    assert _cycles(graph) == [["bench", "plan"]]
    assert graph["bench"] == {"plan", "recipes"}
    assert _is_definition("bridge_recipes.recipes.qwen.policy") and not _is_definition(
        "bridge_recipes.recipes.registry"
    )
    script = tmp_path / "s.py"
    script.write_text('"""Runs scripts/run_recipe.py."""\nimport subprocess\nsubprocess.run(["scripts/x.py"])\n')
    assert _script_paths(script) == ["scripts/x.py"]
    script.write_text('ROOT = 1\nCMD = ROOT / "scripts" / "run_recipe.py"\nFOLDERS = ("scripts", "tests")\n')
    assert _script_paths(script) == ["scripts"]


# --- modules import one way ----------------------------------------------------------------------
def _module_imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that the module ``name`` (at ``path``) imports, at module level or
    inside functions: ``from a import b`` names a.b when that is a module, else a; a relative import
    is resolved against the module's package; an imported name that is no module gives its nearest
    enclosing module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _module_graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules of the package at ``root`` it imports (see :func:`_module_imports`)."""
    paths = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {name: _module_imports(path, name, set(paths)) for name, path in paths.items()}


def test_no_import_cycle_between_modules():
    """No two modules import each other, directly or around a loop, even from inside a function: the
    piece both need belongs in a module below them."""
    graph = _module_graph(ROOT / "bridge_recipes")
    assert "bridge_recipes.chat.errors" in graph["bridge_recipes.chat.conversations"]
    assert _cycles(graph) == []


def test_the_module_check_sees_a_cycle_through_a_function_or_a_relative_import(tmp_path):
    root = tmp_path / "bridge_recipes"
    (root / "data").mkdir(parents=True)
    for name, body in {
        "__init__.py": "",
        "data/__init__.py": "",
        "data/a.py": "def f():\n    from bridge_recipes.data import b\n",
        "data/b.py": "from .c import X\n",
        "data/c.py": "import bridge_recipes.data.a\n",
        "data/d.py": "from bridge_recipes.data.a import f\nfrom numpy import array\n",
    }.items():
        (root / name).write_text(body)
    graph = _module_graph(root)
    assert graph["bridge_recipes.data.d"] == {"bridge_recipes.data.a"}
    assert _cycles(graph) == [["bridge_recipes.data.a", "bridge_recipes.data.b", "bridge_recipes.data.c"]]
    (root / "data/c.py").write_text("import numpy\n")
    assert _cycles(_module_graph(root)) == []


def _lines(paths) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def test_no_package_holds_more_than_15_percent_of_the_product():
    """A package that outgrows its neighbours is doing several jobs: each subpackage of the library
    holds at most 15% of the product's lines."""
    total = _lines([*(ROOT / "bridge_recipes").rglob("*.py"), *(ROOT / "perf_recipes").rglob("*.py")])
    shares = {
        p.name: _lines(p.rglob("*.py")) / total
        for p in (ROOT / "bridge_recipes").iterdir()
        if (p / "__init__.py").is_file()
    }
    assert len(shares) > 5 and {k: round(v, 3) for k, v in shares.items() if v > 0.15} == {}


def test_the_readme_names_where_a_recipe_function_is_imported_from():
    """The README's import of a recipe function is the module the registry finds it in, and it imports."""
    import importlib
    import re

    from bridge_recipes.recipes import registry

    found = re.search(r"`from (bridge_recipes\.recipes\.[\w.]+) import (\w+)`", (ROOT / "README.md").read_text())
    assert found, "README.md shows no import of a recipe function"
    module, name = found.groups()
    assert registry.find(name).module == module
    assert callable(getattr(importlib.import_module(module), name))


FILE_LINES = 550  # about 500: a file past it is doing several jobs


def _is_table(path: Path) -> bool:
    """A recipe definitions module (one GPU's recipes, each a flat list of field assignments) reads as a table."""
    rel = path.relative_to(ROOT).parts
    return rel[:2] == ("bridge_recipes", "recipes") and rel[2].startswith("qwen") and len(rel) == 5


def test_no_product_file_is_over_about_500_lines():
    files = [p for tree in (*LIBRARY_TREES, "scripts") for p in sorted((ROOT / tree).rglob("*.py"))]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := _lines([p])) > FILE_LINES and not _is_table(p)}
    assert long == {}, "split these by what each part does"
    assert _is_table(ROOT / "bridge_recipes/recipes/qwen/h200/qwen35.py")
    assert not _is_table(ROOT / "bridge_recipes/recipes/qwen/policy.py")
