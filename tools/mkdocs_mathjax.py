"""mkdocs hook: serve MathJax from the built site, and refuse a site that fetches from the network.

The docs' mathematics (``pymdownx.arithmatex``) is typeset by MathJax 3 in the reader's
browser. The script comes from the pinned PyPI package ``django-static-mathjax`` (MathJax
3.2.2 as static files, Apache-2.0; installed by ``docs/requirements.txt``), not from a CDN:
its ``es5/tex-svg.js`` (the TeX input and the SVG output with the fonts inside, so no
font files are needed) and its licence are added to the site as ``js/mathjax/``, which
``mkdocs.yml`` lists in ``extra_javascript``. The site then renders its maths without a
network, from a file or an intranet.

After the build every HTML page and stylesheet is checked (``tools/docs_site_check.py``,
``remote_resources``): a remote script, stylesheet, font, image, ``preconnect`` or
``preload`` link, or a CSS ``@import``/``url()`` from another host fails the build, and so
does a missing ``js/mathjax/tex-svg.js``. The theme's web fonts are off (``theme.font:
false`` in mkdocs.yml): the pages use the reader's system fonts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

#: Where the script lands in the site (mkdocs.yml's extra_javascript names it).
SITE_SCRIPT = "js/mathjax/tex-svg.js"
SITE_LICENSE = "js/mathjax/LICENSE"
_CHECKS = Path(__file__).resolve().with_name("docs_site_check.py")


def _site_checks() -> ModuleType:
    """tools/docs_site_check.py, loaded by path (mkdocs loads hooks by path, not as a package)."""
    spec = importlib.util.spec_from_file_location("docs_site_check", _CHECKS)
    if spec is None or spec.loader is None:
        raise PluginError(f"cannot load the site checks from {_CHECKS}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    """Fail the build when the script is missing or the site fetches anything remote."""
    site = Path(config["site_dir"])
    if not (site / SITE_SCRIPT).is_file():
        raise PluginError(f"the built site has no {SITE_SCRIPT}: the maths would not render")
    remote = _site_checks().remote_resources(site)
    if remote:
        raise PluginError(
            f"{len(remote)} remote resource(s) in the built site, which must work offline:\n  "
            + "\n  ".join(remote[:10])
            + "\nHINT: serve the file from the site (as this hook does for MathJax) instead "
            "of a URL in mkdocs.yml (extra_javascript, extra_css), and keep theme.font: false"
        )
