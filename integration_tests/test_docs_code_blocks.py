"""Every code block of the pages (README.md, docs/**/*.md) is checked here or run elsewhere.

``python`` blocks are run by ``nox -s docs`` (``tools/docs_blocks.py``: the blocks of one
page in order, in one fresh process, as a reader runs them); here every python block is
compiled, every directive checked, and the runner itself tested on pages made for it
(a failing assert fails the page, a page that asserts nothing fails, a skip needs a GPU or
placeholder names). The directives (on the line right before a fence):

    <!-- docs: skip-run gpu: REASON -->          compiled, not run (needs a GPU)
    <!-- docs: skip-run placeholder: REASON -->  compiled, not run (names to fill in)
    <!-- docs: argv ARG ARG... -->               run as a script with that sys.argv

``bash`` blocks: parsed by ``bash -n``, checked by shellcheck, and every path they name
inside this repository (examples/..., launch/..., packages/..., constraints/...,
benchmarks/..., docs/...) must exist.

Other fences (``text``, ``console``, ``yaml``...) show output or configuration and are
not checked.
"""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from _support import ROOT, load_tool

DOCS = ROOT / "docs"


runner = load_tool("docs_blocks")
Block = runner.Block
extract_blocks = runner.extract_blocks
PY_LANGS, SH_LANGS = runner.PY_LANGS, runner.SH_LANGS

#: Top-level folders of this repository whose paths a shipped command may name.
_REPO_DIRS = (
    "examples",
    "launch",
    "packages",
    "constraints",
    "benchmarks",
    "docs",
    "integration_tests",
)
_REPO_PATH = re.compile(
    r"(?<![\w/.-])(?:\./)?(?P<path>(?:" + "|".join(_REPO_DIRS) + r")/[\w./-]*[\w/])"
)


def _blocks(langs: tuple[str, ...]) -> list[Block]:
    return [b for p in runner.pages() for b in extract_blocks(p) if b.lang in langs]


# --- the extractor itself ----------------------------------------------------------------


def test_extractor_finds_blocks_and_directives(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        textwrap.dedent(
            """\
            Text.

            ```python
            x = 1
            ```

            <!-- docs: skip-run gpu: needs a CUDA device -->
            ```python
            import cupy
            ```

            !!! note
                ```bash
                echo hi
                ```
            """
        ),
        encoding="utf-8",
    )
    blocks = extract_blocks(page)
    assert [(b.lang, b.directive, b.argument) for b in blocks] == [
        ("python", None, ""),
        ("python", "skip-run", "gpu: needs a CUDA device"),
        ("bash", None, ""),
    ]
    assert blocks[0].code == "x = 1\n"
    assert blocks[2].code.strip() == "echo hi"
    assert [b.runs for b in blocks] == [True, False, False]


def test_docs_have_python_blocks() -> None:
    # Guards against an extractor that silently finds nothing.
    assert len(_blocks(PY_LANGS)) >= 10, "expected the docs to hold at least 10 python blocks"


def test_readme_is_among_the_pages() -> None:
    assert ROOT / "README.md" in runner.pages()
    assert any(b.runs for b in extract_blocks(ROOT / "README.md"))


@pytest.mark.parametrize("block", _blocks(PY_LANGS + SH_LANGS), ids=lambda b: b.where)
def test_directives_are_known_and_explained(block: Block) -> None:
    assert not runner.directive_problem(block)


@pytest.mark.parametrize(
    "argument",
    ["", "needs a CUDA device", "slow: takes a minute", "gpu:", "placeholder"],
)
def test_a_skip_needs_a_gpu_or_placeholder_reason(argument: str) -> None:
    block = Block(ROOT / "p.md", 3, "python", "x = 1\n", "skip-run", argument)
    problem = runner.directive_problem(block)
    assert "HINT" in problem and "p.md:3" in problem


@pytest.mark.parametrize("block", _blocks(PY_LANGS), ids=lambda b: b.where)
def test_python_block_compiles(block: Block) -> None:
    compile(block.code, block.where, "exec")


# --- the page runner (nox -s docs runs every page with it) -------------------------------


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent(text), encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    return page


_GOOD = """\
    ```python
    import math
    x = math.sqrt(4.0)
    ```

    Names carry from block to block, and files go to the working folder:

    ```python
    open("out.txt", "w").write(str(x))
    assert x == 2.0
    ```

    <!-- docs: skip-run gpu: needs a CUDA device -->
    ```python
    y = x.cuda()
    ```
    """


def test_runner_runs_the_blocks_in_order_in_one_process(tmp_path: Path) -> None:
    result = runner.run_page(_page(tmp_path, _GOOD), tmp_path / "work")
    assert (result.ran, result.skipped, result.error) == (2, 1, "")
    assert (tmp_path / "work" / "out.txt").read_text() == "2.0"


def test_runner_fails_on_a_false_claim(tmp_path: Path) -> None:
    page = _page(tmp_path, _GOOD.replace("x == 2.0", "x == 3.0"))
    result = runner.run_page(page, tmp_path / "work")
    assert result.error and "page.md:8" in result.error and "AssertionError" in result.error


def test_runner_fails_a_page_that_asserts_nothing(tmp_path: Path) -> None:
    page = _page(tmp_path, _GOOD.replace("assert x == 2.0", "print(x)"))
    result = runner.run_page(page, tmp_path / "work")
    assert "assert nothing" in result.error


def test_runner_refuses_a_skip_without_an_allowed_reason(tmp_path: Path) -> None:
    page = _page(tmp_path, _GOOD.replace("skip-run gpu:", "skip-run slow:"))
    result = runner.run_page(page, tmp_path / "work")
    assert result.ran == 0 and "HINT" in result.error


def test_runner_compiles_the_blocks_it_leaves_out(tmp_path: Path) -> None:
    page = _page(tmp_path, _GOOD.replace("y = x.cuda()", "y = = 1"))
    result = runner.run_page(page, tmp_path / "work")
    assert "SyntaxError" in result.error


def test_runner_runs_argv_blocks_as_scripts(tmp_path: Path) -> None:
    text = """\
        <!-- docs: argv --n 3 -->
        ```python
        import sys
        assert __name__ == "__main__" and sys.argv[1:] == ["--n", "3"]
        ```
        """
    result = runner.run_page(_page(tmp_path, text), tmp_path / "work")
    assert (result.ran, result.error) == (1, "")


# --- bash blocks -------------------------------------------------------------------------


@pytest.mark.parametrize("block", _blocks(SH_LANGS), ids=lambda b: b.where)
def test_bash_block_parses(block: Block) -> None:
    proc = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
    assert proc.returncode == 0, f"{block.where}: bash -n failed:\n{proc.stderr}"


@pytest.mark.parametrize("block", _blocks(SH_LANGS), ids=lambda b: b.where)
def test_bash_block_passes_shellcheck(block: Block, shellcheck: str) -> None:
    # Blocks are snippets typed at a prompt, not whole scripts: tell shellcheck it is bash.
    proc = subprocess.run(
        [shellcheck, "--shell=bash", "--severity=warning", "-"],
        input=block.code,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"{block.where}: shellcheck found problems:\n{proc.stdout}"


def referenced_paths(code: str) -> list[str]:
    """Paths inside this repository that a shell block names (extras like ``[legate]`` cut)."""
    paths = []
    for match in _REPO_PATH.finditer(code):
        path = match["path"].split("[", 1)[0].rstrip("/.")
        paths.append(path)
    return paths


def test_referenced_paths_parser() -> None:
    code = (
        "python -m pip install -c constraints/test.txt ./packages/core-solver[legate] "
        "&& python examples/sinc_lm.py\nsbatch launch/slurm/lm.sbatch # train.py\n"
    )
    assert referenced_paths(code) == [
        "constraints/test.txt",
        "packages/core-solver",
        "examples/sinc_lm.py",
        "launch/slurm/lm.sbatch",
    ]


@pytest.mark.parametrize("block", _blocks(SH_LANGS), ids=lambda b: b.where)
def test_bash_block_paths_exist(block: Block) -> None:
    missing = [p for p in referenced_paths(block.code) if not (ROOT / p).exists()]
    assert not missing, f"{block.where}: names files that do not exist in the repository: {missing}"


# --- the troubleshooting page covers every error class ---------------------------------


def _error_classes() -> list[tuple[str, str]]:
    """(package, class name) of every public exception class defined in a package's
    _errors.py (a private base such as the trainer's ``_FieldsError`` is never raised as
    itself)."""
    import ast

    found = []
    for errors in sorted((ROOT / "packages").glob("*/src/marquardt/*/_errors.py")):
        tree = ast.parse(errors.read_text(encoding="utf-8"))
        found += [
            (errors.parent.name, node.name)
            for node in tree.body
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
        ]
    return found


def test_error_classes_found() -> None:
    assert len(_error_classes()) >= 4, "expected the packages to define their errors in _errors.py"


@pytest.mark.parametrize("package,name", _error_classes())
def test_troubleshooting_explains_error(package: str, name: str) -> None:
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    assert f"`{name}`" in page, (
        f"marquardt.{package} defines {name}, which docs/troubleshooting.md does not explain. "
        "HINT: add it to the page's error section with its meaning and fix"
    )


def _environment_variables() -> list[tuple[str, str]]:
    """(package, variable) for every environment variable a package's _settings.py names.

    Found as the keys of its ENVIRONMENT table, the values of its ENV_* constants, and any
    MARQUARDT_* string in the module.
    """
    import ast

    found: set[tuple[str, str]] = set()
    for settings in sorted((ROOT / "packages").glob("*/src/marquardt/*/_settings.py")):
        package = settings.parent.name
        tree = ast.parse(settings.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign):
                targets, value = [node.target], node.value
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if "ENVIRONMENT" in names and isinstance(value, ast.Dict):
                found |= {
                    (package, k.value)
                    for k in value.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                }
            if any(n.startswith("ENV_") for n in names) and isinstance(value, ast.Constant):
                found.add((package, str(value.value)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found |= {(package, m) for m in re.findall(r"\bMARQUARDT_[A-Z_]+\b", node.value)}
    return sorted(found)


def test_environment_variables_found() -> None:
    assert len(_environment_variables()) >= 5


@pytest.mark.parametrize("package,variable", _environment_variables())
def test_troubleshooting_lists_environment_variable(package: str, variable: str) -> None:
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    section = page.split("## Environment variables", 1)[-1]
    assert f"`{variable}`" in section, (
        f"marquardt.{package} reads {variable}, which the 'Environment variables' section of "
        "docs/troubleshooting.md does not list. HINT: add it with its meaning"
    )


def test_getting_started_carries_the_readme_commands() -> None:
    # The README's quick start is the user's first contact: the docs repeat it verbatim.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(.*?)```", readme, re.S)
    assert commands, "README.md has no bash block"
    page = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    assert commands[0] in page, (
        "docs/getting-started.md no longer repeats the README's first bash block verbatim. "
        "HINT: copy the block from README.md"
    )


def _names_in_tuple(path: Path, name: str) -> list[str]:
    import ast

    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return [e.value for e in node.value.elts]  # type: ignore[attr-defined]
    raise AssertionError(f"{path} defines no {name}")


@pytest.mark.parametrize("table", ["modes", "STRATEGIES"])
def test_troubleshooting_names_every_jacobian_mode_and_strategy(table: str) -> None:
    if table == "modes":  # the mode table is the one list of modes
        from marquardt.jacobian._modes import mode_names

        names = list(mode_names())
    else:
        jacobian = ROOT / "packages" / "core-jacobian" / "src" / "marquardt" / "jacobian"
        names = _names_in_tuple(jacobian / "_planner.py", table)
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    section = page.split("`UnknownModeError`", 1)[1].split("\n\n", 1)[0]
    missing = [n for n in names if f"`{n}`" not in section]
    assert not missing, f"docs/troubleshooting.md's UnknownModeError entry lacks {missing}"


def test_troubleshooting_does_not_advise_the_default_scaling() -> None:
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    assert not re.search(r"try `scaling=\"marquardt\"`", page)


def _versions() -> dict[str, str]:
    found = {}
    for pyproject in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        text = pyproject.read_text(encoding="utf-8")
        name = re.search(r'^name = "([^"]+)"', text, re.M)
        version = re.search(r'^version = "([^"]+)"', text, re.M)
        assert name and version, pyproject
        if name[1] != "marquardt-testing":
            found[name[1]] = version[1]
    return found


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_pages_state_each_package_version_as_its_pyproject(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    sentence = re.search(r"its own version.*?(?:\n\n|$)", text, re.S)  # to the paragraph's end
    assert sentence, f"{page} does not state the packages' versions"
    stated = re.findall(r"`(marquardt-\w+)`|(\d+\.\d+\.\d+)", sentence[0])
    versions, names = {}, []
    for name, version in stated:  # names, then the version they share
        if name:
            names.append(name)
        else:
            versions.update(dict.fromkeys(names, version))
            names = []
    assert versions == _versions(), f"{page} states {versions}, the pyprojects {_versions()}"


def test_readme_states_the_torch_pin_of_the_constraints() -> None:
    pins = (ROOT / "constraints" / "test.txt").read_text(encoding="utf-8")
    torch_pin = re.search(r"^torch==\S+", pins, re.M)
    assert torch_pin
    for page in ("README.md", "docs/getting-started.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        assert f"`{torch_pin[0]}`" in text, f"{page} does not state {torch_pin[0]}"
        assert "pins the CPU build" not in text, f"{page}: the file pins a version, not a build"
