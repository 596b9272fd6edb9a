"""The planner: strategy by rows and parameters, mode by rules, chunks within budget."""

from __future__ import annotations

import pytest
import torch

from marquardt.jacobian import UnknownModeError, plan_jacobian


def test_strategy_follows_rows_and_parameters() -> None:
    assert plan_jacobian(100, 769, 1, torch.float32, 1 << 30).strategy == "explicit"
    assert plan_jacobian(10000, 769, 1, torch.float32, 1 << 30).strategy == "accumulate"
    forced = plan_jacobian(10000, 769, 1, torch.float32, 1 << 30, strategy="explicit")
    assert forced.strategy == "explicit" and "forced" in forced.reason


def test_mode_choice() -> None:
    plan = plan_jacobian(10000, 769, 1, torch.float32, 1 << 30)
    assert plan.mode == "layers" and plan.samples_per_chunk == 10000
    no_rules = plan_jacobian(
        10000, 769, 1, torch.float32, 1 << 30, layers_supported=False, layers_reason="BatchNorm"
    )
    assert no_rules.mode == "vmap" and "BatchNorm" in no_rules.reason
    few_params = plan_jacobian(1000, 5, 100, torch.float32, 1 << 30, layers_supported=False)
    assert few_params.mode == "jacfwd"
    fallback = plan_jacobian(
        100, 10, 1, torch.float32, 1 << 20, mode="layers", layers_supported=False
    )
    assert fallback.mode == "vmap"


@pytest.mark.parametrize("mode", ["vmap", "jacfwd", "layers"])
def test_chunks_stay_within_budget(mode: str) -> None:
    budget = 64 << 20
    plan = plan_jacobian(
        1_000_000,
        769,
        1,
        torch.float32,
        budget,
        mode=mode,
        activations_per_sample=513,
        slice_samples=1_000_000,
    )
    assert plan.chunk_bytes <= budget
    assert plan.samples_per_chunk < 1_000_000
    if mode == "jacfwd":
        # Never forward mode over all columns of a whole big slice.
        assert plan.samples_per_chunk * plan.param_chunk < 1_000_000 * 769
        assert plan.param_chunk < 769


def test_chunks_never_exceed_slice() -> None:
    plan = plan_jacobian(10000, 769, 1, torch.float64, 1 << 34, slice_samples=2500)
    assert plan.samples_per_chunk == 2500


def test_unknown_mode() -> None:
    with pytest.raises(UnknownModeError, match=r"'jacrevv'.*HINT"):
        plan_jacobian(10, 10, 1, torch.float32, 1 << 20, mode="jacrevv")


@pytest.mark.parametrize("mode", ["vmap", "layers"])
def test_accumulate_without_slice_size_caps_slices_by_the_budget(mode: str) -> None:
    # slice_size=None on one device means one slice of all N samples; accumulate must not
    # keep that: a slice is one chunk, whose J_s and workspace fit the budget at any N.
    budget = 256 << 20
    for n in (10_000, 1_000_000, 100_000_000):
        plan = plan_jacobian(
            n,
            769,
            1,
            torch.float32,
            budget,
            strategy="accumulate",
            mode=mode,
            activations_per_sample=513,
            slice_samples=n,
            cap_slices=True,
        )
        assert plan.slice_samples == min(n, plan.samples_per_chunk)
        assert plan.slice_samples * 769 * 4 <= budget
        assert plan.chunk_bytes <= budget
    # The same slice at 1M and 100M samples: memory independent of N.
    assert plan.slice_samples < 1_000_000


def test_explicit_and_given_slice_sizes_are_kept() -> None:
    explicit = plan_jacobian(
        1_000_000, 769, 1, torch.float32, 256 << 20, strategy="explicit", cap_slices=True
    )
    assert explicit.slice_samples == 1_000_000  # the backend holds J whole anyway
    given = plan_jacobian(
        1_000_000, 769, 1, torch.float32, 256 << 20, strategy="accumulate", slice_samples=500_000
    )
    assert given.slice_samples == 500_000 and given.samples_per_chunk < 500_000


def test_default_budget_on_cuda_counts_torch_cached_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Half of what a new allocation can take: driver-free 8 GiB + 60 GiB torch holds unused."""
    from marquardt.jacobian._probe import default_budget

    gib = 1 << 30
    monkeypatch.delenv("MARQUARDT_JACOBIAN_MEMORY_BUDGET", raising=False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 64 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 4 * gib)
    assert default_budget(torch.device("cuda", 0)) == 34 * gib
