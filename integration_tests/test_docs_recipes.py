"""The launcher pages of the docs show every recipe, verbatim.

A page shows a recipe as a fenced block titled with its path
(```` ```bash title="launch/slurm/single_gpu.sbatch" ````); the block must equal the file,
so the docs cannot drift from what the tests run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _support import LAUNCH, ROOT

PAGES = ROOT / "docs" / "launch"
_TITLED = re.compile(r'^```bash title="(?P<path>[^"]+)"\n(?P<body>.*?)^```$', re.S | re.M)
RECIPES = sorted(
    p for p in LAUNCH.rglob("*") if p.suffix in {".sh", ".sbatch", ".pbs"} and p.is_file()
)


def _shown() -> dict[str, list[tuple[str, str]]]:
    """recipe path -> [(page, block body)] for every titled block of the launcher pages."""
    shown: dict[str, list[tuple[str, str]]] = {}
    for page in sorted(PAGES.glob("*.md")):
        for m in _TITLED.finditer(page.read_text(encoding="utf-8")):
            shown.setdefault(m["path"], []).append((page.name, m["body"]))
    return shown


def test_launcher_pages_exist() -> None:
    names = {p.stem for p in PAGES.glob("*.md")}
    assert {"python", "torchrun", "slurm", "legate", "pbs"} <= names, names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(LAUNCH)))
def test_recipe_is_shown_verbatim(recipe: Path) -> None:
    key = str(recipe.relative_to(ROOT))
    shown = _shown().get(key)
    assert shown, f"no page of docs/launch shows {key} in a block titled with its path"
    for page, body in shown:
        assert body == recipe.read_text(), f"docs/launch/{page} shows an old {key}"
