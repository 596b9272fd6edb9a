"""Run the Python blocks of the docs pages as a reader runs them: in page order, one process per page.

The pages are ``README.md`` and ``docs/**/*.md``. The ``python`` blocks of one page run in
order, in one namespace, in a fresh Python process whose working directory is a temporary
folder (files a block writes go there), with ``MPLBACKEND=Agg``. A page passes when every
block ran without an exception; a block states what it claims with ``assert``, and a page
whose blocks run but assert nothing fails too.

A block is left out only when the Markdown says so, visibly, on the line right before its
fence, and only for one of two reasons:

    <!-- docs: skip-run gpu: needs a CUDA device -->        the block needs a GPU
    <!-- docs: skip-run placeholder: the shape of a call --> the block names what the
                                                               reader fills in
    <!-- docs: argv ARG ARG... -->   run as a script: __name__ == "__main__" and
                                     sys.argv = ["<page>.py", ARG, ...]

A block left out is still compiled. ``nox -s docs`` runs every page:

    python tools/docs_blocks.py                      # every page
    python tools/docs_blocks.py docs/curve-fitting.md README.md

Needs the packages, matplotlib, scikit-learn, nevergrad and mlflow-skinny (what the pages
import; ``nox -s docs`` installs them).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PY_LANGS = ("python", "py", "python3")
SH_LANGS = ("bash", "sh", "shell")
#: Why a python block may be left out: the first word of a ``skip-run`` directive.
SKIP_KINDS = {
    "gpu": "the block needs a GPU",
    "placeholder": "the block names what the reader fills in",
}
KNOWN_DIRECTIVES = ("skip-run", "argv")
#: Seconds one page's Python blocks may take together.
PAGE_TIMEOUT = 600

#: A fence opening: any indentation (fences nest in admonitions and lists), ``` or ~~~
#: (3 or more), the language, optional attributes.
_FENCE_OPEN = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)[^\n]*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs:\s*(?P<kind>[\w-]+)\s*(?P<arg>.*?)\s*-->\s*$")
_ASSERT = re.compile(r"^\s*assert\b", re.M)


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
        try:
            return f"{self.page.relative_to(ROOT)}:{self.line}"
        except ValueError:
            return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        """Whether the page runner executes it (a python block not marked ``skip-run``)."""
        return self.lang in PY_LANGS and self.directive != "skip-run"


@dataclass(frozen=True)
class PageRun:
    """What running one page's blocks gave."""

    page: Path
    ran: int
    skipped: int
    seconds: float
    error: str  # empty when every block ran and the page asserts something


def extract_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, each with the directive just before it.

    **Arguments:**

    - `page`: a Markdown file.

    **Returns:** the blocks in page order; a block's lines keep their indentation beyond
    that of its fence.
    """
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
        close = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        while i < len(lines) and not close.match(lines[i]):
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


def pages() -> list[Path]:
    """Every page whose blocks are checked: the README, then docs/**/*.md in name order."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def directive_problem(block: Block) -> str:
    """Why a block's directive is not allowed, or "" when it is (or it has none).

    **Arguments:**

    - `block`: a block from `extract_blocks`.

    **Returns:** the message naming the block, what it says and what would be allowed.
    """
    if block.directive is None:
        return ""
    if block.directive not in KNOWN_DIRECTIVES:
        return (
            f"{block.where}: unknown directive <!-- docs: {block.directive} -->. "
            f"HINT: use one of {KNOWN_DIRECTIVES}"
        )
    if block.directive == "skip-run":
        kind, _, reason = block.argument.partition(":")
        if block.lang not in PY_LANGS:
            return f"{block.where}: skip-run applies to python blocks only"
        if kind.strip() not in SKIP_KINDS or not reason.strip():
            allowed = "; ".join(f"'{k}: ...' when {v}" for k, v in SKIP_KINDS.items())
            return (
                f"{block.where}: <!-- docs: skip-run {block.argument} --> does not say why in "
                f"an allowed way. HINT: {allowed}; any other block runs, and asserts what it "
                "claims"
            )
    return ""


# Runs in the page's own process: every block in order, in one namespace.
_RUNNER = r"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1], encoding="utf-8"))
namespace = {"__name__": "docs_page"}
for b in blocks:
    code = compile(b["code"], b["where"], "exec")
    if not b["run"]:
        continue
    if b["argv"] is not None:
        sys.argv = b["argv"]
        namespace["__name__"] = "__main__"
    else:
        namespace["__name__"] = "docs_page"
    try:
        exec(code, namespace)
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


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    # One thread unless asked otherwise: the examples are small and the machines shared.
    env.setdefault("OMP_NUM_THREADS", "1")
    env["MPLBACKEND"] = "Agg"
    # A page's fit would start background kernel builds that outlive the page's process.
    env.setdefault("MARQUARDT_SOLVER_BACKGROUND_BUILD", "0")
    # The blocks run in a temporary folder: keep relative PYTHONPATH entries meaningful.
    if env.get("PYTHONPATH"):
        entries = [e for e in env["PYTHONPATH"].split(os.pathsep) if e]
        env["PYTHONPATH"] = os.pathsep.join(str(Path(e).resolve()) for e in entries)
    return env


def run_page(page: Path, workdir: Path, timeout: float = PAGE_TIMEOUT) -> PageRun:
    """Run a page's python blocks in order in one fresh process, in ``workdir``.

    **Arguments:**

    - `page`: a Markdown file.
    - `workdir`: an empty folder, the process's working directory.
    - `timeout`: seconds the page's blocks may take together.

    **Returns:** how many blocks ran and were left out, the seconds, and the error ("" when
    the page passed): a bad directive, a failing block (with its output), or no `assert`.
    """
    python = [b for b in extract_blocks(page) if b.lang in PY_LANGS]
    runs = [b for b in python if b.runs]
    skipped = len(python) - len(runs)
    problems = [p for p in map(directive_problem, python) if p]
    if problems:
        return PageRun(page, 0, skipped, 0.0, "\n".join(problems))
    if runs and not any(_ASSERT.search(b.code) for b in runs):
        return PageRun(
            page,
            0,
            skipped,
            0.0,
            f"{page}: its python blocks assert nothing. HINT: state each claim a block makes "
            "(a printed result, a figure on the page) as an assert that can fail",
        )
    payload = [
        {
            "where": b.where,
            "code": b.code,
            "run": b.runs,
            "argv": [page.stem + ".py", *shlex.split(b.argument)]
            if b.directive == "argv"
            else None,
        }
        for b in python
    ]
    spec = workdir / "blocks.json"
    spec.write_text(json.dumps(payload), encoding="utf-8")
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _RUNNER, str(spec)],
            cwd=workdir,
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return PageRun(page, 0, skipped, time.monotonic() - start, f"{page}: over {timeout} s")
    seconds = time.monotonic() - start
    ran = proc.stdout.count("BLOCK OK")
    error = ""
    if proc.returncode != 0 or ran != len(runs):
        error = (
            f"python blocks of {page} failed (exit {proc.returncode}, {ran} of {len(runs)} ran)\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
        )
    return PageRun(page, ran, skipped, seconds, error)


def main(argv: list[str]) -> int:
    """Run the pages named (every page when none), print one line per page; 1 on a failure."""
    chosen = [Path(a).resolve() for a in argv] or pages()
    failed = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="marquardt-docs-") as tmp:
        for number, page in enumerate(chosen):
            workdir = Path(tmp) / str(number)
            workdir.mkdir()
            result = run_page(page, workdir)
            name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
            if result.ran or result.skipped or result.error:
                print(
                    f"{name}: {result.ran} blocks ran, {result.skipped} left out, "
                    f"{result.seconds:.1f} s{'  FAILED' if result.error else ''}",
                    flush=True,
                )
            if result.error:
                failed.append(result)
                print(result.error, file=sys.stderr, flush=True)
    print(f"docs blocks: {len(chosen) - len(failed)} of {len(chosen)} pages passed in "
          f"{time.monotonic() - start:.0f} s")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
