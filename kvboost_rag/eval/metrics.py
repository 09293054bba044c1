"""NQ-Open answer metrics: SQuAD-style normalisation, best-subspan exact match, token F1."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation and articles, collapse white space."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def best_subspan_em(prediction: str, answers: Iterable[str]) -> float:
    """1.0 when any normalised gold answer occurs inside the normalised prediction."""
    predicted = f" {normalize_answer(prediction)} "
    return float(any(f" {normalize_answer(a)} " in predicted for a in answers if normalize_answer(a)))


def token_f1(prediction: str, answers: Iterable[str]) -> float:
    """Best token-overlap F1 against any gold answer."""
    predicted = normalize_answer(prediction).split()
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer).split()
        common = sum((Counter(predicted) & Counter(gold)).values())
        if common:
            precision, recall = common / len(predicted), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best
