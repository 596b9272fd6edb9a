"""Every code block of the docs site (docs/**/*.md) is executed or checked.

``python`` blocks: the blocks of one page run in order, in one namespace, in a fresh
subprocess whose working directory is a temporary folder (so files a block writes go
there). A block is not run only when the Markdown says so, visibly, on the line right
before its fence:

    <!-- docs: skip-run REASON -->        compiled with compile(), not run (needs GPUs,
                                           Legate, a cluster...); REASON is required
    <!-- docs: argv ARG ARG... -->         run as a script: __name__ == "__main__" and
                                           sys.argv = ["<page>.py", ARG, ...]

``bash`` blocks: parsed by ``bash -n``, checked by shellcheck, and every path they name
inside this repository (examples/..., launch/..., packages/..., constraints/...,
benchmarks/..., docs/...) must exist.

Other fences (``text``, ``console``, ``yaml``...) show output or configuration and are
not checked.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: A fence opening: any indentation (fences nest in admonitions and lists), ``` or ~~~
#: (3 or more), the language, optional attributes.
_FENCE_OPEN = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)[^\n]*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs:\s*(?P<kind>[\w-]+)\s*(?P<arg>.*?)\s*-->\s*$")
_KNOWN_DIRECTIVES = ("skip-run", "argv")
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

#: Seconds one page's Python blocks may take together before the test fails.
PAGE_TIMEOUT = 600


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its text and its directive."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    directive: str | None = None
    argument: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def extract_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with the directive just before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE_OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        fence, indent, lang = match["fence"], len(match["indent"]), match["lang"].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.match(
            rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[i]
        ):
            # Content lines keep their indentation beyond that of the fence.
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        i += 1  # the closing fence
        directive, argument = None, ""
        j = start - 1
        while j >= 0 and lines[j].strip() == "":
            j -= 1
        if j >= 0 and (d := _DIRECTIVE.match(lines[j])):
            directive, argument = d["kind"], d["arg"]
        blocks.append(Block(page, start + 1, lang, "\n".join(body) + "\n", directive, argument))
    return blocks


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _blocks(langs: tuple[str, ...]) -> list[Block]:
    return [b for p in _pages() for b in extract_blocks(p) if b.lang in langs]


def _page_id(page: Path) -> str:
    return str(page.relative_to(DOCS))


PY_LANGS = ("python", "py", "python3")
SH_LANGS = ("bash", "sh", "shell")


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

            <!-- docs: skip-run needs a GPU -->
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
        ("python", "skip-run", "needs a GPU"),
        ("bash", None, ""),
    ]
    assert blocks[0].code == "x = 1\n"
    assert blocks[2].code.strip() == "echo hi"


def test_docs_have_python_blocks() -> None:
    # Guards against an extractor that silently finds nothing.
    assert len(_blocks(PY_LANGS)) >= 10, "expected the docs to hold at least 10 python blocks"


@pytest.mark.parametrize("block", _blocks(PY_LANGS + SH_LANGS), ids=lambda b: b.where)
def test_directives_are_known_and_explained(block: Block) -> None:
    if block.directive is None:
        return
    assert block.directive in _KNOWN_DIRECTIVES, (
        f"{block.where}: unknown directive <!-- docs: {block.directive} -->. "
        f"HINT: use one of {_KNOWN_DIRECTIVES}"
    )
    if block.directive == "skip-run":
        assert block.argument, (
            f"{block.where}: <!-- docs: skip-run --> needs a reason. "
            "HINT: <!-- docs: skip-run needs 2 GPUs -->"
        )
        assert block.lang in PY_LANGS, f"{block.where}: skip-run applies to python blocks only"


# --- python blocks -----------------------------------------------------------------------


@pytest.mark.parametrize("block", _blocks(PY_LANGS), ids=lambda b: b.where)
def test_python_block_compiles(block: Block) -> None:
    compile(block.code, block.where, "exec")


_RUNNER = r"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1], encoding="utf-8"))
namespace = {"__name__": "docs_page"}
for b in blocks:
    if b["argv"] is not None:
        sys.argv = b["argv"]
        namespace["__name__"] = "__main__"
    else:
        namespace["__name__"] = "docs_page"
    try:
        exec(compile(b["code"], b["where"], "exec"), namespace)
    except SystemExit as e:
        if e.code not in (None, 0):
            print(f"BLOCK FAILED {b['where']}: SystemExit({e.code!r})", file=sys.stderr)
            raise
    except BaseException:
        print(f"BLOCK FAILED {b['where']}", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
    print(f"BLOCK OK {b['where']}", flush=True)
"""


def _runnable_pages() -> list[Path]:
    return [
        p
        for p in _pages()
        if any(b.lang in PY_LANGS and b.directive != "skip-run" for b in extract_blocks(p))
    ]


@pytest.mark.parametrize("page", _runnable_pages(), ids=_page_id)
def test_python_blocks_of_page_run(page: Path, tmp_path: Path) -> None:
    blocks = [b for b in extract_blocks(page) if b.lang in PY_LANGS and b.directive != "skip-run"]
    payload = [
        {
            "where": b.where,
            "code": b.code,
            "argv": [page.stem + ".py", *shlex.split(b.argument)]
            if b.directive == "argv"
            else None,
        }
        for b in blocks
    ]
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps(payload), encoding="utf-8")
    env = dict(os.environ)
    # Small thread counts: the docs examples are tiny and the test machines are shared.
    env.setdefault("OMP_NUM_THREADS", "2")
    env.setdefault("MPLBACKEND", "Agg")
    # The blocks run in a temporary folder: keep relative PYTHONPATH entries meaningful.
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(
            str(Path(entry).resolve()) for entry in env["PYTHONPATH"].split(os.pathsep) if entry
        )
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(spec)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT,
    )
    assert proc.returncode == 0, (
        f"python blocks of {page.relative_to(ROOT)} failed (exit {proc.returncode})\n"
        f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
    )
    assert proc.stdout.count("BLOCK OK") == len(blocks)


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
    """(package, class name) of every exception class defined in a package's _errors.py."""
    import ast

    found = []
    for errors in sorted((ROOT / "packages").glob("*/src/marquardt/*/_errors.py")):
        tree = ast.parse(errors.read_text(encoding="utf-8"))
        found += [
            (errors.parent.name, node.name) for node in tree.body if isinstance(node, ast.ClassDef)
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
