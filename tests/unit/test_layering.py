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
SCRIPTS = sorted([*(ROOT / "scripts").glob("*.py"), *(ROOT / "scripts/gpu").glob("*.py")])
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
    assert len(modules) > 20 and ROOT / "bridge_recipes/builder.py" in modules
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
    path.write_text("from bridge_recipes import registry\nimport bridge_recipes.layout\n")
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


@pytest.mark.parametrize(
    "script", ["scripts/run_recipe.py", "scripts/compare_losses.py", "scripts/gpu/startup_breakdown.py"]
)
def test_scripts_run_from_outside_the_checkout(tmp_path, script):
    """A script runs by path from any folder: it imports the installed package, not its neighbours."""
    p = subprocess.run([sys.executable, str(ROOT / script), "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage:")
