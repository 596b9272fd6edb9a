"""tools/check_dists.py (run by ``nox -s build``) refuses bad wheels and sdists.

The archives are made here from core-devices' source tree, the way setuptools lays them
out: a good pair passes, and each defect the checker exists for is found.
"""

from __future__ import annotations

import importlib.util
import io
import tarfile
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "packages" / "core-devices"


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_dists", ROOT / "tools" / "check_dists.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_dists = _checker()


@pytest.fixture(scope="module")
def meta() -> dict[str, str]:
    project = tomllib.loads((FOLDER / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {k: project[k] for k in ("name", "version", "license", "readme")}


def _sources() -> dict[str, bytes]:
    """src/marquardt/devices' files, by their path inside the package folder."""
    source = FOLDER / "src"
    return {
        p.relative_to(source).as_posix(): p.read_bytes()
        for p in (source / "marquardt" / "devices").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def _wheel(path: Path, meta: dict[str, str], extra: dict[str, bytes] | None = None) -> Path:
    info = f"marquardt_devices-{meta['version']}.dist-info"
    metadata = (
        f"Metadata-Version: 2.4\nName: {meta['name']}\nVersion: {meta['version']}\n"
        f"License-Expression: {meta['license']}\nLicense-File: LICENSE\n"
        "Classifier: Typing :: Typed\n"
    )
    files = {
        **_sources(),
        f"{info}/METADATA": metadata.encode(),
        f"{info}/licenses/LICENSE": (ROOT / "LICENSE").read_bytes(),
        **(extra or {}),
    }
    wheel = path / f"marquardt_devices-{meta['version']}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def _sdist(path: Path, meta: dict[str, str], leave_out: str = "") -> Path:
    top = f"marquardt_devices-{meta['version']}"
    files = {f"src/{name}": data for name, data in _sources().items()}
    for name in ("PKG-INFO", "pyproject.toml", "README.md", "LICENSE"):
        files[name] = (FOLDER / name).read_bytes() if name != "PKG-INFO" else b""
    sdist = path / f"{top}.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name, data in files.items():
            if name == leave_out:
                continue
            member = tarfile.TarInfo(f"{top}/{name}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return sdist


def test_a_wheel_laid_out_like_setuptools_passes(tmp_path: Path, meta: dict[str, str]) -> None:
    assert check_dists.check_wheel(_wheel(tmp_path, meta), FOLDER, meta) == []
    assert check_dists.check_sdist(_sdist(tmp_path, meta), FOLDER, meta) == []


@pytest.mark.parametrize(
    "name,found",
    [
        ("marquardt/devices/tests/test_cli.py", "is a test file"),
        ("marquardt/devices/conftest.py", "is a test file"),
        ("marquardt/devices/__pycache__/_cli.cpython-311.pyc", "is a cache file"),
        ("tests/test_cli.py", "lies outside marquardt/devices/"),
        ("marquardt/__init__.py", "lies outside marquardt/devices/"),
        ("benchmarks/run_all.py", "lies outside marquardt/devices/"),
    ],
)
def test_a_wheel_with_a_stray_file_fails(
    tmp_path: Path, meta: dict[str, str], name: str, found: str
) -> None:
    wheel = _wheel(tmp_path, meta, {name: b""})
    problems = check_dists.check_wheel(wheel, FOLDER, meta)
    assert len(problems) == 1 and name in problems[0] and found in problems[0], problems


@pytest.mark.parametrize("left_out", ["marquardt/devices/_cli.py", "marquardt/devices/py.typed"])
def test_a_wheel_missing_a_file_fails(tmp_path: Path, meta: dict[str, str], left_out: str) -> None:
    wheel = _wheel(tmp_path, meta)
    with zipfile.ZipFile(wheel) as archive:
        kept = {n: archive.read(n) for n in archive.namelist() if n != left_out}
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in kept.items():
            archive.writestr(name, data)
    problems = check_dists.check_wheel(wheel, FOLDER, meta)
    assert problems == [f"{wheel.name}: {left_out} is missing"]


@pytest.mark.parametrize("left_out", ["README.md", "LICENSE"])
def test_an_sdist_without_readme_or_licence_fails(
    tmp_path: Path, meta: dict[str, str], left_out: str
) -> None:
    sdist = _sdist(tmp_path, meta, leave_out=left_out)
    problems = check_dists.check_sdist(sdist, FOLDER, meta)
    top = f"marquardt_devices-{meta['version']}"
    assert problems == [f"{sdist.name}: {top}/{left_out} is missing"]


def test_only_the_published_packages_are_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty dist/ lacks the four published packages' files, and nothing of
    marquardt-testing, which is never published (``nox -s build`` does not build it)."""
    assert check_dists.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    for name in (
        "marquardt_devices",
        "marquardt_jacobian",
        "marquardt_solver",
        "marquardt_trainer",
    ):
        assert f"{name}-" in out, out
    assert "marquardt_testing" not in out, out
