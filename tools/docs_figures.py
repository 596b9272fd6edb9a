"""Redraw the figures that a docs page's own code draws, and put them where the page shows them.

A page's ``python`` blocks run in order in one namespace, in a temporary folder (as the docs
tests run them: ``integration_tests/test_docs_code_blocks.py``). Every PNG the blocks save
there whose name the page shows as an image (``![...](img/NAME.png)`` or
``../img/NAME.png``) is copied to ``docs/img/NAME.png``. So the picture on the page is the
one its code draws, and redrawing it after a change to the code is one command:

    python tools/docs_figures.py docs/index.md docs/curve-fitting.md

Blocks marked ``<!-- docs: skip-run ... -->`` are not run. Needs the packages and
matplotlib (the shared test environment has both).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"
_FENCE = re.compile(r"^(?P<indent> *)```(?:python|py)\s*$")
_SKIP = re.compile(r"^\s*<!--\s*docs:\s*skip-run\b")
_SHOWN = re.compile(r"\]\((?:\.\./)*img/(?P<name>[\w.-]+\.png)\)")


def python_blocks(page: Path) -> list[str]:
    """The page's python blocks that the docs tests run, dedented, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent = len(match["indent"])
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        i += 1
        if not _SKIP.match(before):
            blocks.append("\n".join(body) + "\n")
    return blocks


def shown_images(page: Path) -> set[str]:
    """File names of the images under img/ that the page shows."""
    return set(_SHOWN.findall(page.read_text(encoding="utf-8")))


def redraw(page: Path) -> list[Path]:
    """Run the page's blocks and copy the PNGs it shows into docs/img; returns the copies."""
    with tempfile.TemporaryDirectory(prefix="docs-figures-") as tmp:
        script = Path(tmp) / "page.py"
        script.write_text("\n".join(python_blocks(page)), encoding="utf-8")
        env = dict(os.environ, MPLBACKEND="Agg")
        subprocess.run([sys.executable, str(script)], cwd=tmp, env=env, check=True)
        copied = []
        for name in sorted(shown_images(page)):
            drawn = Path(tmp) / name
            if drawn.is_file():
                shutil.copyfile(drawn, IMG / name)
                copied.append(IMG / name)
        return copied


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python tools/docs_figures.py docs/PAGE.md [...]")
        return 2
    for arg in argv:
        page = Path(arg).resolve()
        copied = redraw(page)
        names = ", ".join(p.name for p in copied) or "no figure it shows"
        print(f"{page.relative_to(ROOT)}: {names}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
