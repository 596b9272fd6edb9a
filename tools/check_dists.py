"""Check the sdists and wheels that ``nox -s build`` wrote into ``dist/``.

For every package under ``packages/`` there must be an sdist and a wheel of the version its
``pyproject.toml`` declares (but for a package never published, whose classifiers hold
``Private :: Do Not Upload``: marquardt-testing, which ``nox -s build`` does not build), and:

- the wheel holds ``marquardt/<pkg>/`` and its ``.dist-info/`` only: no tests, no caches,
  no ``marquardt/__init__.py`` (the namespace is PEP 420), nothing beside them; every
  ``.py`` file of ``src/marquardt/<pkg>/`` is in it, and so are ``py.typed`` and the licence;
- the wheel's metadata names the version, the licence expression and the licence file;
- the sdist holds ``PKG-INFO``, ``pyproject.toml``, the README, the licence and every
  source file, and no caches;
- each package's ``LICENSE`` is the repository's ``LICENSE``, byte for byte.

Usage: ``python tools/check_dists.py [DIST_DIR]`` (default ``dist/``). Prints one line per
file checked and every problem found; exits 1 if there is any.
"""

from __future__ import annotations

import re
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"
#: The classifier of a package that is never published (an index refuses it).
PRIVATE = "Private :: Do Not Upload"
#: Path parts that never belong in a distribution.
CACHE_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".nox"}
CACHE_SUFFIXES = {".pyc", ".pyo", ".pyd"}


def _normalized(name: str) -> str:
    """A distribution name as wheel and sdist file names spell it (PEP 427, PEP 625)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _is_cache(path: PurePosixPath) -> bool:
    return bool(CACHE_PARTS.intersection(path.parts)) or path.suffix in CACHE_SUFFIXES


def _is_test(path: PurePosixPath) -> bool:
    return (
        "tests" in path.parts
        or "test" in path.parts
        or path.name == "conftest.py"
        or path.name.startswith("test_")
    )


def _files(archive: Path) -> list[PurePosixPath]:
    """The files (not folders) a wheel or an sdist holds."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            return [PurePosixPath(n) for n in z.namelist() if not n.endswith("/")]
    with tarfile.open(archive) as tar:
        return [PurePosixPath(m.name) for m in tar.getmembers() if m.isfile()]


def _built(dist: Path, name: str, problems: list[str]) -> Path | None:
    """``dist/name`` if it was built, else None and a problem."""
    if not (dist / name).is_file():
        problems.append(f"{name} not found in {dist}. HINT: run nox -s build")
        return None
    return dist / name


def check_wheel(wheel: Path, folder: Path, meta: dict[str, str]) -> list[str]:
    """Problems of one wheel built from ``folder`` (its pyproject's name/version in meta)."""
    problems: list[str] = []
    pkg = folder.name.split("-")[-1]
    prefix = PurePosixPath("marquardt", pkg)
    dist_info = PurePosixPath(f"{_normalized(meta['name'])}-{meta['version']}.dist-info")
    names = _files(wheel)
    with zipfile.ZipFile(wheel) as archive:
        metadata = Parser().parsestr(archive.read(str(dist_info / "METADATA")).decode())
    for name in names:
        inside = name.is_relative_to(prefix) or name.is_relative_to(dist_info)
        if not inside:
            problems.append(f"{wheel.name}: {name} lies outside {prefix}/ and {dist_info}/")
        elif _is_cache(name):
            problems.append(f"{wheel.name}: {name} is a cache file")
        elif name.is_relative_to(prefix) and _is_test(name.relative_to(prefix)):
            problems.append(f"{wheel.name}: {name} is a test file")
    source = folder / "src" / "marquardt" / pkg
    wanted = {
        prefix / path.relative_to(source).as_posix()
        for path in source.rglob("*")
        if path.is_file() and (path.suffix == ".py" or path.name == "py.typed")
        if not _is_cache(PurePosixPath(path.relative_to(source).as_posix()))
    }
    wanted.add(dist_info / "licenses" / "LICENSE")
    for missing in sorted(wanted - set(names)):
        problems.append(f"{wheel.name}: {missing} is missing")
    expected = {
        "Name": meta["name"],
        "Version": meta["version"],
        "License-Expression": meta["license"],
        "License-File": "LICENSE",
    }
    for field, value in expected.items():
        if metadata.get(field) != value:
            problems.append(
                f"{wheel.name}: METADATA {field} is {metadata.get(field)!r}, expected {value!r}"
            )
    if "Typing :: Typed" not in (metadata.get_all("Classifier") or []):
        problems.append(f"{wheel.name}: METADATA lacks the classifier 'Typing :: Typed'")
    return problems


def check_sdist(sdist: Path, folder: Path, meta: dict[str, str]) -> list[str]:
    """Problems of one sdist of the package in ``folder``."""
    problems: list[str] = []
    top = PurePosixPath(f"{_normalized(meta['name'])}-{meta['version']}")
    names = _files(sdist)
    for name in names:
        if not name.is_relative_to(top):
            problems.append(f"{sdist.name}: {name} lies outside {top}/")
        elif _is_cache(name):
            problems.append(f"{sdist.name}: {name} is a cache file")
    pkg = folder.name.split("-")[-1]
    wanted = {top / n for n in ("PKG-INFO", "pyproject.toml", meta["readme"], "LICENSE")}
    wanted |= {
        top / path.relative_to(folder).as_posix()
        for path in (folder / "src" / "marquardt" / pkg).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    for missing in sorted(wanted - set(names)):
        problems.append(f"{sdist.name}: {missing} is missing")
    return problems


def main(argv: list[str]) -> int:
    dist = Path(argv[0]).resolve() if argv else ROOT / "dist"
    problems: list[str] = []
    licence = (ROOT / "LICENSE").read_bytes()
    for folder in sorted(p.parent for p in PACKAGES.glob("*/pyproject.toml")):
        project = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        if PRIVATE in project.get("classifiers", []):
            continue
        meta = {
            "name": project["name"],
            "version": project["version"],
            "license": project["license"],
            "readme": project["readme"],
        }
        if (folder / "LICENSE").read_bytes() != licence:
            problems.append(f"{folder.relative_to(ROOT)}/LICENSE differs from LICENSE")
        stem = f"{_normalized(meta['name'])}-{meta['version']}"
        wheel = _built(dist, f"{stem}-py3-none-any.whl", problems)
        sdist = _built(dist, f"{stem}.tar.gz", problems)
        for path, check in ((wheel, check_wheel), (sdist, check_sdist)):
            if path is None:
                continue
            found = check(path, folder, meta)
            problems += found
            if not found:
                size = path.stat().st_size / 1024
                print(f"ok   {path.name}: {size:.1f} KiB, {len(_files(path))} files")
    for problem in problems:
        print(f"FAIL {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
