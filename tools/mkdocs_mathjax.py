"""mkdocs hook: serve MathJax from the built site, and refuse a page that loads a remote script.

The docs' mathematics (``pymdownx.arithmatex``) is typeset by MathJax 3 in the reader's
browser. The script comes from the pinned PyPI package ``django-static-mathjax`` (MathJax
3.2.2 as static files, Apache-2.0; installed by ``docs/requirements.txt``), not from a CDN:
its ``es5/tex-svg.js`` (the TeX input and the SVG output with the fonts inside, so no
font files are needed) and its licence are added to the site as ``js/mathjax/``, which
``mkdocs.yml`` lists in ``extra_javascript``. The site then renders its maths without a
network, from a file or an intranet.

After the build every HTML page is checked: a ``<script src="http(s)://…">`` fails the
build, and so does a missing ``js/mathjax/tex-svg.js``.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

#: Where the script lands in the site (mkdocs.yml's extra_javascript names it).
SITE_SCRIPT = "js/mathjax/tex-svg.js"
SITE_LICENSE = "js/mathjax/LICENSE"
_REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc=[\"']?(?:https?:)?//", re.IGNORECASE)


def _package_root() -> Path:
    spec = importlib.util.find_spec("mathjax")
    if spec is None or spec.origin is None:
        raise PluginError(
            "the docs need MathJax from the package django-static-mathjax, which is not "
            "installed. HINT: pip install -r docs/requirements.txt -c constraints/test.txt"
        )
    root = Path(spec.origin).parent / "static" / "mathjax"
    if not (root / "es5" / "tex-svg.js").is_file():
        raise PluginError(
            f"the package 'mathjax' at {root.parent.parent} has no static/mathjax/es5/tex-svg.js "
            "(another package named 'mathjax'?). HINT: pip install the pinned "
            "django-static-mathjax from docs/requirements.txt"
        )
    return root


def on_files(files: Files, config: Any) -> Files:
    """Add MathJax's script and licence to the site's files."""
    root = _package_root()
    for uri, source in (
        (SITE_SCRIPT, root / "es5" / "tex-svg.js"),
        (SITE_LICENSE, root / "LICENSE"),
    ):
        files.append(File.generated(config, uri, abs_src_path=str(source)))
    return files


def on_post_build(config: Any) -> None:
    """Fail the build when the script is missing or a page loads a remote script."""
    site = Path(config["site_dir"])
    if not (site / SITE_SCRIPT).is_file():
        raise PluginError(f"the built site has no {SITE_SCRIPT}: the maths would not render")
    remote = [
        str(page.relative_to(site))
        for page in sorted(site.rglob("*.html"))
        if _REMOTE_SCRIPT.search(page.read_text(encoding="utf-8", errors="replace"))
    ]
    if remote:
        raise PluginError(
            f"{len(remote)} page(s) load a script from the network ({', '.join(remote[:5])}); "
            "the site must work offline. HINT: serve the script from the site (see "
            "tools/mkdocs_mathjax.py) instead of a URL in mkdocs.yml's extra_javascript"
        )
