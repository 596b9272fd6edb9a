"""The NIST StRD nonlinear-regression problems: 27 models, data, two starts, certified values.

Source: the National Institute of Standards and Technology, Statistical Reference Datasets,
Nonlinear Regression (https://www.itl.nist.gov/div898/strd/nls/nls_main.shtml), US
government public data. ``nist_data/<Name>.dat`` are NIST's own files, unchanged: each
gives the model's formula, the data, two starting values per parameter ("start 1", far
from the solution, and "start 2", nearer), and the certified parameters and residual sum
of squares, computed by NIST to 11 significant digits in 128-bit arithmetic. The numbers
are read from those files here; the models below are written from the formulas the files
state.

NIST grades each problem's difficulty ("lower", "average", "higher"). A fit is judged by
the log relative error of its parameters, LRE = −log₁₀(|p − c| / |c|) for the certified
value c, taken as the minimum over the parameters and capped at 11 (the certified digits),
as NIST and McCullough (1999, "Assessing the reliability of statistical software") do.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["DIGITS", "NAMES", "NistProblem", "lre", "nist_problem", "nist_problems"]

DATA = Path(__file__).resolve().parent / "nist_data"

#: Significant digits of NIST's certified values: the cap of the LRE.
DIGITS = 11.0

Model = Callable[..., torch.Tensor]


def _misra1a(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    return b1 * (1.0 - torch.exp(-b2 * x))


def _chwirut(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, b3: torch.Tensor) -> torch.Tensor:
    return torch.exp(-b1 * x) / (b2 + b3 * x)


def _lanczos(x: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
    return b[0] * torch.exp(-b[1] * x) + b[2] * torch.exp(-b[3] * x) + b[4] * torch.exp(-b[5] * x)


def _gauss(x: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
    return (
        b[0] * torch.exp(-b[1] * x)
        + b[2] * torch.exp(-((x - b[3]) ** 2) / b[4] ** 2)
        + b[5] * torch.exp(-((x - b[6]) ** 2) / b[7] ** 2)
    )


def _danwood(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    return b1 * x**b2


def _misra1b(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    return b1 * (1.0 - (1.0 + b2 * x / 2.0) ** (-2.0))


def _kirby2(x: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
    return (b[0] + b[1] * x + b[2] * x**2) / (1.0 + b[3] * x + b[4] * x**2)


def _cubic_ratio(x: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
    """Hahn1 and Thurber: a cubic over a cubic with constant term 1."""
    return (b[0] + b[1] * x + b[2] * x**2 + b[3] * x**3) / (
        1.0 + b[4] * x + b[5] * x**2 + b[6] * x**3
    )


def _nelson(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, b3: torch.Tensor) -> torch.Tensor:
    # log[y] = b1 - b2*x1*exp[-b3*x2]: x is (2, N), the targets are log(y).
    return b1 - b2 * x[0] * torch.exp(-b3 * x[1])


def _mgh17(x: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
    return b[0] + b[1] * torch.exp(-x * b[3]) + b[2] * torch.exp(-x * b[4])


def _misra1c(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    return b1 * (1.0 - (1.0 + 2.0 * b2 * x) ** (-0.5))


def _misra1d(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    return b1 * b2 * x * (1.0 + b2 * x) ** (-1.0)


def _roszman1(x: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
    return b[0] - b[1] * x - torch.atan(b[2] / (x - b[3])) / math.pi


def _enso(x: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
    w = 2.0 * math.pi * x
    return (
        b[0]
        + b[1] * torch.cos(w / 12.0)
        + b[2] * torch.sin(w / 12.0)
        + b[4] * torch.cos(w / b[3])
        + b[5] * torch.sin(w / b[3])
        + b[7] * torch.cos(w / b[6])
        + b[8] * torch.sin(w / b[6])
    )


def _mgh09(x: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
    return b[0] * (x**2 + x * b[1]) / (x**2 + x * b[2] + b[3])


def _boxbod(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    return b1 * (1.0 - torch.exp(-b2 * x))


def _rat42(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, b3: torch.Tensor) -> torch.Tensor:
    return b1 / (1.0 + torch.exp(b2 - b3 * x))


def _mgh10(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, b3: torch.Tensor) -> torch.Tensor:
    return b1 * torch.exp(b2 / (x + b3))


def _eckerle4(
    x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, b3: torch.Tensor
) -> torch.Tensor:
    return (b1 / b2) * torch.exp(-0.5 * ((x - b3) / b2) ** 2)


def _rat43(x: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
    return b[0] / (1.0 + torch.exp(b[1] - b[2] * x)) ** (1.0 / b[3])


def _bennett5(
    x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, b3: torch.Tensor
) -> torch.Tensor:
    return b1 * (b2 + x) ** (-1.0 / b3)


#: The models by problem, in NIST's order (lower, average, higher difficulty).
MODELS: dict[str, Model] = {
    "Misra1a": _misra1a,
    "Chwirut2": _chwirut,
    "Chwirut1": _chwirut,
    "Lanczos3": _lanczos,
    "Gauss1": _gauss,
    "Gauss2": _gauss,
    "DanWood": _danwood,
    "Misra1b": _misra1b,
    "Kirby2": _kirby2,
    "Hahn1": _cubic_ratio,
    "Nelson": _nelson,
    "MGH17": _mgh17,
    "Lanczos1": _lanczos,
    "Lanczos2": _lanczos,
    "Gauss3": _gauss,
    "Misra1c": _misra1c,
    "Misra1d": _misra1d,
    "Roszman1": _roszman1,
    "ENSO": _enso,
    "MGH09": _mgh09,
    "Thurber": _cubic_ratio,
    "BoxBOD": _boxbod,
    "Rat42": _rat42,
    "MGH10": _mgh10,
    "Eckerle4": _eckerle4,
    "Rat43": _rat43,
    "Bennett5": _bennett5,
}
NAMES: tuple[str, ...] = tuple(MODELS)


@dataclass(frozen=True)
class NistProblem:
    """One StRD problem: ``f(x, *b)``, data (float64), starts and certified values.

    ``x`` is (N,), or (2, N) for Nelson (x1, x2); ``y`` is (N,) (for Nelson, log of NIST's
    response, as its model is stated for log[y]). ``starts`` are NIST's start 1 and start 2.
    """

    name: str
    difficulty: str  # "lower", "average" or "higher"
    f: Model
    x: torch.Tensor
    y: torch.Tensor
    starts: tuple[tuple[float, ...], tuple[float, ...]]
    certified: tuple[float, ...]
    certified_sd: tuple[float, ...]
    certified_rss: float

    @property
    def params(self) -> int:
        return len(self.certified)


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def _parse(name: str) -> NistProblem:
    lines = (DATA / f"{name}.dat").read_text().splitlines()
    starts: list[tuple[float, float]] = []
    certified: list[float] = []
    sd: list[float] = []
    rss = math.nan
    difficulty = ""
    data_at = -1
    for i, line in enumerate(lines):
        level = re.match(r"\s*(Lower|Average|Higher) Level of Difficulty", line)
        if level:
            difficulty = level.group(1).lower()
        row = re.match(
            rf"\s*b\d+\s*=\s*({_NUMBER})\s+({_NUMBER})\s+({_NUMBER})\s+({_NUMBER})", line
        )
        if row:
            s1, s2, c, d = (float(v) for v in row.groups())
            starts.append((s1, s2))
            certified.append(c)
            sd.append(d)
        if line.startswith("Residual Sum of Squares:"):
            rss = float(line.split(":")[1])
        if re.match(r"Data:\s+y\s", line):
            data_at = i
    table = [[float(v) for v in line.split()] for line in lines[data_at + 1 :] if line.strip()]
    values = torch.tensor(table, dtype=torch.float64)
    y = values[:, 0]
    x = values[:, 1] if values.shape[1] == 2 else values[:, 1:].T.contiguous()
    if name == "Nelson":
        y = torch.log(y)
    return NistProblem(
        name=name,
        difficulty=difficulty,
        f=MODELS[name],
        x=x,
        y=y,
        starts=(tuple(s[0] for s in starts), tuple(s[1] for s in starts)),
        certified=tuple(certified),
        certified_sd=tuple(sd),
        certified_rss=rss,
    )


@functools.cache
def nist_problem(name: str) -> NistProblem:
    """The problem ``name`` (one of :data:`NAMES`), read once."""
    return _parse(name)


def nist_problems() -> tuple[NistProblem, ...]:
    """All 27 problems, in NIST's order of difficulty."""
    return tuple(nist_problem(n) for n in NAMES)


def lre(params: object, certified: tuple[float, ...]) -> float:
    """min over parameters of −log₁₀(|p − c|/|c|), capped at :data:`DIGITS` (NaN → 0)."""
    p = torch.as_tensor(params, dtype=torch.float64).reshape(-1)
    c = torch.tensor(certified, dtype=torch.float64)
    rel = ((p - c).abs() / c.abs()).tolist()
    worst = DIGITS
    for value in rel:
        if not math.isfinite(value):
            return 0.0
        worst = min(worst, DIGITS if value == 0.0 else -math.log10(value))
    return worst
