"""The decode loop, as small steps: exactness, sampling, text and stops, the next forward pass.

After the prefill, each step first asks the exactness policy whether the answer should go on
from exact KV (`ExactnessConfig`): with `refresh` from the second token, and before any
near-tie is taken on moved KV (how near, the step reads off the logits: `DecodeObserver.lead`).
An observer sees every step, so evaluations and tests watch the loop through a public seam
instead of patching it. The text grows by incremental detokenization (`detokenize`). Where the
answer's last tokens appeared before, the tokens that followed them are verified in one pass
(`speculation`): the loop then samples several tokens from one pass, the same tokens it would
have sampled one step at a time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..config import DEFAULT_MAX_RUNNING
from ..hf.cache import forward_last_logits, make_cache
from ..hf.step import decode_step_logits, step_for
from ..ops.logits import top_margin
from .batching import STEP, StepBatcher
from .compute import Compute
from .detokenize import Detokenizer
from .request import Request
from .sampling import sample_token
from .speculation import DRAFT_BELOW_TOKENS, Drafted, PromptLookup
from .stops import find_stop, held_back


class DecodeObserver:
    """Hooks on the decode steps: the `on_` ones watch and do nothing unless overridden; `lead`
    is what the exactness policy reads."""

    def on_prefill(self, request: Request) -> None:
        """The prompt is prefilled: `request.plan`, `.logits` and `.cache` are set."""

    def on_exact(self, request: Request) -> None:
        """The answer goes on from exact KV from `request.exact_from` on."""

    def on_token(self, request: Request, token: int) -> None:
        """`token` was sampled from `request.logits` (before it is checked for a stop)."""

    def lead(self, request: Request) -> float:
        """How clearly the next token wins: its probability minus the runner-up's, from
        `request.logits`. Read where the exactness policy checks a token; an evaluation
        overrides it to script near-ties."""
        assert request.logits is not None  # set by the prefill, before any step
        return top_margin(request.logits)


class Decoder:
    """Runs the decode loop of requests on one model; their steps run in the batch (`batching.py`)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        compute: Compute,
        stop_ids: set[int],
        draft_tokens: int = 0,
        cuda_graphs: bool = True,
        max_running: int = DEFAULT_MAX_RUNNING,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.compute = compute
        self.stop_ids = stop_ids
        self.device = next(model.parameters()).device
        self.batcher = StepBatcher(model, compute, cuda_graphs, max_running)  # concurrent requests step together
        # tokens drafted a pass (`speculation`): on a CPU, where it is measured, for models that
        # take the decode step where its rows give each step's logits to the bit (`rows_match_steps`)
        self.draft_tokens = draft_tokens if self.device.type == "cpu" else 0

    def run(self, request: Request, max_new: int, observer: DecodeObserver) -> Iterator[Any]:
        """Text deltas until an end-of-sequence token, a stop string, `max_new` tokens or the
        deadline; `request.finish` says which; `STEP` where the batch is to run the next forward
        pass (`batching.py`). However it ends (closed by a caller that went away included), the
        request leaves the running batch at once."""
        try:
            yield from self._steps(request, max_new, observer)
        finally:
            unread = request.step_logits  # closed at a step that verified a draft it never read
            if unread is not None and len(unread) > 1:
                self.batcher.drop_last(request, len(unread) - 1)
            self.batcher.leave(request)
            self.drop_drafted(request)  # the cache holds the answer's tokens and no draft

    def _steps(self, request: Request, max_new: int, observer: DecodeObserver) -> Iterator[Any]:
        observer.on_prefill(request)
        params = request.asked.params
        assert request.logits is not None  # set by the prefill, before the decode (and by every step)
        generator = params.generator(request.logits.device)
        seen = params.seen_tokens(request.asked.tokens, request.logits)  # the repetition penalty's; None: off
        detokenizer = Detokenizer(self.tokenizer)
        mark = time.perf_counter()
        while True:
            if self.needs_exact(request, observer):
                self.go_exact(request)
                observer.on_exact(request)
                mark = time.perf_counter()
            token = sample_token(request.logits, params, generator, seen)
            if seen is not None:
                seen[token] = True
            observer.on_token(request, token)
            if not request.generated:  # the first token: an end-of-sequence one breaks out below
                request.stats.timings.sample_s = time.perf_counter() - mark
                request.stats.ttft_s = time.perf_counter() - request.asked.started
            elif len(request.generated) == 1:
                request.stats.second_token_s = time.perf_counter() - request.asked.started
            if token in self.stop_ids and not params.ignore_eos:
                request.finish = "eos"
                break
            request.generated.append(token)
            delta = self.take_text(request, detokenizer)
            if request.finish == "stop":
                break
            if delta:
                yield delta
            if len(request.generated) >= max_new:
                break
            if time.perf_counter() > request.asked.deadline:
                request.finish = "timeout"
                break
            if not request.exact and request.asked.exactness.refresh:
                continue  # the next token comes from exact KV: a step on moved KV would be wasted
            yield from self.step(request, max_new - len(request.generated))
        if len(request.text) > request.emitted:
            yield request.text[request.emitted :]
            request.emitted = len(request.text)

    def needs_exact(self, request: Request, observer: DecodeObserver) -> bool:
        """Whether the next token must come from exact KV (the exactness policy)."""
        if request.exact:
            return False
        policy = request.asked.exactness
        if policy.refresh and request.generated:
            return True
        return policy.checks(len(request.generated)) and observer.lead(request) < policy.verify_margin

    def go_exact(self, request: Request) -> None:
        """Recompute the prompt and the answer so far as full prefill would, and go on from there."""
        started = time.perf_counter()
        request.drafted = None  # the new cache holds no draft
        request.cache, request.slot_positions, request.logits = self.exact_prefill(
            request.asked.tokens, request.generated
        )
        request.exact, request.exact_end, request.exact_from = True, len(request.asked.tokens), len(request.generated)
        request.stats.recomputed_tokens += len(request.asked.tokens) + len(request.generated)
        if request.sparse_decode is not None:
            request.sparse_decode.forget()  # its page summaries described the replaced cache
        spent = time.perf_counter() - started
        request.stats.refresh_s += spent
        if not request.generated:
            request.stats.timings.verify_s = spent
            if request.asked.return_first_logits:
                request.stats.first_logits = request.logits.cpu()

    def take_text(self, request: Request, detokenizer: Detokenizer) -> str:
        """The newly safe text after the last token; sets finish "stop" at a stop string."""
        stops = request.asked.params.stop
        text = detokenizer.add(request.generated)
        longest = max((len(s) for s in stops), default=0)
        cut = find_stop(text, stops, max(0, request.emitted - longest))
        if cut is not None:
            request.text, request.finish = text[:cut], "stop"
            return ""
        request.text = text
        safe = len(text) - held_back(text, stops)
        if safe <= request.emitted:
            return ""
        delta, request.emitted = text[request.emitted : safe], safe
        return delta

    def step(self, request: Request, room: int) -> Iterator[Any]:
        """One forward pass of the last token (and of a draft after it, `room`: how many tokens
        the answer may still take) with the other running requests (`STEP`: the batch runs it);
        none where a verified draft holds the logits already; here, through the model's forward,
        while decode-time KV retrieval runs."""
        if request.sparse_decode is not None:
            request.logits = self.compute.run(self.batcher.step_alone, request)
            return
        if self.take_drafted(request):
            return
        request.proposed = self.propose(request, room)
        yield STEP
        rows, request.step_logits = request.step_logits, None
        assert rows is not None  # set by the batch's step
        request.logits = rows[0]
        if len(rows) > 1:  # the draft was verified: the logits after each of its tokens
            request.drafted = Drafted(request.proposed, list(rows[1:]))
            request.stats.drafted_tokens += len(request.proposed)
        request.proposed = []

    def take_drafted(self, request: Request) -> bool:
        """The logits after the last token, where a verified draft holds them; a draft the answer
        parted from is dropped, its K/V with it."""
        if request.drafted is None:
            return False
        logits = request.drafted.take(request.generated[-1])
        if logits is None:
            self.drop_drafted(request)
            return False
        request.logits = logits
        request.stats.accepted_tokens += 1
        return True

    def drop_drafted(self, request: Request) -> None:
        drafted, request.drafted = request.drafted, None
        if drafted is not None and drafted.tokens:
            self.batcher.drop_last(request, len(drafted.tokens))

    def propose(self, request: Request, room: int) -> list[int]:
        """A draft to verify with the next step (`speculation`), while the request decodes alone and
        its cache is short enough for a longer row to pay; [] where none is made."""
        if not self.draft_tokens or room < 2 or self.batcher.running > 1 or request.next_position > DRAFT_BELOW_TOKENS:
            return []
        if request.lookup is None:
            request.lookup = PromptLookup([int(t) for t in request.asked.tokens])
        lookup = request.lookup
        lookup.extend(request.generated[len(lookup.tokens) - len(request.asked.tokens) :])
        draft = lookup.draft(min(self.draft_tokens, room - 1))
        step = step_for(self.model)
        if not draft or step is None or not self.compute.run(step.rows_match_steps, len(draft) + 1):
            return []
        return draft

    def exact_prefill(self, tokens: np.ndarray, generated: list[int]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """The cache and next-token logits full prefill would have after `generated`: the same
        prefill, then the same one-token steps, so a token it agrees on is full prefill's to the bit.
        Returns the cache, the slot positions of the prompt and the logits."""
        # NOTE: this recomputes from position 0, exact head included: simple, and the head of a RAG
        # prompt is short.
        cache, positions = make_cache(), torch.arange(len(tokens), device=self.device)

        def recompute() -> torch.Tensor:
            logits = forward_last_logits(self.model, torch.from_numpy(tokens).to(self.device), positions, cache)
            if generated:  # one decode step each, as the answer took them
                answer = torch.tensor(generated, device=self.device)
                after = torch.arange(len(tokens), len(tokens) + len(generated), device=self.device)
                logits = decode_step_logits(self.model, answer, after, cache)
            return logits

        logits = self.compute.run(recompute)
        return cache, positions, logits
