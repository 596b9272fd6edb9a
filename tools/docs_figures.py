"""Redraw the figures that a docs page's own code draws, and put them where the page shows them.

A page's ``python`` blocks run in order in one namespace, in a temporary folder, as
``nox -s docs`` runs them (``tools/docs_blocks.py``). Every PNG the blocks save
there whose name the page shows as an image (``![...](img/NAME.png)`` or
``../img/NAME.png``) is copied to ``docs/img/NAME.png``. So the picture on the page is the
one its code draws, and redrawing it after a change to the code is one command:

    python tools/docs_figures.py docs/index.md docs/curve-fitting.md

Blocks marked ``<!-- docs: skip-run ... -->`` are not run. Needs what the pages need
(``tools/docs_blocks.py``).
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

from docs_blocks import ROOT, run_page

IMG = ROOT / "docs" / "img"
_SHOWN = re.compile(r"\]\((?:\.\./)*img/(?P<name>[\w.-]+\.png)\)")


def shown_images(page: Path) -> set[str]:
    """File names of the images under img/ that the page shows."""
    return set(_SHOWN.findall(page.read_text(encoding="utf-8")))


def redraw(page: Path) -> list[Path]:
    """Run the page's blocks and copy the PNGs it shows into docs/img; returns the copies."""
    with tempfile.TemporaryDirectory(prefix="docs-figures-") as tmp:
        result = run_page(page, Path(tmp))
        if result.error:
            raise RuntimeError(result.error)
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
