"""tools/docs_results.py (run by ``nox -s docs``): a page quoting a figure the results lack fails.

Each test writes a small results file and a page; the last checks the repository's pages
against its own ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from _support import ROOT, load_tool

check = load_tool("docs_results")

RESULTS = """\
| ratio | measured | target | verdict | figures |
|---|---|---|---|---|
| curve_fit N=1,000,000: ours / best SciPy | 1.15× | ≤ 0.5× | **MISS** | ours 346 ms, lm 300 ms |
| pinn: ours | 3.33e-06 | | | step 245.2 ms, peak 201 MiB, 2.5 GiB in all |
"""


def _problems(tmp_path: Path, page_text: str) -> list[str]:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent(page_text), encoding="utf-8")
    return check.check_page(page, check.result_figures([RESULTS]))


@pytest.mark.parametrize(
    "prose",
    [
        "Ours takes 1.15× SciPy's time at a million points.",
        "Ours takes 1.2× SciPy's time; the target is ≤ 0.5×.",  # rounded as written
        "A 512 × 512 frame, 36 × 36 points and a 7x7 box are sizes, not ratios.",
        "Typed here without a citation: 0.87 s, 4.9e-3.",  # no results file named
        "In `benchmarks/RESULTS.md`: a step of 0.25 s (245.2 ms), an error of 3.3e-6, 201 MiB.",
        "`benchmarks/RESULTS.md` quotes 2.5 GiB, and shows `0.94×` in code only.",
    ],
)
def test_figures_the_results_hold_pass(tmp_path: Path, prose: str) -> None:
    assert _problems(tmp_path, prose) == []


@pytest.mark.parametrize(
    "prose, figure",
    [
        ("Ours takes 0.94× SciPy's time at a million points.", "0.94×"),
        ("| N | ratio |\n|---|---|\n| 10⁶ | 5.9× |", "5.9×"),
        ("Step time against the floor: 1.8–2.0×.", "1.8×"),
        ("(`benchmarks/RESULTS.md`) each step 0.87 s against 0.18 s.", "0.87 s"),
        ("From benchmarks/RESULTS.md:\nerror 4.9e-3 at the budget.", "4.9e-3"),
        ("From `RESULTS.md`: ours 360 ms.", "360 ms"),
    ],
)
def test_a_figure_the_results_lack_fails(tmp_path: Path, prose: str, figure: str) -> None:
    problems = _problems(tmp_path, prose)
    assert problems and figure in problems[0] and "HINT" in problems[0]
    assert "page.md:" in problems[0]


def test_code_blocks_and_maths_are_not_prose(tmp_path: Path) -> None:
    page = """\
        The ratio \\(0.94\\times\\) in maths.

        ```python
        print("0.94×")  # benchmarks/RESULTS.md 0.87 s
        ```
        <!-- 5.9× in a comment -->
        """
    assert _problems(tmp_path, page) == []


def test_the_line_of_the_figure_is_named(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "Title\n\nfirst line\nsecond line 5.9×\n")
    assert problems[0].split(": ")[0].endswith("page.md:4")


@pytest.mark.parametrize("commit", ["87e9292", "1e100ab", "2e5f"])
def test_a_commit_in_the_results_is_not_a_number(tmp_path: Path, commit: str) -> None:
    # A short commit hash of digits, "e" and digits once read as 87 × 10⁹²⁹² and overflowed.
    results = RESULTS + f"\n- Source measured: commit {commit}\n"
    assert check.result_figures([results])
    page = tmp_path / "page.md"
    page.write_text("In `benchmarks/RESULTS.md`: 1.15×.", encoding="utf-8")
    assert check.check_page(page, check.result_figures([results])) == []


def test_the_pages_quote_only_figures_of_the_results() -> None:
    results = check.result_figures(p.read_text(encoding="utf-8") for p in check.RESULTS)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    problems = [p for page in pages for p in check.check_page(page, results)]
    assert not problems, "\n".join(problems)
