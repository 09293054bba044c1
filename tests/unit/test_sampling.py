"""The sampler's min-p and repetition penalty, against numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kvboost_rag.engine.sampling import SamplingParams, penalize_repetition, sample_token, sampling_scores


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens() -> None:
    logits = torch.tensor([3.0, 2.0, -1.0, 0.5])
    seen = torch.tensor([True, False, True, False])
    assert penalize_repetition(logits, seen, 2.0).tolist() == [1.5, 2.0, -2.0, 0.5]
    params = SamplingParams(repetition_penalty=2.0)  # greedy: token 0 led, 1 wins once 0 is penalized
    assert sample_token(logits, params, None) == 0, "no seen tokens given: no penalty"
    assert sample_token(logits, params, None, seen) == 1


def test_seen_tokens_are_the_prompts_and_none_when_the_penalty_is_off() -> None:
    logits = torch.zeros(6)
    seen = SamplingParams(repetition_penalty=1.2).seen_tokens(np.array([4, 1, 4, 9]), logits)
    assert seen is not None and seen.tolist() == [False, True, False, False, True, False], "ids past the vocab left"
    assert SamplingParams().seen_tokens(np.array([1]), logits) is None


def test_min_p_drops_tokens_below_its_share_of_the_likeliest() -> None:
    probs = [0.5, 0.3, 0.15, 0.05]
    logits = torch.tensor([math.log(p) for p in probs])
    # min_p 0.2: the bar is 0.2 x 0.5 = 0.1, so 0.05 goes; the rest renormalized over 0.95
    kept = torch.softmax(sampling_scores(logits, SamplingParams(temperature=1.0, min_p=0.2)), -1)
    assert kept.tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])
    # after the temperature: at 0.5 the probabilities go as p^2 (0.25, 0.09, 0.0225, 0.0025 over
    # their sum), so the bar 0.2 x 0.25 / sum keeps only the first two
    hot = torch.softmax(sampling_scores(logits, SamplingParams(temperature=0.5, min_p=0.2)), -1)
    assert hot.tolist() == pytest.approx([0.25 / 0.34, 0.09 / 0.34, 0.0, 0.0])
    generator = torch.Generator().manual_seed(0)
    only_top = SamplingParams(temperature=1.0, min_p=1.0)
    assert {sample_token(logits, only_top, generator) for _ in range(20)} == {0}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"min_p": 1.5}, r"^min_p must be in \[0, 1\], got 1.5$"),
        ({"min_p": float("nan")}, "min_p must be in"),
        ({"repetition_penalty": 0}, "^repetition_penalty must be finite and > 0, got 0$"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty must be finite"),
    ],
)
def test_bad_settings_are_refused_at_construction(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a number"):
        SamplingParams(min_p="0.1")  # type: ignore[arg-type]
