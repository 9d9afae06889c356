"""The product stands without the lab: no product module, script or test imports ``lab`` or opens a
file under its evidence folders, and the wheel ships the product's packages only."""

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("bridge_recipes", "perf_recipes", "scripts", "tests")
# A path into the lab's evidence, however it is spelt in code.
LAB_PATH = re.compile(r"""lab/(evidence|results)|["']lab["']\s*/|["']lab["'],\s*["'](evidence|results)""")


def _product_files() -> list[Path]:
    return [p for tree in PRODUCT for p in sorted((ROOT / tree).rglob("*.py"))]


def _lab_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "lab"]
        elif (
            isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module.split(".")[0] == "lab"
        ):
            out.append(node.module)
    return out


def _lab_paths(path: Path) -> list[str]:
    return [m.group(0) for m in LAB_PATH.finditer(path.read_text())]


def test_no_product_file_imports_the_lab_or_names_its_evidence():
    found = {
        str(p.relative_to(ROOT)): _lab_imports(p) + _lab_paths(p)
        for p in _product_files()
        if p.name != Path(__file__).name
    }
    assert {k: v for k, v in found.items() if v} == {}


def test_the_checks_see_a_lab_import_and_an_evidence_path(tmp_path):
    for text in ("from lab import report\n", "import lab.evidence\n"):
        (tmp_path / "m.py").write_text(text)
        assert _lab_imports(tmp_path / "m.py")
    for text in (
        'p = "lab/evidence/x.log"\n',
        'p = ROOT / "lab" / "results"\n',
        'p = ROOT.joinpath("lab", "results")\n',
    ):
        (tmp_path / "m.py").write_text(text)
        assert _lab_paths(tmp_path / "m.py"), text
    (tmp_path / "m.py").write_text('label = "a lab coat"\n')
    assert not _lab_imports(tmp_path / "m.py") and not _lab_paths(tmp_path / "m.py")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The wheel pip builds from the checkout (copied, so that no build folder lands in it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file() and not name.startswith(("lab/evidence/", "lab/results/")):
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp)]
    subprocess.run(cmd, check=True, capture_output=True)
    return zipfile.ZipFile(next(tmp.glob("*.whl")))


def test_the_wheel_holds_the_product_and_no_lab_module(wheel):
    """The wheel's modules are exactly the product's: every module under bridge_recipes/ and
    perf_recipes/, nothing of the lab."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "bridge_recipes", "perf_recipes"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    product = {n for n in listed.split("\0") if n.endswith(".py")}
    shipped = {n for n in wheel.namelist() if n.endswith(".py")}
    assert product and shipped == product, sorted(shipped ^ product)
    assert not any(n.startswith("lab/") for n in wheel.namelist())
    assert {"bridge_recipes/recipes/measured_figures.json", "bridge_recipes/config/keys.json"} <= set(wheel.namelist())
