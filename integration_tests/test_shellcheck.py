"""Every launch recipe passes shellcheck (and bash's own parser)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from _support import LAUNCH, ROOT

RECIPES = sorted(
    p for p in LAUNCH.rglob("*") if p.suffix in {".sh", ".sbatch", ".pbs"} and p.is_file()
)


def test_every_launcher_has_recipes() -> None:
    folders = {p.parent.name for p in RECIPES}
    assert folders == {"torchrun", "slurm", "legate", "pbs"}, folders


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(LAUNCH)))
def test_recipe_passes_shellcheck(recipe: Path, shellcheck: str) -> None:
    parsed = subprocess.run(
        ["bash", "-n", str(recipe)], capture_output=True, text=True, timeout=30, check=False
    )
    assert parsed.returncode == 0, parsed.stderr
    # --shell=bash: .sbatch and .pbs files carry a bash shebang but no .sh suffix.
    done = subprocess.run(
        [shellcheck, "--shell=bash", "--severity=style", "--external-sources", str(recipe)],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(LAUNCH)))
def test_recipe_is_commented_and_parameterised(recipe: Path) -> None:
    text = recipe.read_text()
    lines = text.splitlines()
    assert lines[0] in ("#!/bin/bash", "#!/usr/bin/env bash"), lines[0]
    assert lines[1].startswith("# "), "the second line says what the recipe runs"
    assert "set -euo pipefail" in text
    assert "${SCRIPT:-" in text, "the script is a variable with a default"
