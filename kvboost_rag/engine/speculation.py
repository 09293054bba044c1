"""Prompt lookup: the answer's next tokens drafted from the prompt, verified in one pass.

A RAG answer copies the documents it was given: names, dates, titles, whole phrases. Where the
answer's last tokens appeared earlier (in the prompt or the answer so far), the tokens that
followed them there are a draft of what comes next (prompt lookup decoding, as in transformers'
`prompt_lookup_num_tokens` and vLLM's n-gram proposer). One forward pass over the last token and
the draft gives the logits after each (a row of several tokens, `hf.step`); the decode loop samples
from them one token at a time, as it would have, and a drafted token it sampled is a step saved.

Each row of that pass reads the same calls as a step of one token (the int4 products' rows are
each row's own, attention runs per row over the cache up to the row's token), so its logits are
the ones the steps one at a time would give, to the bit: the answer is the same with or without
drafts, greedy or sampled (tests/test_speculation.py). On the default model (int4, 2 AVX-512
cores, 512 tokens) a pass of 4 rows took 1.63x a step of one, and NQ answers at k=5 decoded 1.34x
faster, 46% of their tokens from drafts (docs/research-log.md, "Issue 33, third pass"). Drafts
are made only while the request decodes alone: a batched step already shares its cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

LOOKUP_NGRAMS = 3  # the longest run of last tokens looked up (then shorter ones) ...
LOOKUP_MIN = 2  # ... down to this one: a draft after one matching token was taken too rarely to pay
# A pass's rows each attend over the whole cache: past this many cached tokens a row costs more
# than a draft saves (a pass of 4 rows took 1.63x a step at 512 tokens, 1.93x at 2,000, 2.42x
# at 4,000; at 4,000 tokens raw NQ text decoded 31 tokens/s with drafts, 40 without).
DRAFT_BELOW_TOKENS = 2048


@dataclass(slots=True)
class PromptLookup:
    """Where each run of LOOKUP_MIN..LOOKUP_NGRAMS tokens of a sequence last ended: the draft of a
    step is a dictionary lookup, never a scan of the prompt."""

    tokens: list[int] = field(default_factory=list)
    _ends: dict[tuple[int, ...], int] = field(default_factory=dict)
    _indexed: int = 0  # the runs whose (exclusive) end is at most this are in `_ends`

    def extend(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)

    def draft(self, count: int) -> list[int]:
        """Up to `count` tokens that followed the longest run (of LOOKUP_MIN to LOOKUP_NGRAMS
        tokens) matching the sequence's last tokens where it appeared last before, no more than
        that run is long: a longer match is likelier to go on (simulated with the step costs
        measured: NQ answers 1.32x faster than without drafts, as with drafts after one-token
        matches too; answers run past their end 1.21x, against 1.18x); none when no such run
        appeared."""
        end = len(self.tokens)
        self._index(end - 1)  # every run but those ending at the last token, which would find itself
        for size in range(min(LOOKUP_NGRAMS, end), LOOKUP_MIN - 1, -1):
            found = self._ends.get(tuple(self.tokens[end - size :]))
            if found is not None:
                return self.tokens[found : found + min(count, size)]
        return []

    def _index(self, upto: int) -> None:
        """Index the runs whose (exclusive) end is at most `upto`."""
        tokens, ends = self.tokens, self._ends
        for stop in range(self._indexed + 1, upto + 1):  # runs tokens[stop - size : stop]
            for size in range(LOOKUP_MIN, min(LOOKUP_NGRAMS, stop) + 1):
                ends[tuple(tokens[stop - size : stop])] = stop
        self._indexed = max(self._indexed, upto)


@dataclass(slots=True)
class Drafted:
    """The drafted tokens a pass verified, not yet sampled, and the logits after each."""

    tokens: list[int]
    logits: list[torch.Tensor]

    def take(self, token: int) -> torch.Tensor | None:
        """The logits after `token` if it is the next drafted one (it is then used up), else None."""
        if not self.tokens or self.tokens[0] != token:
            return None
        self.tokens.pop(0)
        return self.logits.pop(0)
