"""KVBoostRAG: warm documents once, reuse their KV wherever they land in later prompts."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jinja2
import numpy as np
import torch

from ..config import MODES, EngineConfig, ExactnessConfig, Mode, RepairConfig, RepairStrategy
from ..hf.attention import use_reuse_attention
from ..hf.cache import gather_slots
from ..hf.fingerprint import model_fingerprint
from ..hf.loader import load_model, resolve_dtype
from ..hf.model import context_window, eos_ids, rotary_module
from ..hf.packed_linear import pack_linear_layers
from ..ops.decode_retrieval import DecodeRetrieval
from ..plan.chunking import chunk_boundaries
from ..plan.keys import KeySpace
from ..plan.matching import ReusePlan, plan_reuse
from ..store.memory import ChunkStore
from ..store.open import open_store, record_settings
from .decode import DecodeObserver, Decoder
from .inputs import check_documents, check_prompt, check_real
from .prefill import PrefillRunner
from .prompt_cache import conversation_tail, store_prompt_chunks, store_prompt_head
from .request import Request
from .result import GenerationResult, StageTimings, WarmReport
from .sampling import SamplingParams
from .stream import GenerationStream
from .warming import Warmer

Prompt = str | Sequence[dict[str, str]]
NO_OBSERVER = DecodeObserver()


class PromptTooLongError(ValueError):
    """The prompt leaves no room for a new token in the model's context window."""


class KVBoostRAG:
    """A HuggingFace causal LM with position-independent chunk KV reuse.

    Thread-safe: forward passes take the model lock one at a time, the store has its own lock,
    and each request keeps its own cache, so concurrent calls give the sequential outputs.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: EngineConfig | None = None,
        *,
        store: ChunkStore | None = None,
        name: str = "custom",
        reuse_supported: bool = True,
        unsupported_reason: str | None = None,
    ) -> None:
        """`store` shares an existing store; otherwise the one `config.store` names is opened
        (and its recorded settings adopted where `config` left them at their defaults)."""
        self.model = model
        self.tokenizer = tokenizer
        config = config or EngineConfig()
        self.name = name
        self.reuse_supported = reuse_supported
        self.unsupported_reason = unsupported_reason
        first_param = next(model.parameters())
        self.device, self.dtype = first_param.device, first_param.dtype
        self.fingerprint = model_fingerprint(model, tokenizer, self.dtype)
        if store is None:
            store, config = open_store(config, self.fingerprint, self.device)
        if not reuse_supported and config.mode == "reuse":
            config.mode = "full"
        self.config, self.store = config, store
        self.max_context = context_window(model)
        self._model_lock = threading.Lock()
        if reuse_supported:
            use_reuse_attention(model)  # reuse passes are few queries over a long cache
        pack_linear_layers(model)  # after the fingerprint, which hashes the weights as loaded
        self._prefill = PrefillRunner(model, rotary_module(model) if reuse_supported else None, self._model_lock)
        self._decoder = Decoder(model, tokenizer, self._model_lock, eos_ids(model, tokenizer))
        self._token_texts: dict[int, str] = {}
        prefix_tokens = np.asarray(tokenizer(config.warm_prefix).input_ids if config.warm_prefix else [], np.int64)
        # Warmed chunks depend on how they were cut, encoded and kept too: their keys say so.
        self.keys = KeySpace.derive(
            self.fingerprint,
            config.kv_quantization,
            prefix_tokens.tobytes(),
            f"{config.chunking}:{config.chunk_size}:{config.adaptive_slack}",
        )
        self.document_fingerprint = self.keys.document
        self._warmer = Warmer(
            model,
            tokenizer,
            config,
            store,
            self.keys,
            self.boundaries,
            self._model_lock,
            self.max_context,
            prefix_tokens,
        )
        self._settings_recorded = False

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str] | None = None,
        *,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device | None = None,
        allow_unsupported: bool = False,
        config: EngineConfig | None = None,
        **options: Any,
    ) -> KVBoostRAG:
        """Any HF RoPE decoder by hub name, folder or GGUF file; None is the embedded default.

        dtype defaults to bfloat16 where it is native (CUDA, CPUs with AVX512-BF16 or AMX), else
        float32; device to CUDA when present. `options` are `EngineConfig` fields; an unknown one is an error.
        """
        if config is not None and options:
            raise ValueError("pass either config or config keyword options, not both")
        config = config or EngineConfig.from_options(**options)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        loaded = load_model(name_or_path, resolve_dtype(dtype, device), device, allow_unsupported)
        return cls(
            loaded.model,
            loaded.tokenizer,
            config,
            name=loaded.name,
            reuse_supported=loaded.reuse_supported,
            unsupported_reason=loaded.unsupported_reason,
        )

    # documents ---------------------------------------------------------------------------
    def warm(
        self,
        documents: str | Iterable[str],
        *,
        pin: bool = False,
        neighbours: Sequence[Sequence[str]] | None = None,
    ) -> WarmReport:
        """Encode each document in one pass and store it chunk by chunk.

        A document already warm (however it was warmed) is skipped without any model work. `pin`
        keeps its chunks in memory whatever the budget asks. `neighbours[i]` (optional): texts
        encoded before document i, such as its nearest documents in the user's index, so its KV
        has seen what it is usually retrieved with (FusionRAG); only the document's own KV is kept.
        """
        texts = check_documents(documents)  # all of them, before the store or the model is touched
        if not self._settings_recorded:
            self._settings_recorded = record_settings(self.store, self.fingerprint, self.config)
        return self._warmer.warm(texts, pin=pin, neighbours=neighbours)

    # generation --------------------------------------------------------------------------
    def generate(self, prompt: Prompt, **kwargs: Any) -> GenerationResult:
        """Answer a prompt (text or chat messages); see `stream` for the options."""
        stream = self.stream(prompt, **kwargs)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        ignore_eos: bool = False,
        mode: Mode | None = None,
        repair: RepairStrategy | RepairConfig | None = None,
        exactness: ExactnessConfig | None = None,
        store_prompt: bool | None = None,
        return_first_logits: bool = False,
        timeout_s: float | None = None,
        observer: DecodeObserver | None = None,
    ) -> GenerationStream:
        """Stream text deltas; bad input raises here, before any model work.

        `repair` overrides the engine's prefill repair (a strategy name or a RepairConfig),
        `exactness` what the answer reads after its first token; `return_first_logits` keeps the
        first token's fp32 logits on the result, for evals; `timeout_s` ends decoding once that
        much time has passed (finish_reason "timeout"); `observer` sees every decode step;
        `ignore_eos` decodes past end-of-sequence tokens (answers of a fixed length, for benchmarks).
        """
        started = time.perf_counter()
        params = SamplingParams(max_new_tokens, temperature, top_p, top_k, seed, stop, ignore_eos)
        mode = self._check_mode(mode)
        if timeout_s is not None and not check_real(timeout_s, "timeout_s") > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        tokens = self.tokenize_prompt(prompt)
        tokenize_s = time.perf_counter() - started
        if len(tokens) >= self.max_context:
            raise PromptTooLongError(
                f"prompt has {len(tokens)} tokens; the context window of {self.name} is {self.max_context}"
            )
        store_prompt = self.config.store_prompt_prefixes if store_prompt is None else store_prompt
        request = Request(
            tokens=tokens,
            params=params,
            mode=mode,
            repair=self.config.repair.with_strategy(repair),
            exactness=exactness or self.config.exactness,
            store_prompt=store_prompt and mode != "full",
            return_first_logits=return_first_logits,
            started=started,
            deadline=started + timeout_s if timeout_s is not None else float("inf"),
            timings=StageTimings(tokenize_s=tokenize_s),
            retrieval=DecodeRetrieval(self.config.retrieval) if self.config.retrieval.applies(len(tokens)) else None,
        )
        return GenerationStream(self._run(request, observer or NO_OBSERVER))

    def plan(self, prompt: Prompt, *, mode: Mode | None = None) -> ReusePlan:
        """How a prompt would be served from the store now: which tokens are reused, and how."""
        tokens = self.tokenize_prompt(prompt)
        return self._plan(tokens, self.boundaries(tokens), self._check_mode(mode))

    def next_token_logits(
        self, prompt: Prompt, *, mode: Mode | None = None, repair: RepairStrategy | RepairConfig | None = None
    ) -> tuple[torch.Tensor, ReusePlan]:
        """fp32 logits of the first new token after the prefill (repair included) and the plan
        it ran; stores nothing. For evaluations of a prefill on its own."""
        mode = self._check_mode(mode)
        tokens = self.tokenize_prompt(prompt)
        plan = self._plan(tokens, self.boundaries(tokens), mode)
        prefill = self._prefill.run(tokens, plan, StageTimings(), self.config.repair.with_strategy(repair))
        return prefill.logits, plan

    def tokenize_prompt(self, prompt: Prompt) -> np.ndarray:
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

    def boundaries(self, tokens: np.ndarray) -> list[int]:
        """Where the engine cuts these tokens into chunks."""
        strategy = self.config.chunking
        texts = None if strategy == "fixed" else self._texts_of(tokens)
        return chunk_boundaries(texts, len(tokens), strategy, self.config.chunk_size, self.config.adaptive_slack)

    # internals ---------------------------------------------------------------------------
    def _check_mode(self, mode: Mode | None) -> Mode:
        mode = mode or self.config.mode
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "reuse" and not self.reuse_supported:
            raise ValueError(f"reuse is off for {self.name}: {self.unsupported_reason}")
        return mode

    def _run(self, request: Request, observer: DecodeObserver) -> Iterator[str]:
        timings = request.timings
        mark = time.perf_counter()
        request.boundaries = self.boundaries(request.tokens)
        request.plan = plan = self._plan(request.tokens, request.boundaries, request.mode)
        timings.lookup_s = time.perf_counter() - mark
        prefill = self._prefill.run(request.tokens, plan, timings, request.repair)
        request.cache, request.logits, request.slot_positions = prefill.cache, prefill.logits, prefill.slot_positions
        request.repair_tokens = request.recomputed_tokens = prefill.repair_tokens
        request.exact, request.exact_end = plan.tokens("approximate") == 0, plan.exact_end
        request.first_logits = prefill.logits.cpu() if request.return_first_logits else None
        max_new = min(request.params.max_new_tokens, self.max_context - len(request.tokens))
        yield from self._decoder.run(request, max_new, observer)
        if request.store_prompt:
            store_prompt_chunks(self.store, self.keys, self.config.chunk_size, request)
            store_prompt_head(self.store, self.keys, request)
            self._keep_tail(request)
        return _result(request)

    def _keep_tail(self, request: Request) -> None:
        """The turn's new tokens and answer, kept for the next turn of the conversation."""
        tail = conversation_tail(request, self.config.match_window)
        if tail is not None:
            sequence, slots, start = tail
            keys, values = gather_slots(request.cache, slots)
            self._warmer.keep(sequence, start, keys, values, exact=request.exact)

    def _plan(self, tokens: np.ndarray, boundaries: list[int], mode: Mode) -> ReusePlan:
        with self.store.serving():  # the plan's chunks are not evicted while it is made
            return plan_reuse(tokens, boundaries, self.store, self.keys, mode)

    def _texts_of(self, tokens: np.ndarray) -> list[str]:
        missing = [int(t) for t in set(tokens.tolist()) if int(t) not in self._token_texts]
        for token, text in zip(missing, self.tokenizer.batch_decode([[t] for t in missing])):
            self._token_texts[token] = text
        return [self._token_texts[int(t)] for t in tokens]


def _result(request: Request) -> GenerationResult:
    plan = request.plan
    assert plan is not None
    return GenerationResult(
        text=request.text,
        mode=request.mode,
        finish_reason=request.finish,
        ttft_s=request.ttft_s,
        second_token_s=request.second_token_s,
        total_s=time.perf_counter() - request.started,
        prompt_tokens=len(request.tokens),
        new_tokens=len(request.generated),
        reused_exact_tokens=plan.tokens("exact"),
        reused_approximate_tokens=plan.tokens("approximate"),
        computed_tokens=plan.tokens("computed"),
        exact_chunks=plan.exact_chunks,
        approximate_chunks=plan.approximate_chunks,
        missed_chunks=plan.missed_chunks,
        repair_strategy=request.repair.strategy if request.mode == "reuse" else "none",
        repair_tokens=request.repair_tokens,
        recomputed_tokens=request.recomputed_tokens,
        timings=request.timings,
        refresh_s=request.refresh_s,
        exact_from=request.exact_from,
        token_ids=request.generated,
        first_logits=request.first_logits,
        retrieval=request.retrieval.stats if request.retrieval is not None else None,
    )
