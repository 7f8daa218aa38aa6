"""The supervised oracle: cross-entropy to the true label (it sees the label, which no bandit learner does)."""

from __future__ import annotations

import torch
from torch import Tensor

from targetpo.objectives._checks import LossOutput, as_float, checked, is_integer_tensor


@checked
def ce_loss(logits: Tensor, labels: Tensor) -> LossOutput:
    r"""CE oracle: L = −mean log softmax(logits)_y. `logits` [..., C], `labels` [...] int."""
    lg = as_float("logits", logits)
    if not is_integer_tensor(labels):
        got = labels.dtype if isinstance(labels, Tensor) else type(labels).__name__
        raise TypeError(f"labels must be an integer tensor of class ids, got {got}")
    if labels.shape != lg.shape[:-1]:
        raise ValueError(f"labels has shape {tuple(labels.shape)}; expected {tuple(lg.shape[:-1])} for logits {tuple(lg.shape)}")
    c = lg.shape[-1]
    if labels.numel() and (labels.min() < 0 or labels.max() >= c):
        raise ValueError(f"labels must lie in [0, {c}) (the classes of logits {tuple(lg.shape)}); got range "
                         f"[{int(labels.min())}, {int(labels.max())}]")
    logp = torch.log_softmax(lg, dim=-1)
    nll = -torch.gather(logp, -1, labels.long().unsqueeze(-1)).squeeze(-1)
    return LossOutput(nll.mean(), {"accuracy": (lg.argmax(-1) == labels).to(logp.dtype).mean()})
