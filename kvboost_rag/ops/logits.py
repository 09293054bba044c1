"""Reading next-token logits: how clear a choice is, how far two distributions are apart."""

from __future__ import annotations

import torch


def top_margin(logits: torch.Tensor) -> float:
    """Probability of the most likely token minus the runner-up's: how clear a choice is."""
    top = torch.topk(torch.softmax(logits.float(), -1), 2).values
    return float(top[0] - top[1])


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> float:
    """KL(reference || other) of two next-token distributions given as logits."""
    log_p, log_q = torch.log_softmax(reference.float(), -1), torch.log_softmax(other.float(), -1)
    return float(torch.sum(log_p.exp() * (log_p - log_q)))
