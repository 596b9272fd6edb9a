"""What a reader of the built docs site would meet that they should not: the checks.

Used twice: by the mkdocs hook (``tools/mkdocs_mathjax.py``), which fails the build on
anything fetched from the network, and by ``integration_tests/test_docs_site.py``, which
builds the site and checks every category below. Each check takes the site folder and
returns one line per problem, ``page: what was found``; an empty list means clean.

- :func:`remote_resources`: a stylesheet, font, script, preconnect/preload, image or CSS
  ``@import``/``url()`` from another host. The site must render offline.
- :func:`raw_tex`: TeX source shown as text (``\\(``, ``\\[``, ``\\frac`` ...) outside
  the ``arithmatex`` elements that MathJax typesets, the table of contents included.
- :func:`literal_roles`: Sphinx roles (``:class:``, ``:func:`` ...) shown as text.
- :func:`machine_paths`: a build machine's temporary or home paths in the text and in
  the outputs shown (``text`` blocks); shell commands the reader types may name one.
- :func:`missing_images`: an ``<img>`` (or a link to an image) whose file is not in the site.

Plain Python (only the standard library), so it runs wherever the site was built.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

_REMOTE_URL = re.compile(r"^\s*(?:https?:)?//", re.IGNORECASE)
#: ``rel`` values that make the browser fetch (or connect) before the reader asks.
_FETCHING_RELS = {
    "stylesheet",
    "preconnect",
    "preload",
    "prefetch",
    "dns-prefetch",
    "modulepreload",
    "icon",
    "manifest",
}
_CSS_REMOTE = re.compile(
    r"@import\s+(?:url\()?\s*[\"']?(?:https?:)?//|url\(\s*[\"']?(?:https?:)?//", re.IGNORECASE
)
#: TeX a reader should never see as text: the delimiters and the common commands.
_TEX = re.compile(
    r"\\[()\[\]]|\\(?:frac|tfrac|dfrac|left|right|mathrm|mathbf|operatorname|top|lambda|"
    r"delta|sum|sqrt|cdot|quad|begin|end|hat|tilde|nabla|partial|in|le|ge|approx)\b"
)
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj|const|ref|term):`?")
#: Paths that belong to the machine that ran the docs' code, not to the reader's ...
_MACHINE_PATH = re.compile(
    r"(?<![\w.$-])(?:/tmp/|/var/folders/|/private/var/|/home/[\w.-]+/|/Users/[\w.-]+/|/root/)"
    r"[^\s\"'<>]*"
)
#: ... but for the fixed folders the project's own tools use on every machine
#: (integration_tests/slurm_cluster.py's default, which the Slurm page tells readers to use).
PROJECT_PATHS = ("/tmp/marquardt-slurm/",)
#: A highlighted block of commands the reader types (they may name a folder on purpose).
_SHELL_BLOCK = re.compile(r"\blanguage-(?:bash|sh|shell|console)\b")
#: Elements without an end tag.
_VOID = frozenset(
    [
        "area",
        "base",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "source",
        "track",
        "wbr",
    ]
)
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp")


class _Page(HTMLParser):
    """One HTML page, parsed once: its text by context, its fetches and its images."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._stack: list[tuple[str, bool, bool, bool]] = []  # tag, maths, code, shell
        self.prose: list[str] = []  # text outside maths, code, scripts and styles
        self.printed: list[str] = []  # visible text but the shell commands: outputs included
        self.remote: list[str] = []
        self.images: list[str] = []
        self.styles: list[str] = []

    def _state(self) -> tuple[bool, bool, bool, bool]:
        maths = any(m for _, m, _, _ in self._stack)
        code = any(c for _, _, c, _ in self._stack)
        shell = any(s for _, _, _, s in self._stack)
        hidden = any(t in ("script", "style") for t, _, _, _ in self._stack)
        return maths, code, shell, hidden

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        rels = set(a.get("rel", "").lower().split())
        if tag == "link" and rels & _FETCHING_RELS and _REMOTE_URL.match(a.get("href", "")):
            self.remote.append(f'<link rel="{a.get("rel")}" href="{a["href"]}">')
        if tag in ("script", "img", "iframe", "source", "audio", "video") and _REMOTE_URL.match(
            a.get("src", "")
        ):
            self.remote.append(f'<{tag} src="{a["src"]}">')
        if _CSS_REMOTE.search(a.get("style", "")):
            self.remote.append(f'style="{a["style"]}"')
        if tag == "img" and a.get("src"):
            self.images.append(a["src"])
        if tag == "a" and a.get("href", "").lower().endswith(_IMAGE_SUFFIXES):
            self.images.append(a["href"])
        if tag in _VOID:
            return
        maths = "arithmatex" in a.get("class", "").split()
        code = tag in ("pre", "code", "kbd", "samp")
        shell = bool(_SHELL_BLOCK.search(a.get("class", "")))
        self._stack.append((tag, maths, code, shell))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID and self._stack and self._stack[-1][0] == tag:
            self._stack.pop()

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == tag:
                del self._stack[i:]
                return

    def handle_data(self, data: str) -> None:
        maths, code, shell, hidden = self._state()
        if self._stack and self._stack[-1][0] == "style":
            self.styles.append(data)
        if hidden:
            return
        if not shell:
            self.printed.append(data)
        if not maths and not code:
            self.prose.append(data)


def _pages(site: Path) -> list[tuple[str, _Page]]:
    parsed = []
    for html in sorted(site.rglob("*.html")):
        page = _Page()
        page.feed(html.read_text(encoding="utf-8", errors="replace"))
        page.close()
        parsed.append((str(html.relative_to(site)), page))
    return parsed


def _around(text: str, start: int, end: int) -> str:
    return " ".join(text[max(0, start - 30) : end + 30].split())


def remote_resources(site: Path) -> list[str]:
    """Everything a page or a stylesheet of the site would fetch from another host."""
    found = [f"{name}: {item}" for name, page in _pages(site) for item in page.remote]
    found += [
        f"{name}: inline <style> {m.group(0)}"
        for name, page in _pages(site)
        for style in page.styles
        for m in _CSS_REMOTE.finditer(style)
    ]
    for css in sorted(site.rglob("*.css")):
        text = css.read_text(encoding="utf-8", errors="replace")
        found += [
            f"{css.relative_to(site)}: {_around(text, m.start(), m.end())}"
            for m in _CSS_REMOTE.finditer(text)
        ]
    return found


def raw_tex(site: Path) -> list[str]:
    """TeX shown as text: outside typeset maths, code, scripts and styles."""
    found = []
    for name, page in _pages(site):
        text = " ".join(page.prose)
        found += [f"{name}: ...{_around(text, m.start(), m.end())}..." for m in _TEX.finditer(text)]
    return found


def literal_roles(site: Path) -> list[str]:
    """Sphinx roles shown as text (``:class:`` before a name) instead of a link."""
    found = []
    for name, page in _pages(site):
        text = " ".join(page.prose)
        found += [
            f"{name}: ...{_around(text, m.start(), m.end())}..." for m in _ROLE.finditer(text)
        ]
    return found


def machine_paths(site: Path) -> list[str]:
    """A build machine's temporary or home folders in the text and the outputs shown."""
    found = []
    for name, page in _pages(site):
        text = " ".join(page.printed)
        found += [
            f"{name}: ...{_around(text, m.start(), m.end())}..."
            for m in _MACHINE_PATH.finditer(text)
            if not m.group(0).startswith(PROJECT_PATHS)
        ]
    return found


def missing_images(site: Path) -> list[str]:
    """Images a page shows or links to whose file the site does not have."""
    found = []
    for name, page in _pages(site):
        base = (site / name).parent
        for src in page.images:
            parts = urlsplit(src)
            if parts.scheme or parts.netloc or src.startswith("data:"):
                continue  # remote ones are remote_resources' business
            target = (base / unquote(parts.path)).resolve()
            if not target.is_file():
                found.append(f"{name}: {src}")
    return found


CHECKS = {
    "remote resources": remote_resources,
    "raw TeX outside typeset maths": raw_tex,
    "literal Sphinx roles": literal_roles,
    "build machine paths": machine_paths,
    "missing images": missing_images,
}


def main(argv: list[str] | None = None) -> int:
    """``python tools/docs_site_check.py SITE``: print every problem, exit 1 if any."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python tools/docs_site_check.py SITE_DIR (a built mkdocs site)")
        return 2
    site = Path(args[0])
    bad = 0
    for title, check in CHECKS.items():
        problems = check(site)
        bad += len(problems)
        print(f"{title}: {len(problems)}")
        for line in problems:
            print(f"  {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
