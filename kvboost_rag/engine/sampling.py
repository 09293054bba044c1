"""Sampling settings and the next-token choice."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import torch

from .inputs import check_int, check_seed, check_stop, check_temperature, check_top_p


@dataclass(slots=True)
class SamplingParams:
    """temperature 0 is greedy; top_k 0 and top_p 1 switch those filters off; stop "" is an error."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)  # a str or None is taken too
    ignore_eos: bool = False  # decode past end-of-sequence tokens (benchmarks: answers of a fixed length)

    def __post_init__(self) -> None:
        """Every setting checked here, at construction, so a bad one fails before any model work."""
        self.max_new_tokens = check_int(self.max_new_tokens, "max_new_tokens", 1)
        self.temperature = check_temperature(self.temperature)
        self.top_p = check_top_p(self.top_p)
        self.top_k = check_int(self.top_k, "top_k", 0)
        self.seed = check_seed(self.seed)
        self.stop = check_stop(self.stop)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")

    def generator(self, device: torch.device) -> torch.Generator | None:
        if self.temperature == 0:
            return None
        seed = self.seed if self.seed is not None else secrets.randbits(63)
        return torch.Generator(device=device).manual_seed(seed)


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Next token id from fp32 logits [vocab]."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    scores = logits / params.temperature
    if params.top_k:
        kth = torch.topk(scores, min(params.top_k, scores.numel())).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_scores, dim=-1) >= params.top_p  # keep the token crossing top_p
        scores = scores.scatter(0, order, sorted_scores.masked_fill(drop, float("-inf")))
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
