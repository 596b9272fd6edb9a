"""One process, no launcher: ``python train.py`` with ``nprocs=1``."""

from __future__ import annotations

from collections.abc import Mapping

from .._errors import LaunchError
from ._base import SingleProcess


class PlainEnvironment(SingleProcess):
    """A single process; no process group is created.

    Arguments:
        env: the environment variables (read, not changed; copied).
        nprocs: ``TrainConfig.nprocs``, the training processes asked for.
        gpu_count: GPUs visible to this process.
        use_gpu: whether the run trains on GPUs (the resolved ``compute_setup``).
    """

    name = "plain"

    @classmethod
    def detect(cls, env: Mapping[str, str], nprocs: int) -> bool:
        return nprocs == 1

    def validate(self) -> None:
        if self.nprocs != 1:
            raise LaunchError(
                f"plain: nprocs={self.nprocs} but no launcher started this process and only one "
                "runs. HINT: this should not happen; nprocs > 1 selects the spawn environment"
            )
        self._check_gpus()
