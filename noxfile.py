"""Every development task of the marquardt monorepo, as nox sessions.

Sessions are generated from ``PACKAGES``: each ``tests-<package>`` session installs only
that package (with its test extra, and its sibling dependencies from their folders) into
a fresh virtual environment, so it proves the package installs and works alone.
Versions are pinned in ``constraints/``: ``test.txt`` for libraries, ``tools.txt`` for tools.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nox

ROOT = Path(__file__).parent
TEST_CONSTRAINTS = ("-c", str(ROOT / "constraints" / "test.txt"))
TOOL_CONSTRAINTS = ("-c", str(ROOT / "constraints" / "tools.txt"))
DIST = ROOT / "dist"
PYTHON = "3.11"

# Under CI each session's environment is removed when the session ends: they hold torch
# (and two of them Legate) each, about 16 GB together, more than a CI disk may have free.
DISCARD_ENVIRONMENTS = os.environ.get("CI", "").lower() in ("1", "true", "yes")

nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["tests", "lint", "typecheck"]

# package folder -> (sibling folders it depends on, pytest marker expression, extras)
PACKAGES: dict[str, tuple[tuple[str, ...], str, str]] = {
    "core-devices": ((), "not gpu", "test"),
    "core-jacobian": (("core-devices",), "not gpu", "test"),
    "core-solver": (("core-devices", "core-jacobian"), "not gpu and not legate", "test"),
    "core-solver-legate": (("core-devices", "core-jacobian"), "legate and not gpu", "test,legate"),
    "trainer": (("core-devices", "core-jacobian", "core-solver"), "not gpu", "test,lm"),
}
ALL_PACKAGES = ("core-devices", "core-jacobian", "core-solver", "trainer")
CORE_PACKAGES = ("core-devices", "core-jacobian", "core-solver")


def _session(**kwargs: Any) -> Callable[[Callable[[nox.Session], None]], Any]:
    """``nox.session``, whose environment is removed after the session under CI."""

    def decorate(func: Callable[[nox.Session], None]) -> Any:
        @functools.wraps(func)
        def run(session: nox.Session) -> None:
            try:
                func(session)
            finally:
                if DISCARD_ENVIRONMENTS:
                    _discard_environment(session)

        return nox.session(**kwargs)(run)

    return decorate


def _discard_environment(session: nox.Session) -> None:
    location = getattr(session.virtualenv, "location", None)
    if not location or not Path(location).is_dir():
        return
    shutil.rmtree(location, ignore_errors=True)
    free = shutil.disk_usage(ROOT).free / 2**30
    session.log(f"removed {location}; {free:.1f} GiB free on the disk")


def _folder(name: str) -> str:
    """The package folder for a session name (``core-solver-legate`` tests ``core-solver``)."""
    return "core-solver" if name == "core-solver-legate" else name


def _install_packages(session: nox.Session, *folders: str, extras: str = "test") -> None:
    """Install local packages (siblings first) under the test constraints; with the ``test``
    extra also marquardt-testing (the suites' helpers and pytest plugin), which is never
    published and so comes from its folder."""
    args = [str(ROOT / "packages" / f) for f in folders[:-1]]
    if "test" in extras.split(","):
        args.insert(0, str(ROOT / "packages" / "testing"))
    args.append(f"{ROOT / 'packages' / folders[-1]}[{extras}]")
    session.install(*TEST_CONSTRAINTS, *args)


def _make_test_session(name: str) -> None:
    siblings, markers, extras = PACKAGES[name]

    @_session(name=f"tests-{name}", python=PYTHON)
    def _tests(session: nox.Session) -> None:
        folder = _folder(name)
        _install_packages(session, *siblings, folder, extras=extras)
        session.run(
            "pytest",
            str(ROOT / "packages" / folder / "tests"),
            "-m",
            markers,
            "-p",
            "no:cacheprovider",
            "-ra",
            *session.posargs,
        )


for _name in PACKAGES:
    _make_test_session(_name)


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """Every package's tests, each in its own fresh environment."""
    session.run(
        sys.executable,
        "-m",
        "nox",
        "-s",
        *(f"tests-{name}" for name in PACKAGES),
        *(["--", *session.posargs] if session.posargs else []),
        external=True,
    )


@_session(python=PYTHON)
def build(session: nox.Session) -> None:
    """An sdist and a wheel of every package into dist/, their metadata and contents checked."""
    session.install(*TOOL_CONSTRAINTS, "build", "twine")
    shutil.rmtree(DIST, ignore_errors=True)
    for folder in ALL_PACKAGES:
        session.run(
            "python",
            "-m",
            "build",
            "-q",
            "--dependency-constraints-txt",
            str(ROOT / "constraints" / "tools.txt"),
            "--outdir",
            str(DIST),
            str(ROOT / "packages" / folder),
        )
    session.run("twine", "check", "--strict", *sorted(str(f) for f in DIST.iterdir()))
    session.run("python", str(ROOT / "tools" / "check_dists.py"), str(DIST))


@_session(python=PYTHON)
def install_wheels(session: nox.Session) -> None:
    """Each wheel alone in a fresh environment outside the repository, with a smoke check.

    Needs ``nox -s build`` first. Each environment gets one wheel and its declared
    dependencies (siblings from dist/, everything else pinned by constraints/test.txt),
    then runs tools/wheel_smoke.py from a temporary folder, so a module missing from the
    wheel, an undeclared dependency or an import that works only from the source tree fails.
    The trainer's environment then takes its ``lm`` extra and runs the LM loop.
    """
    wheels = sorted(DIST.glob("marquardt_*-py3-none-any.whl"))
    if len(wheels) != len(ALL_PACKAGES):
        session.error(
            f"expected {len(ALL_PACKAGES)} wheels in {DIST}, found {[w.name for w in wheels]}. "
            "HINT: nox -s build install_wheels"
        )
    with tempfile.TemporaryDirectory(prefix="marquardt-wheels-") as tmp:
        work = Path(tmp)
        pins = work / "siblings.txt"  # the versions just built, not any other
        pins.write_text("".join("{}=={}\n".format(*w.name.split("-")[:2]) for w in wheels))
        smoke = shutil.copy(ROOT / "tools" / "wheel_smoke.py", work)
        # (wheel, extra): every wheel alone, then the trainer's with its LM loop.
        runs = [(w, "") for w in wheels] + [(w, "lm") for w in wheels if "_trainer-" in w.name]
        for wheel, extra in runs:
            venv = work / wheel.name.split("-")[0]
            if not venv.exists():
                session.run("python", "-m", "venv", str(venv))
            python = str(venv / "bin" / "python")
            session.run(
                python,
                "-m",
                "pip",
                "install",
                "-q",
                *TEST_CONSTRAINTS,
                "-c",
                str(pins),
                "--find-links",
                str(DIST),
                f"{wheel}[{extra}]" if extra else str(wheel),
                external=True,
            )
            with session.chdir(work):
                session.run(
                    python,
                    smoke,
                    wheel.name,
                    *([extra] if extra else []),
                    external=True,
                    env={"PYTHONPATH": None},
                )


@_session(python=PYTHON)
def integration_tests(session: nox.Session) -> None:
    """Multi-process and multi-component tests: torchrun, a real Slurm, legate, PBS."""
    _install_packages(session, *ALL_PACKAGES, extras="test,lm")
    # matplotlib, nevergrad and tensorboard: the perceptrain comparison draws with
    # perceptrain's plotting callbacks, trains without gradients and reads the TensorBoard
    # files back (it makes perceptrain's own environment itself, test_perceptrain_compat.py).
    # The docs' python blocks run in `nox -s docs`, not here.
    session.install(
        *TEST_CONSTRAINTS, "legate", "nvidia-cupynumeric", "matplotlib", "nevergrad", "tensorboard",
    )  # fmt: skip
    session.install(*TOOL_CONSTRAINTS, "import-linter")  # test_layering.py runs lint-imports
    # test_docs_site.py builds the docs site and checks what a reader of it sees.
    session.install("-r", str(ROOT / "docs" / "requirements.txt"), *TEST_CONSTRAINTS)
    env = {}
    if DISCARD_ENVIRONMENTS:  # perceptrain's own environment goes with this one
        env["MARQUARDT_PEERS_CACHE"] = str(Path(session.virtualenv.location) / "peers")
    session.run(
        "pytest",
        str(ROOT / "integration_tests"),
        "-p",
        "no:cacheprovider",
        "-ra",
        *session.posargs,
        env=env,
    )


def _gpu_present() -> bool:
    """Whether NVML answers on this machine (no CUDA is touched)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
        pynvml.nvmlShutdown()
        return count > 0
    except Exception:
        return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


@_session(python=PYTHON)
def gpu_tests(session: nox.Session) -> None:
    """Tests marked ``gpu``. On a machine without a GPU, says so and runs nothing."""
    if not _gpu_present():
        session.skip(
            "no GPU present on this machine (NVML finds none): 0 gpu tests ran, none counted as passing"
        )
    _install_packages(session, *ALL_PACKAGES, extras="test,lm")
    session.install(*TEST_CONSTRAINTS, "legate", "nvidia-cupynumeric")
    # One pytest per suite: each package's tests take their pytest settings (markers,
    # --import-mode=importlib) from its own pyproject, and their file names repeat across
    # packages, so one run over all of them fails to collect.
    paths = [ROOT / "packages" / p / "tests" for p in ALL_PACKAGES] + [ROOT / "integration_tests"]
    for path in paths:
        session.run(
            "pytest", str(path), "-m", "gpu", "-p", "no:cacheprovider", "-ra", *session.posargs
        )


@_session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff; the import layers (devices <- jacobian <- solver <- trainer, and each package's own
    folders); sibling dependencies; docstrings that name no module."""
    session.install(*TOOL_CONSTRAINTS, "ruff", "import-linter")
    # import-linter finds the packages by import: install the four, without dependencies.
    session.install("--no-deps", *(f"-e{ROOT / 'packages' / p}" for p in ALL_PACKAGES))
    session.run("ruff", "check", str(ROOT), *session.posargs)
    session.run("ruff", "format", "--check", str(ROOT))
    session.run("lint-imports", "--config", str(ROOT / "pyproject.toml"), "--no-cache")
    session.run("python", str(ROOT / "tools" / "check_siblings.py"))
    session.run("python", str(ROOT / "tools" / "check_module_refs.py"))


@_session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy, strict on the core packages, ordinary on the trainer."""
    _install_packages(session, *ALL_PACKAGES, extras="test,lm")
    session.install(*TOOL_CONSTRAINTS, "mypy")
    core = [str(ROOT / "packages" / p / "src" / "marquardt") for p in CORE_PACKAGES]
    session.run(
        "mypy",
        "--strict",
        "--namespace-packages",
        "--explicit-package-bases",
        *[f"--package=marquardt.{p.split('-')[1]}" for p in CORE_PACKAGES],
        env={"MYPYPATH": os.pathsep.join(str(Path(c).parent) for c in core)},
    )
    session.run(
        "mypy",
        "--package=marquardt.trainer",
        "--namespace-packages",
        env={"MYPYPATH": str(ROOT / "packages" / "trainer" / "src")},
    )


@_session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Every page's python blocks run as a reader runs them, its quoted figures checked against
    the benchmark results, RESULTS.md checked to be what the recorded results render to
    (``run_all.py --check``), and the site built strictly."""
    # The trainer's test extra brings what the pages import beside the packages (matplotlib,
    # mlflow-skinny, nevergrad); the digits tutorial loads its data set with scikit-learn.
    _install_packages(session, *ALL_PACKAGES, extras="test,lm")
    session.install(*TEST_CONSTRAINTS, "scikit-learn")
    session.install("-r", str(ROOT / "docs" / "requirements.txt"), *TEST_CONSTRAINTS)
    # README.md and docs/**/*.md: each page's blocks in order in one fresh process, on one
    # thread (the examples are small; on a busy machine a second thread waits at every
    # OpenMP barrier, which slows the PINN tutorial most).
    session.run("python", str(ROOT / "tools" / "docs_blocks.py"), env={"OMP_NUM_THREADS": "1"})
    session.run("python", str(ROOT / "tools" / "docs_results.py"))
    # RESULTS.md must be what benchmarks/results/ renders to (the renderer reads each
    # benchmark's module, which imports torch and the packages installed above).
    session.run("python", str(ROOT / "benchmarks" / "run_all.py"), "--check")
    # mkdocs-material 9.7+ prints a banner about its end of life on every build; it is
    # not a warning about these docs, and NO_MKDOCS_2_WARNING is its documented switch.
    session.run(
        "mkdocs",
        "build",
        "--strict",
        "-f",
        str(ROOT / "mkdocs.yml"),
        "-d",
        str(ROOT / "site"),
        *session.posargs,
        env={"NO_MKDOCS_2_WARNING": "1"},
    )
    # What a reader would see that they should not (raw TeX, Sphinx roles, remote files,
    # temporary paths, missing images); integration_tests/test_docs_site.py runs the same.
    session.run("python", str(ROOT / "tools" / "docs_site_check.py"), str(ROOT / "site"))


@_session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks against the peers, measured in the same run; ratios printed beside targets."""
    _install_packages(session, *ALL_PACKAGES, extras="test,lm")
    session.install(*TEST_CONSTRAINTS, "-r", str(ROOT / "benchmarks" / "requirements.txt"))
    session.run("python", str(ROOT / "benchmarks" / "run_all.py"), "--check")
    session.run("python", str(ROOT / "benchmarks" / "run_all.py"), *session.posargs)


@_session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: the sinc LM fit of the tutorial on this machine, with a loss-curve PNG."""
    _install_packages(session, "core-devices", "core-jacobian", "core-solver", extras="test")
    session.install(*TEST_CONSTRAINTS, "matplotlib")
    session.run("python", str(ROOT / "examples" / "sinc_lm.py"), *session.posargs)
