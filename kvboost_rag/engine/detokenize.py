"""Incremental detokenization: an answer's text as it grows, decoding a few tokens per step.

Decoding the whole answer again at every step costs each step its length (a 1,000-token answer
decodes half a million tokens). As in TGI and vLLM, a step decodes only a window: the tokens
since the text was last complete, after the tokens that completed it then (context that keeps
a leading space or a merge as the whole decode has it). The window's text past what its first
tokens alone decode to is what the later tokens add. A window that ends inside a multi-byte
character ("\\ufffd" at its end) is not final: the next step decodes it again from the same
start, so the character comes out whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

INCOMPLETE = "\ufffd"  # what a decoder gives for the bytes of a character not yet complete


class Detokenizer:
    """The text of one answer's tokens, one token more at each call."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.text = ""  # the whole answer's text; it may end inside a character (INCOMPLETE)
        self._final = 0  # characters of `text` that no later token changes
        self._window_start = 0  # tokens [window_start:] are decoded at each step...
        self._read = 0  # ...and [window_start:read] made the text up to `_final`
        self._window_text = ""  # the text of tokens [window_start:read]

    def add(self, tokens: Sequence[int]) -> str:
        """The text of all of `tokens` (the answer so far, longer than at the last call), what
        decoding them whole would give, from a window of the last few."""
        window = self._decode(tokens[self._window_start :])
        self.text = self.text[: self._final] + window[len(self._window_text) :]
        if len(window) > len(self._window_text) and not window.endswith(INCOMPLETE):
            # complete: the next windows start with the tokens this step made final
            self._final = len(self.text)
            self._window_start, self._read = self._read, len(tokens)
            self._window_text = self._decode(tokens[self._window_start : self._read])
        return self.text

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)
