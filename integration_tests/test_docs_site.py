"""The built docs site, as a reader meets it: the checks of tools/docs_site_check.py.

The site is built once (``mkdocs build --strict``, as ``nox -s docs`` does) into a
temporary folder, then checked for what a reader should never see: TeX source outside the
typeset maths, Sphinx roles shown as text, anything fetched from another host (the site
must render offline), a build machine's temporary paths, and images that are missing.
Beside those: every figure a page's code draws is shown on that page, every public name
of a package has its entry in the API reference, and the home page starts with an
install command that works without a clone.

Needs the docs' build tools (``pip install -r docs/requirements.txt -c
constraints/test.txt``; ``nox -s integration_tests`` installs them).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from _support import ROOT

DOCS = ROOT / "docs"
PACKAGES = {
    "devices": ROOT / "packages" / "core-devices" / "src" / "marquardt" / "devices",
    "jacobian": ROOT / "packages" / "core-jacobian" / "src" / "marquardt" / "jacobian",
    "solver": ROOT / "packages" / "core-solver" / "src" / "marquardt" / "solver",
    "trainer": ROOT / "packages" / "trainer" / "src" / "marquardt" / "trainer",
}


def _checks() -> ModuleType:
    path = ROOT / "tools" / "docs_site_check.py"
    spec = importlib.util.spec_from_file_location("docs_site_check", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checks = _checks()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built strictly from this checkout."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail(
            "the docs site tests need mkdocs, which is not installed in this environment. "
            "HINT: pip install -r docs/requirements.txt -c constraints/test.txt "
            "(nox -s integration_tests does this)"
        )
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-6000:]}"
    assert (out / "index.html").is_file()
    return out


# --- what a reader sees ---------------------------------------------------------------


@pytest.mark.parametrize("title", list(checks.CHECKS))
def test_site_has_none_of(site: Path, title: str) -> None:
    problems = checks.CHECKS[title](site)
    assert not problems, f"{len(problems)} × {title} in the built site:\n  " + "\n  ".join(
        problems[:30]
    )


def test_site_has_every_page_and_typesets_maths(site: Path) -> None:
    # Guards against checks that pass because there is nothing to check.
    pages = list(site.rglob("*.html"))
    assert len(pages) >= 20, f"only {len(pages)} pages were built"
    maths = sum(p.read_text(encoding="utf-8").count('class="arithmatex"') for p in pages)
    assert maths >= 100, f"only {maths} formulas found for MathJax"
    assert (site / "js" / "mathjax" / "tex-svg.js").is_file()


# --- the checks themselves fail on what they should -------------------------------------


_BAD_PAGE = """<!doctype html><html><head>
<link rel="preconnect" href="https://fonts.gstatic.com">
<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">
<script src="https://cdn.example.org/x.js"></script>
<style>@import url("https://fonts.example.org/a.css");</style>
<title>Scaling: the matrix \\(D\\)</title></head><body>
<nav><a href="#s">Scaling: the matrix \\(D\\)</a></nav>
<p>solves [ \\left(\\tfrac{1}{N}J^\\top J\\right)\\delta = g ] and returns the :class: <code>Solution</code></p>
<p>Inline <span class="arithmatex">\\(\\lambda\\)</span> is fine, and so is <code>re.compile(r"\\(")</code>.</p>
<pre><code>The loss curve is in /tmp/sinc2/sinc_lm_loss.png.</code></pre>
<div class="language-bash highlight"><pre><code>export SLURM_CONF=/tmp/a/slurm.conf</code></pre></div>
<p>Started as /tmp/marquardt-slurm/slurm.conf.</p>
<img src="img/missing.png"><img src="img/present.png">
</body></html>
"""


def test_checks_find_each_defect(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "present.png").write_bytes(b"\x89PNG")
    (tmp_path / "index.html").write_text(_BAD_PAGE, encoding="utf-8")
    (tmp_path / "extra.css").write_text("a { background: url(https://x.org/a.png) }")
    assert len(checks.remote_resources(tmp_path)) == 5
    tex = checks.raw_tex(tmp_path)
    assert any("matrix \\(D\\)" in t for t in tex) and any("\\tfrac" in t for t in tex)
    assert not any("\\lambda" in t or "re.compile" in t for t in tex), tex
    assert len(checks.literal_roles(tmp_path)) == 1
    paths = checks.machine_paths(tmp_path)
    assert len(paths) == 1 and "/tmp/sinc2/" in paths[0], paths
    assert checks.missing_images(tmp_path) == ["index.html: img/missing.png"]


# --- the sources behind the pages ------------------------------------------------------

_SAVEFIG = re.compile(r"savefig\(\s*[\"'](?P<name>[\w.-]+\.png)[\"']")
_SHOWN = re.compile(r"\]\((?:\.\./)*img/(?P<name>[\w.-]+\.png)\)")


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_figure_drawn_is_shown(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    drawn = set(_SAVEFIG.findall(text))
    shown = set(_SHOWN.findall(text))
    assert drawn <= shown, (
        f"docs/{page.relative_to(DOCS)} draws {sorted(drawn - shown)} but does not show it. "
        "HINT: add ![what it shows](img/NAME.png) after the block, then "
        f"python tools/docs_figures.py docs/{page.relative_to(DOCS)}"
    )
    missing = [name for name in sorted(shown) if not (DOCS / "img" / name).is_file()]
    assert not missing, f"docs/img lacks {missing}, shown by docs/{page.relative_to(DOCS)}"


def _exports(init: Path) -> list[str]:
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            assert isinstance(node.value, ast.List | ast.Tuple)
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return []


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_api_reference_documents_every_public_name(site: Path, package: str) -> None:
    names = _exports(PACKAGES[package] / "__init__.py")
    assert names, f"marquardt.{package} has no __all__"
    html = (site / "api" / package / "index.html").read_text(encoding="utf-8")
    absent = [n for n in names if f'id="marquardt.{package}.{n}' not in html]
    assert not absent, (
        f"the API page of marquardt.{package} has no entry for {absent}. "
        f"HINT: add '::: marquardt.{package}.NAME' under the right heading of "
        f"docs/api/{package}.md"
    )


def test_home_page_starts_with_an_install_from_pypi_and_a_fit() -> None:
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    first_bash = text.index("```bash")
    first_python = text.index("```python")
    first_image = text.index("](img/")
    assert first_bash < first_python < first_image < text.index("\n## "), (
        "docs/index.md should open with an install command, a fit and its picture"
    )
    install = text[first_bash : text.index("```", first_bash + 7)]
    assert "pip install marquardt-" in install and "./packages" not in install, install
    assert "(coming-from-cupylma.md)" in text
