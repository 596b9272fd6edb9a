"""Residuals that call the model as a function of one point: `PointResidual`.

A physics-informed network (Raissi, Perdikaris & Karniadakis 2019) fits ``u_θ(x)`` to a
PDE by residuals that differentiate the model by its inputs: for ``−Δu = f`` on ``Ω`` and
``u = g`` on ``∂Ω`` the rows are

    r_i = w_pde · (−Δu_θ(x_i) − f(x_i))   at interior points x_i,
    r_j = w_bc  · (u_θ(x_j) − g(x_j))     at boundary points x_j,

and ``J = ∂r/∂θ`` differentiates *through* ``Δu_θ``. Each group of points has its own
function ``fn(u, x, y)`` of the model at one point (``u``, a function of a point ``x``
of shape ``(d,)``), the point and its target row ``y``; the engine maps it over the points
of a slice by ``vmap`` and differentiates it with respect to ``θ`` by ``torch.func``.
Derivatives at the point are asked of ``u`` itself, ``u.grad(x)``, ``u.laplacian(x)``,
``u.hessian_diagonal(x)``: for an MLP the engine then takes them from one forward pass of
values and derivatives together (the forward Laplacian), much cheaper than
``torch.func.hessian(u)(x)``, which ``fn`` may still call (as any ``torch.func``
transform of ``u``, or ``u`` at other points), at the cost of the generic path. A batch for such a residual
holds every group's points one after the other (`PointResidual.batch`); the first
two columns of its targets name each point's group and the shape of its target, so any
slice of the batch, on any device or rank, knows which function its points take.

Float64 by default: ``−Δu − f`` cancels to the size of the error one wants (1e-5 of
``f`` and below), and the LM system ``JᵀJ`` squares the condition number of ``J``,
whose singular values span many decades for these networks; in float32 (ε ≈ 6e-8) the
solve loses every digit beyond κ(J) ≈ 4e3 and the iterates stall near relative errors of
1e-3, where first-order methods stall too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, hessian, jacrev, vmap

from ._errors import ParameterDtypeError, ResidualShapeError, message

__all__ = [
    "AnyResidual",
    "PointModel",
    "PointResidual",
    "ResidualFn",
    "ResidualGroup",
    "piecewise_linear_layers",
]

#: Activations whose second derivative is zero wherever it exists.
_PIECEWISE_LINEAR: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.PReLU,
    nn.RReLU,
    nn.Hardtanh,
    nn.Threshold,
)


class PointModel:
    """The model at one point, ``u(x)``.

    For ``x`` of shape ``(d,)`` (or the shape of one sample), ``u(x)`` is the model's output
    for that sample without the batch axis, a 0-dim tensor when the model has one output.

    Arguments:
        module: the model.
        params: the parameters (by name) it is evaluated at, for residuals with a
            coefficient of the equation among them (an inverse problem).
    """

    def __init__(self, module: nn.Module, params: Mapping[str, torch.Tensor]) -> None:
        self.module = module
        self.params = params

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(self.module, dict(self.params), (x.unsqueeze(0),))
        out = out.squeeze(0)
        return out.squeeze(0) if out.dim() == 1 and out.shape[0] == 1 else out

    def grad(self, x: torch.Tensor) -> torch.Tensor:
        """``∂u/∂x`` at the point ``x``.

        Arguments:
            x: the point, shape ``(d,)``.

        Returns:
            ``(d,)`` for a model of one output, ``(k, d)`` for ``k`` outputs.
        """
        out: torch.Tensor = jacrev(self)(x)
        return out

    def hessian_diagonal(self, x: torch.Tensor) -> torch.Tensor:
        """``∂²u/∂x_j²`` for every input ``j`` at the point ``x`` (the diagonal of the
        Hessian; ``u_xx`` of an equation in space and time is its first entry).

        Arguments:
            x: the point, shape ``(d,)``.

        Returns:
            ``(d,)`` for a model of one output, ``(k, d)`` for ``k`` outputs.
        """
        second: torch.Tensor = hessian(self)(x)
        return second.diagonal(dim1=-2, dim2=-1)

    def laplacian(self, x: torch.Tensor) -> torch.Tensor:
        """``Δu = Σ_j ∂²u/∂x_j²`` at the point ``x``.

        Arguments:
            x: the point, shape ``(d,)``.

        Returns:
            A 0-dim tensor for a model of one output, ``(k,)`` for ``k`` outputs.
        """
        return self.hessian_diagonal(x).sum(-1)


PointFn = Callable[[PointModel, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ResidualGroup:
    """One group of residuals: ``weight · fn(u, x, y)`` at each of its points.

    Arguments:
        name: the group's name, the keyword its points are given under in
            `PointResidual.batch`.
        fn: ``fn(u, x, y)``, the residuals of one point (a 0-dim tensor or a vector of
            ``m``; every group of a `PointResidual` must return the same ``m``), with ``u``
            the `PointModel`, ``x`` the point and ``y`` its target (shape ``target_shape``
            as given to `PointResidual.batch`; an empty tensor for points given without
            targets).
        weight: the factor on the group's residuals.
    """

    name: str
    fn: PointFn
    weight: float = 1.0


class PointResidual:
    """A residual that calls the model as a function and differentiates it by its inputs.

    Give it to ``JacobianEngine`` (or ``marquardt.solver.LMA``) in place of
    ``residual_fn(outputs, targets)``, with the batch built by `batch`::

        def pde(u, x, y):      # −Δu − f at one interior point
            return -u.laplacian(x) - y
        def boundary(u, x, y):
            return u(x)
        residual = PointResidual(ResidualGroup("pde", pde), ResidualGroup("bc", boundary, 10.0))
        x, y = residual.batch(pde=(x_in, f_in), bc=x_bc)

    Arguments:
        *groups: the residual groups; a plain function ``fn(u, x, y)`` is one group named
            ``"residual"`` (weight 1).
        dtype: the dtype the batch is built in and the model must have (float64 by
            default: see the module docstring); ``torch.float32`` is accepted when asked
            for.

    Raises:
        TypeError: no group is given, a group's ``fn`` is not callable, or ``dtype`` is
            not a floating dtype.
        ValueError: two groups have the same name.
    """

    def __init__(self, *groups: ResidualGroup | PointFn, dtype: torch.dtype = torch.float64):
        if not groups:
            raise TypeError(
                message(
                    "PointResidual(*groups) expects at least one group",
                    "none was given",
                    "pass ResidualGroup(name, fn, weight) objects or one function fn(u, x, y)",
                )
            )
        made: list[ResidualGroup] = []
        for g in groups:
            group = g if isinstance(g, ResidualGroup) else ResidualGroup("residual", g)
            if not callable(group.fn):
                raise TypeError(
                    message(
                        f"group {group.name!r} expects a function fn(u, x, y)",
                        f"got {type(group.fn).__name__}",
                        "pass a function of the model at a point, the point and its target",
                    )
                )
            made.append(group)
        names = [g.name for g in made]
        if len(set(names)) != len(names):
            raise ValueError(
                message(
                    "groups with distinct names were expected",
                    f"got {names}",
                    "give each ResidualGroup its own name",
                )
            )
        if not dtype.is_floating_point:
            raise TypeError(
                message(
                    f"PointResidual(dtype={dtype}) was requested",
                    "it is not a floating dtype",
                    "pass torch.float64 (the default) or torch.float32",
                )
            )
        self.groups: tuple[ResidualGroup, ...] = tuple(made)
        self.dtype = dtype

    def __repr__(self) -> str:
        inner = ", ".join(f"{g.name}×{g.weight:g}" for g in self.groups)
        return f"PointResidual({inner}, dtype={self.dtype})"

    # -- the batch ---------------------------------------------------------------------
    def batch(
        self, **points: torch.Tensor | tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` of every group's points, in the order of the groups.

        Each keyword is a group's name with its points ``(n, d)`` or ``(points, targets)``
        (targets of shape ``(n, ...)``). ``targets`` is ``(N, 1 + t)``: the group's index,
        then its target flattened (zero-padded to the widest group). Call it again with
        new points to resample the collocation points for a step.
        """
        known = {g.name: i for i, g in enumerate(self.groups)}
        unknown = sorted(set(points) - set(known))
        if unknown:
            raise ValueError(
                message(
                    f"points for the groups {sorted(known)} were expected",
                    f"got points for {unknown}",
                    "name each keyword after a ResidualGroup of this PointResidual",
                )
            )
        parts: list[tuple[int, torch.Tensor, torch.Tensor, int]] = []
        for name, value in points.items():
            x, y = value if isinstance(value, tuple) else (value, None)
            x = torch.as_tensor(x)
            n = int(x.shape[0]) if x.dim() else 0
            if n == 0:
                continue
            if y is None:
                y = x.new_zeros((n, 0))
            y = torch.as_tensor(y)
            if int(y.shape[0]) != n:
                raise ValueError(
                    message(
                        f"one target per point of group {name!r} was expected",
                        f"got {n} points and {int(y.shape[0])} targets",
                        "pass (points, targets) with the same first dimension",
                    )
                )
            # How the point's target is handed to fn: a 0-dim tensor for targets of shape (n,)
            # (code −1), else a vector of its t values (code t; 0: no target).
            code = -1 if y.dim() == 1 else int(y[0].numel())
            parts.append((known[name], x, y.reshape(n, -1), code))
        if not parts:
            raise ValueError(
                message(
                    "points for at least one group were expected",
                    "every group was given no points",
                    "pass e.g. batch(pde=x_interior, boundary=x_boundary)",
                )
            )
        parts.sort(key=lambda p: p[0])
        width = max(int(p[2].shape[1]) for p in parts)
        inputs = torch.cat([p[1].to(self.dtype) for p in parts])
        rows = []
        for index, x, y, code in parts:
            row = x.new_zeros((int(x.shape[0]), 2 + width), dtype=self.dtype)
            row[:, 0] = index
            row[:, 1] = code
            row[:, 2 : 2 + y.shape[1]] = y
            rows.append(row)
        return inputs, torch.cat(rows)

    # -- evaluation (used by the Jacobian engine) -------------------------------------
    def runs(self, targets: torch.Tensor) -> Iterator[tuple[int, int, int, int]]:
        """``(group, target code, lo, hi)``: the runs of consecutive points of one group in
        ``targets`` (one host read of the two leading columns)."""
        head = targets[:, :2].detach().to("cpu", torch.int64)
        n = int(head.shape[0])
        if n == 0:
            return
        # Where a row differs from the one before (unique_consecutive over rows costs
        # more than the forward-Laplacian pass of a small network).
        change = (head[1:] != head[:-1]).any(1).nonzero().flatten().add(1).tolist()
        bounds = [0, *change, n]
        keys = head[bounds[:-1]].tolist()
        for (g, code), lo, hi in zip(keys, bounds[:-1], bounds[1:], strict=True):
            yield int(g), int(code), lo, hi

    def grouped(self, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(order, restore)`` that sort a slice's points by group (stably) and put the
        rows back, or None when they are already in runs by group: a shuffled batch
        (a ``DataLoader`` over ``batch()``'s tensors) is evaluated one ``vmap`` per group,
        not one per run of a few points."""
        tags = targets[:, 0].detach().to("cpu", torch.int64)
        if tags.numel() < 2 or bool((tags[1:] >= tags[:-1]).all()):
            return None
        order = torch.sort(tags, stable=True).indices
        return order, torch.argsort(order)

    def check_targets(self, targets: torch.Tensor) -> None:
        """Refuse targets that were not built by `batch` (group column missing or
        out of range), before any work."""
        ok = targets.dim() == 2 and targets.shape[1] >= 2
        if ok:
            tags, codes = targets[:, 0].detach().to("cpu"), targets[:, 1].detach().to("cpu")
            ok = bool(
                torch.all(tags == tags.round())
                and torch.all((tags >= 0) & (tags < len(self.groups)))
                and torch.all(codes == codes.round())
                and torch.all((codes >= -1) & (codes <= targets.shape[1] - 2))
            )
        if not ok:
            raise ResidualShapeError(
                message(
                    f"targets built by PointResidual.batch (a group index in [0, "
                    f"{len(self.groups)}) in column 0, the target's shape in column 1) were "
                    "expected",
                    f"got targets of shape {tuple(targets.shape)} without such columns",
                    "build the batch with x, y = residual.batch(name=points, ...)",
                )
            )

    def point_fn(
        self, group: int, code: int
    ) -> Callable[[nn.Module, Any, torch.Tensor, torch.Tensor], torch.Tensor]:
        """``f(module, params, x_i, y_i) -> r_i`` (a vector of ``m``) of one point of
        ``group`` whose target has ``code`` (see `batch`), with the leading columns
        dropped and the weight applied."""
        rows = self.point_rows(group, code)

        def one(module: nn.Module, params: Any, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
            return rows(PointModel(module, params), xi, yi)

        return one

    def point_rows(
        self, group: int, code: int
    ) -> Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]:
        """``f(u, x_i, y_i) -> r_i`` (a vector of ``m``) of one point of ``group`` whose
        target has ``code`` (see `batch`), for any ``u`` that answers as a `PointModel`."""
        g = self.groups[group]

        def one(u: Any, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
            target = yi[2] if code < 0 else yi[2 : 2 + code]
            return (g.weight * g.fn(u, xi, target)).reshape(-1)

        return one

    def rows(
        self,
        module: nn.Module,
        params: Mapping[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> torch.Tensor:
        """The ``b × m`` residuals of the ``b`` points of ``x`` (a graph through ``params``
        when they carry one)."""
        sorting = self.grouped(y)
        if sorting is not None:
            order, restore = (i.to(x.device) for i in sorting)
            return self.rows(module, params, x[order], y[order])[restore]
        blocks = []
        for group, code, lo, hi in self.runs(y):
            one = self.point_fn(group, code)
            blocks.append(
                vmap(lambda xi, yi, one=one: one(module, params, xi, yi))(x[lo:hi], y[lo:hi])
            )
        return self.stack(blocks)

    def stack(self, blocks: list[torch.Tensor]) -> torch.Tensor:
        """The groups' residual blocks as one ``b × m`` matrix (``m`` checked to agree)."""
        widths = {int(b.reshape(b.shape[0], -1).shape[1]) for b in blocks}
        if len(widths) > 1:
            raise ResidualShapeError(
                message(
                    "every group of a PointResidual to give the same number of residuals "
                    "per point was expected",
                    f"the groups give {sorted(widths)}",
                    "return a scalar (or vectors of one length) from every group's fn",
                )
            )
        flat = [b.reshape(b.shape[0], -1) for b in blocks]
        return flat[0] if len(flat) == 1 else torch.cat(flat)

    def check_model(self, dtype: torch.dtype) -> None:
        """Refuse a model whose parameters are not in this residual's dtype."""
        if dtype != self.dtype:
            raise ParameterDtypeError(
                message(
                    f"a model in {self.dtype} for {self!r} was expected",
                    f"its parameters are {dtype}",
                    f"call model.to({self.dtype}) before building the LMA (float64 keeps the "
                    "digits that −Δu − f and JᵀJ cancel), or pass PointResidual(..., "
                    f"dtype={dtype}) to keep {dtype}",
                )
            )

    def graph_factor(self, dims: int) -> int:
        """Memory of one point's input-derivative graph, in units of its plain forward:
        a second derivative by forward-over-reverse (``torch.func.hessian``) keeps the
        forward, its backward and ``d`` tangents of each, ``2·(d + 1)``."""
        return 2 * (max(1, dims) + 1)


def piecewise_linear_layers(model: nn.Module) -> list[str]:
    """Names of the layers of ``model`` whose second derivative is zero (ReLU and kin)."""
    return [
        f"{name} ({type(m).__name__})" if name else type(m).__name__
        for name, m in model.named_modules()
        if isinstance(m, _PIECEWISE_LINEAR)
    ]


#: ``residual_fn(outputs, targets)``: residuals as a function of the model's outputs.
ResidualFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: Either form of residual the engine serves.
AnyResidual = ResidualFn | PointResidual
