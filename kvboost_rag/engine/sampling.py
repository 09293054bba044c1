"""Sampling settings and the next-token choice.

torch is imported where a token is chosen, not with the module: the option table (and so every
`kvboost-rag` command, `--help` included) reads the settings, and torch takes seconds to import.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from .inputs import (
    check_int,
    check_min_p,
    check_repetition_penalty,
    check_seed,
    check_stop,
    check_temperature,
    check_top_p,
)

if TYPE_CHECKING:
    import torch


@dataclass(slots=True)
class SamplingParams:
    """temperature 0 is greedy; top_k 0, top_p 1, min_p 0 and repetition_penalty 1 switch those
    off; stop "" is an error."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)  # a str or None is taken too
    ignore_eos: bool = False  # decode past end-of-sequence tokens (benchmarks: answers of a fixed length)
    # tokens below min_p x the likeliest token's probability are dropped (after the temperature)
    min_p: float = 0.0
    # logits of tokens in the prompt or the answer so far: positive ones divided by it, negative
    # ones multiplied (HF's and vLLM's repetition penalty); greedy answers take it too
    repetition_penalty: float = 1.0

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
        self.min_p = check_min_p(self.min_p)
        self.repetition_penalty = check_repetition_penalty(self.repetition_penalty)

    @classmethod
    def given(cls, sampling: SamplingParams | None, settings: tuple[Any, ...]) -> SamplingParams:
        """`sampling`, or the settings given one by one (in the fields' order; None: the default), not both."""
        given = {f.name: value for f, value in zip(fields(cls), settings) if value is not None}
        if sampling is not None and given:
            raise TypeError(f"give sampling= or {', '.join(given)}, not both")
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        return sampling if sampling is not None else cls(**given)

    def generator(self, device: torch.device) -> torch.Generator | None:
        import torch

        if self.temperature == 0:
            return None
        seed = self.seed if self.seed is not None else secrets.randbits(63)
        return torch.Generator(device=device).manual_seed(seed)

    def seen_tokens(self, prompt: np.ndarray, logits: torch.Tensor) -> torch.Tensor | None:
        """The mask over the vocabulary the repetition penalty applies to, the prompt's tokens
        marked (the decode marks each answer token); None when the penalty is off."""
        import torch

        if self.repetition_penalty == 1:
            return None
        seen = torch.zeros(logits.numel(), dtype=torch.bool, device=logits.device)
        ids = torch.from_numpy(np.asarray(prompt, dtype=np.int64)).to(logits.device)
        seen[ids[(ids >= 0) & (ids < seen.numel())]] = True
        return seen


def penalize_repetition(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Seen tokens made less likely: a positive logit divided by `penalty`, a negative one multiplied."""
    import torch

    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def sampling_scores(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The logits after temperature, top-k, top-p and min-p (dropped tokens at -inf); temperature > 0."""
    import torch

    scores = logits / params.temperature
    if params.top_k:
        kth = torch.topk(scores, min(params.top_k, scores.numel())).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_scores, dim=-1) >= params.top_p  # keep the token crossing top_p
        scores = scores.scatter(0, order, sorted_scores.masked_fill(drop, float("-inf")))
    if params.min_p:
        probs = torch.softmax(scores, dim=-1)
        scores = scores.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return scores


def sample_token(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    seen: torch.Tensor | None = None,
) -> int:
    """Next token id from fp32 logits [vocab]; `seen` (from `SamplingParams.seen_tokens`) marks
    the tokens the repetition penalty applies to."""
    import torch

    if seen is not None:
        logits = penalize_repetition(logits, seen, params.repetition_penalty)
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(sampling_scores(logits, params), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
