"""A prompt as the model reads it: text or chat messages to token ids, and each token's text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jinja2
import numpy as np

from .inputs import check_prompt

Prompt = str | Sequence[dict[str, str]]


class PromptTooLongError(ValueError):
    """The prompt leaves no room for a new token in the model's context window."""


class PromptTokenizer:
    """Tokenizes prompts for one model, and keeps each token's text once decoded (for chunking)."""

    def __init__(self, tokenizer: Any, name: str) -> None:
        self.tokenizer = tokenizer
        self.name = name  # the model's, for errors
        self._token_texts: dict[int, str] = {}

    def tokenize(self, prompt: Prompt) -> np.ndarray:
        """The prompt's token ids; a bad prompt is a TypeError or ValueError naming what is wrong."""
        checked = check_prompt(prompt)
        if isinstance(checked, str):
            ids = self.tokenizer(checked).input_ids
        else:
            try:
                text = self.tokenizer.apply_chat_template(checked, add_generation_prompt=True, tokenize=False)
            except jinja2.TemplateError as error:  # e.g. a role or an order the template refuses
                raise ValueError(f"the chat template of {self.name} refuses these messages: {error}") from None
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
        return np.asarray(ids, dtype=np.int64)

    def token_texts(self, tokens: np.ndarray) -> list[str]:
        """The text of each token alone, as the semantic and adaptive chunkers read it."""
        missing = [int(t) for t in set(tokens.tolist()) if int(t) not in self._token_texts]
        for token, text in zip(missing, self.tokenizer.batch_decode([[t] for t in missing])):
            self._token_texts[token] = text
        return [self._token_texts[int(t)] for t in tokens]
