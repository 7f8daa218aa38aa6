"""The fields the three MNIST bandit experiments share, declared once."""

from __future__ import annotations

from targetpo.mnist.data import DATASETS
from targetpo.runs.config import ETA_MIN, RunConfig, config, default, param


# Group PG's step is u/η, not renormalised: Adam's v = (1 − β₂)·g² overflows float32 once g passes ~1e20 (η ≈ 1e-22
# on these networks); 1e-15 keeps five orders of margin. TPO and DG stay finite at any η ≥ ETA_MIN.
GROUP_PG_ETA_MIN = 1e-15


@config
class MnistConfig(RunConfig):
    # The loops of these experiments keep their tensors on the CPU; `mnist` and `mnist-mechanism` (mnist.train.train)
    # take --device cuda as well.
    DEVICES = ("cpu",)
    seeds = default(10, help="independent seeds, vectorised as one batched network")
    steps: int = param(4000, "Adam updates (one batch each)", ge=1)
    batch: int = param(100, "images per update, drawn uniformly with replacement (GRPO standardizes over it)",
                       ge=2)
    lr: float = param(1e-3, "Adam learning rate", gt=0)
    eta: float = param(1.0, "temperature of TPO's target and DG's gate", ge=ETA_MIN)
    eval_every: int = param(200, "updates between test-error evaluations (steps must be a multiple)", ge=1)
    hidden: int = param(50, "width of both hidden layers", ge=1)
    dataset: str = param("mnist", "mnist or fashion-mnist (same IDX format)", choices=DATASETS)
    data_dir: str | None = param(None, "directory with the IDX files (default: $TARGETPO_MNIST_DIR; fashion-mnist: "
                                 "$TARGETPO_FASHION_MNIST_DIR, else /usr/share/datasets/fashion-mnist)")
    download: bool = param(False, "fetch the official files (MD5-checked) into data_dir or ~/.cache/targetpo first")

    def check(self) -> None:
        if self.steps % self.eval_every:
            raise ValueError(f"steps={self.steps}: must be a multiple of eval_every ({self.eval_every})")
        if "group_pg" in getattr(self, "methods", ()) and self.eta < GROUP_PG_ETA_MIN:
            raise ValueError(f"eta={self.eta!r} with method group_pg: below {GROUP_PG_ETA_MIN:g}, Group PG's gradient "
                             "(∝ u/η) overflows Adam's float32 second moment and its weights stop moving (at 1e-24 "
                             f"it ended at the untrained 90 % error, reported as complete); use eta ≥ {GROUP_PG_ETA_MIN:g}")
