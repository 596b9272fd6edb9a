"""The lint checks of the package layering fail on a bad import, and pass on this tree.

Each test copies the four packages' ``pyproject.toml`` and ``src/`` to a temporary folder,
changes one thing, and runs what ``nox -s lint`` runs: ``lint-imports`` with the root
pyproject's contract (devices <- jacobian <- solver <- trainer) against the copy, and
``tools/check_siblings.py`` (declared siblings match the imports).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core-devices", "core-jacobian", "core-solver", "trainer")
CONTRACT = "layers: devices <- jacobian <- solver <- trainer"


def _copy_packages(target: Path) -> Path:
    """The packages' pyproject.toml and src/ under ``target/packages``."""
    for folder in PACKAGES:
        shutil.copytree(
            ROOT / "packages" / folder / "src",
            target / "packages" / folder / "src",
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
        )
        shutil.copy(ROOT / "packages" / folder / "pyproject.toml", target / "packages" / folder)
    return target


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    program = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if program is None:
        pytest.fail(
            "lint-imports (import-linter) is not installed beside this Python. "
            "HINT: pip install -c constraints/tools.txt import-linter (nox installs it)"
        )
    # The copies come first on the path, so marquardt.<pkg> resolves to them, not to the
    # installed packages.
    sources = [str(tree / "packages" / f / "src") for f in PACKAGES]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sources)}
    return subprocess.run(
        [program, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _check_siblings(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_siblings.py"), str(tree)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _module(tree: Path, folder: str, name: str) -> Path:
    package = folder.split("-")[-1]
    return tree / "packages" / folder / "src" / "marquardt" / package / name


def test_contract_names_every_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = [c["layers"] for c in contracts if c["name"] == CONTRACT]
    assert layers == [
        ["marquardt.trainer", "marquardt.solver", "marquardt.jacobian", "marquardt.devices"]
    ]


def test_this_tree_keeps_the_layers(tmp_path: Path) -> None:
    done = _lint_imports(_copy_packages(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{CONTRACT} KEPT" in done.stdout


def test_devices_importing_trainer_breaks_the_layers(tmp_path: Path) -> None:
    tree = _copy_packages(tmp_path)
    errors = _module(tree, "core-devices", "_errors.py")
    errors.write_text(errors.read_text(encoding="utf-8") + "\nimport marquardt.trainer\n")
    done = _lint_imports(tree)
    assert done.returncode != 0, done.stdout
    assert f"{CONTRACT} BROKEN" in done.stdout
    assert "marquardt.devices._errors -> marquardt.trainer" in done.stdout


def test_an_import_inside_a_function_breaks_the_layers_too(tmp_path: Path) -> None:
    tree = _copy_packages(tmp_path)
    errors = _module(tree, "core-jacobian", "_errors.py")
    lazy = "\n\ndef _late():\n    from marquardt.solver import LMA\n\n    return LMA\n"
    errors.write_text(errors.read_text(encoding="utf-8") + lazy)
    done = _lint_imports(tree)
    assert done.returncode != 0, done.stdout
    assert f"{CONTRACT} BROKEN" in done.stdout
    assert "marquardt.jacobian._errors -> marquardt.solver" in done.stdout


def test_this_tree_declares_the_siblings_it_imports(tmp_path: Path) -> None:
    done = _check_siblings(_copy_packages(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 packages, 0 problems" in done.stdout


def test_a_declared_sibling_never_imported_fails(tmp_path: Path) -> None:
    tree = _copy_packages(tmp_path)
    pyproject = tree / "packages" / "core-jacobian" / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    declared = 'dependencies = ["torch>=2.2", "marquardt-devices>=0.2,<0.3"]'
    assert declared in text
    text = text.replace(declared, declared.replace("]", ', "marquardt-solver"]'))
    pyproject.write_text(text, encoding="utf-8")
    done = _check_siblings(tree)
    assert done.returncode == 1, done.stdout
    assert "marquardt-jacobian declares marquardt-solver but never imports" in done.stdout


def test_an_undeclared_sibling_import_fails(tmp_path: Path) -> None:
    tree = _copy_packages(tmp_path)
    errors = _module(tree, "core-devices", "_errors.py")
    errors.write_text(errors.read_text(encoding="utf-8") + "\nimport marquardt.jacobian\n")
    done = _check_siblings(tree)
    assert done.returncode == 1, done.stdout
    assert "marquardt-devices imports marquardt.jacobian without declaring" in done.stdout


def test_a_required_sibling_imported_inside_a_function_fails(tmp_path: Path) -> None:
    tree = _copy_packages(tmp_path)
    module = _module(tree, "trainer", "_errors.py")
    lazy = "\n\ndef _late():\n    import marquardt.devices\n\n    return marquardt.devices\n"
    module.write_text(module.read_text(encoding="utf-8") + lazy)
    done = _check_siblings(tree)
    assert done.returncode == 1, done.stdout
    assert "marquardt-devices is a dependency of marquardt-trainer but is imported inside" in (
        done.stdout
    )


def test_a_sibling_of_an_extra_imported_at_module_top_fails(tmp_path: Path) -> None:
    tree = _copy_packages(tmp_path)
    module = _module(tree, "trainer", "_errors.py")
    module.write_text(module.read_text(encoding="utf-8") + "\nimport marquardt.solver\n")
    done = _check_siblings(tree)
    assert done.returncode == 1, done.stdout
    assert "marquardt-solver is only an extra of marquardt-trainer" in done.stdout


def _check_module_refs(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_module_refs.py"), str(tree)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_no_docstring_names_a_module_that_does_not_exist(tmp_path: Path) -> None:
    done = _check_module_refs(_copy_packages(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 references to modules that do not exist" in done.stdout


@pytest.mark.parametrize(
    "reference", ["``_no_such_module``", "``_loops._no_such_module``", "``marquardt.solver._nope``"]
)
def test_a_docstring_naming_a_missing_module_is_reported(tmp_path: Path, reference: str) -> None:
    tree = _copy_packages(tmp_path)
    module = _module(tree, "trainer", "_stale.py")
    module.write_text(f'"""Written by {reference}, which was renamed."""\n', encoding="utf-8")
    done = _check_module_refs(tree)
    assert done.returncode == 1
    assert f"_stale.py:1: {reference} names no module" in done.stdout


def test_a_docstring_naming_a_module_or_a_defined_name_passes(tmp_path: Path) -> None:
    tree = _copy_packages(tmp_path)
    module = _module(tree, "trainer", "_fresh.py")
    module.write_text(
        '"""See ``_loops._lm``, ``marquardt.solver._lm.damping`` and ``_stop_training``."""\n',
        encoding="utf-8",
    )
    done = _check_module_refs(tree)
    assert "_fresh.py" not in done.stdout


def test_the_test_helpers_imported_by_a_package_fail(tmp_path: Path) -> None:
    """marquardt-testing comes with the ``test`` extra only: the tests may import it, the
    package's own modules may not (an install without the extra could not import them)."""
    tree = _copy_packages(tmp_path)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "packages" / "testing", tree / "packages" / "testing", ignore=ignore)
    for folder in PACKAGES:
        shutil.copytree(
            ROOT / "packages" / folder / "tests",
            tree / "packages" / folder / "tests",
            ignore=ignore,
        )
    done = _check_siblings(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 packages, 0 problems" in done.stdout
    module = _module(tree, "core-devices", "_errors.py")
    module.write_text(module.read_text(encoding="utf-8") + "\nimport marquardt.testing\n")
    done = _check_siblings(tree)
    assert done.returncode == 1, done.stdout
    assert "marquardt-devices imports marquardt.testing, which only its test extra" in done.stdout
