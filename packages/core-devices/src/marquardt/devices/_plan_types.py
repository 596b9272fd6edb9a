"""What the planner returns and the figures it works with: `Plan`, the dtypes' sizes,
the slice factor and Legate's minimums (the arithmetic: ``_planner.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "ITEMSIZE",
    "LEGATE_MIN_MIB",
    "SLICES_IN_FLIGHT",
    "SLICE_FACTOR",
    "SYSMEM_MARGIN",
    "Backend",
    "MiB",
    "Plan",
    "Strategy",
    "fmt_bytes",
]

Strategy = Literal["explicit", "accumulate", "subsets", "matrix_free"]
Backend = Literal["cupynumeric", "torch", "numpy"]

MiB = 1 << 20
#: Bytes per element of the dtypes a Jacobian may be computed in.
ITEMSIZE: dict[str, int] = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
}
#: Model-side memory per slice, in multiples of the slice's Jacobian (see the module doc).
SLICE_FACTOR = 3
#: The least --fbmem / --sysmem worth passing to Legate, in MiB.
LEGATE_MIN_MIB = 256
#: Fraction added to the host bytes staged per step when sizing --sysmem (allocator slack,
#: Legate's own small host-side arrays).
SYSMEM_MARGIN = 0.25
#: Slices the Jacobian engine keeps in flight per model device (its ``map_ordered`` window).
SLICES_IN_FLIGHT = 2


def fmt_bytes(nbytes: float) -> str:
    """Bytes in binary units: ``9.04 MiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{int(nbytes)} B"


@dataclass(frozen=True)
class Plan:
    """A recommendation: Legate's GPU count, the model devices, the slice size and strategy.

    All sizes are bytes. ``fits`` is false when even the best split leaves too little
    memory; ``explain()`` then says what does not fit and what to change. The planner
    (`plan`) builds it; its fields are:

    Arguments:
        params: ``P``, the model's parameter count.
        batch: ``N``, the samples in one step.
        outputs: ``m``, the residuals per sample.
        dtype: the Jacobian's dtype, by name (``"float32"``).
        rows: ``R = N·m``, the Jacobian's rows.
        strategy: ``"accumulate"`` (``JᵀJ`` summed slice by slice), ``"explicit"`` (``J``
            held whole), ``"matrix_free"`` (CG on products ``JᵀJv``) or ``"subsets"``
            (``params_per_step`` columns of ``J`` a step).
        backend: the solver's array backend: ``"cupynumeric"``, ``"torch"`` or ``"numpy"``.
        legate_gpus: ``K``, the GPUs Legate takes for the solver (0: none).
        model_devices: the devices that compute the Jacobian (``("cpu",)`` without GPUs).
        slice_size: the samples a model device takes per Jacobian slice.
        jacobian_bytes: the whole ``J``, ``R·P·b``.
        normal_bytes: ``JᵀJ`` in float64, ``P·P·8``.
        solver_bytes: what the solver holds for the chosen strategy.
        slice_bytes: what one slice takes on a model device.
        fits: whether the split fits the usable memory.
        fbmem_mib: Legate's ``--fbmem`` in MiB (``None`` without Legate GPUs).
        sysmem_mib: Legate's ``--sysmem`` in MiB (``None`` without Legate GPUs).
        lines: the arithmetic in words, one line per step (`explain` joins them).
        params_per_step: ``k`` for the ``"subsets"`` strategy, else ``None``.
        step_seconds: one step's predicted seconds (``marquardt.devices.step_seconds``;
            None for subsets).
    """

    params: int
    batch: int
    outputs: int
    dtype: str
    rows: int
    strategy: Strategy
    backend: Backend
    legate_gpus: int
    model_devices: tuple[str, ...]
    slice_size: int
    jacobian_bytes: int
    normal_bytes: int
    solver_bytes: int
    slice_bytes: int
    fits: bool
    fbmem_mib: int | None
    sysmem_mib: int | None
    lines: tuple[str, ...] = field(default=(), repr=False)
    params_per_step: int | None = None
    step_seconds: float | None = None

    def command(self, script: str = "script.py") -> str:
        """The command line that runs ``script`` with this split.

        Arguments:
            script: the training script the command runs.

        Returns:
            ``python script …`` without Legate GPUs, else a ``legate --gpus K …`` line.
        """
        if self.params_per_step is not None:
            return (
                f"python {script} --slice-size {self.slice_size} "
                f"--params-per-step {self.params_per_step}"
            )
        if self.strategy == "matrix_free":
            return f"python {script} --slice-size {self.slice_size} --strategy matrix_free"
        if self.legate_gpus == 0:
            return f"python {script} --slice-size {self.slice_size}"
        return (
            f"legate --gpus {self.legate_gpus} --fbmem {self.fbmem_mib} "
            f"--sysmem {self.sysmem_mib} {script} --slice-size {self.slice_size}"
        )

    def explain(self) -> str:
        """The arithmetic behind the recommendation, one plain line per step.

        Returns:
            ``lines`` joined by newlines.
        """
        return "\n".join(self.lines)
