"""KVBoostRAG: warm documents once, reuse their KV wherever they land in later prompts."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .chunk_store import ChunkEntry, ChunkStore
from .chunking import chunk_boundaries
from .config import MODES, EngineConfig, Mode, RepairConfig, RepairStrategy
from .eviction import value_norm
from .fingerprint import model_fingerprint
from .hashing import chained_prefix_hashes, content_hash, document_hash, fingerprint_from_parts
from .kv_cache import (
    forward_last_logits,
    gather_slots,
    make_cache,
    model_shape,
    rotary_module,
    stacked_kv,
    use_reuse_attention,
)
from .matching import ReusePlan, plan_reuse
from .model_loader import load_model, resolve_dtype
from .prefill import PrefillRunner
from .quantization import QuantizedTensor, quantize_keys, quantize_values
from .result import GenerationResult, StageTimings, WarmReport
from .sampling import SamplingParams, held_back, sample_token, top_margin

Prompt = str | Sequence[dict[str, str]]


class PromptTooLongError(ValueError):
    """The prompt leaves no room for a new token in the model's context window."""


class GenerationStream(Iterator[str]):
    """Text deltas as each token is produced; `.result` is set once the stream is exhausted."""

    def __init__(self, steps: Iterator[str]) -> None:
        self._steps = steps
        self.result: GenerationResult | None = None

    def __next__(self) -> str:
        try:
            return next(self._steps)
        except StopIteration as done:
            self.result = done.value
            raise


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
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self.name = name
        self.reuse_supported = reuse_supported
        self.unsupported_reason = unsupported_reason
        if not reuse_supported and self.config.mode == "reuse":
            self.config.mode = "full"
        first_param = next(model.parameters())
        self.device, self.dtype = first_param.device, first_param.dtype
        self.store = store or _default_store(self.config, self.device)
        self.fingerprint = model_fingerprint(model, tokenizer, self.dtype)
        prefix = self.config.warm_prefix
        self._warm_prefix_tokens = np.asarray(tokenizer(prefix).input_ids if prefix else [], dtype=np.int64)
        # Warmed chunks depend on how they were cut, encoded and kept too: their keys say so.
        self.document_fingerprint = fingerprint_from_parts(
            [
                self.fingerprint,
                self._warm_prefix_tokens.tobytes(),
                self.config.kv_quantization or "",
                f"{self.config.chunking}:{self.config.chunk_size}:{self.config.adaptive_slack}",
            ]
        )
        self._prefix_kv: tuple[torch.Tensor, torch.Tensor] | None = None
        self._prefix_lock = threading.Lock()
        text_config = model.config.get_text_config(decoder=True)
        self.max_context: int = int(getattr(text_config, "max_position_embeddings", 0) or 2**31 - 1)
        self._model_lock = threading.Lock()
        if reuse_supported:
            use_reuse_attention(model)  # reuse passes are few queries over a long cache
        self._prefill = PrefillRunner(model, rotary_module(model) if reuse_supported else None, self._model_lock)
        self._token_texts: dict[int, str] = {}
        self._stop_ids = _eos_ids(model, tokenizer)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str] | None = None,
        *,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device | None = None,
        allow_unsupported: bool = False,
        config: EngineConfig | None = None,
        **config_overrides: Any,
    ) -> KVBoostRAG:
        """Any HF RoPE decoder by hub name, folder or GGUF file; None is the embedded default.

        dtype defaults to bfloat16 (see README: ~2x faster than fp32 on CPU at equal greedy
        agreement); device to CUDA when present.
        """
        if config is not None and config_overrides:
            raise ValueError("pass either config or config keyword overrides, not both")
        config = config or EngineConfig(**config_overrides)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        loaded = load_model(name_or_path, resolve_dtype(dtype), device, allow_unsupported)
        return cls(
            loaded.model,
            loaded.tokenizer,
            config,
            name=loaded.name,
            reuse_supported=loaded.reuse_supported,
            unsupported_reason=loaded.unsupported_reason,
        )

    # documents ---------------------------------------------------------------------------
    def warm(self, documents: str | Iterable[str], *, pin: bool = False) -> WarmReport:
        """Encode each document alone, in one pass, and store it chunk by chunk.

        A document already warm is skipped without any model work. `pin` keeps its chunks in
        memory whatever the budget asks.
        """
        started = time.perf_counter()
        texts = [documents] if isinstance(documents, str) else list(documents)
        tokenized = [self._document_tokens(i, text) for i, text in enumerate(texts)]
        report = WarmReport(documents=len(texts))
        for tokens in tokenized:
            doc_key = document_hash(self.document_fingerprint, tokens)
            if self.store.has_document(doc_key):
                report.skipped_documents += 1
            else:
                report.chunks_stored += self._encode_document(doc_key, tokens)
                report.tokens_encoded += len(tokens)
            if pin:
                self.store.pin_document(doc_key)
        report.seconds = time.perf_counter() - started
        return report

    def _document_tokens(self, index: int, text: Any) -> np.ndarray:
        if not isinstance(text, str):
            raise TypeError(f"document {index} is a {type(text).__name__}, expected str")
        tokens = np.asarray(self.tokenizer(text, add_special_tokens=False).input_ids, dtype=np.int64)
        if len(tokens) == 0:
            raise ValueError(f"document {index} is empty")
        if len(tokens) > self.max_context:
            raise ValueError(
                f"document {index} has {len(tokens)} tokens, over the context window of {self.max_context}"
            )
        return tokens

    def _encode_document(self, doc_key: bytes, tokens: np.ndarray) -> int:
        """One pass over the document after the warm prefix; the prefix's own KV is not kept."""
        prefix_keys, prefix_values = self._warm_prefix_kv()
        start = prefix_keys.shape[2]
        cache = make_cache(prefix_keys, prefix_values)
        ids = torch.from_numpy(tokens).to(self.device)
        with self._model_lock:
            forward_last_logits(self.model, ids, torch.arange(start, start + len(tokens), device=self.device), cache)
        keys, values = stacked_kv(cache)
        boundaries = self._boundaries(tokens)
        # NOTE: after a warm prefix the chunks' context is not the document alone, so they are
        # APPROXIMATE candidates only; without one, a prompt starting with the document hits EXACT.
        prefixes = chained_prefix_hashes(self.fingerprint, tokens, boundaries) if start == 0 else None
        fingerprint = self.document_fingerprint
        contents = [content_hash(fingerprint, tokens[s:e]) for s, e in zip(boundaries[:-1], boundaries[1:])]
        stored = 0
        for i, (chunk_start, chunk_end) in enumerate(zip(boundaries[:-1], boundaries[1:])):
            entry = ChunkEntry(
                tokens=tokens[chunk_start:chunk_end].copy(),
                keys=self._stored(keys[:, :, start + chunk_start : start + chunk_end], quantize_keys),
                values=self._stored(values[:, :, start + chunk_start : start + chunk_end], quantize_values),
                base_position=start + chunk_start,
                fingerprint=fingerprint,
                content_hash=contents[i],
                prefix_hash=prefixes[i] if prefixes else None,
                next_chunk=contents[i + 1] if i + 1 < len(contents) else None,
                importance=value_norm(values[:, :, start + chunk_start : start + chunk_end]),
            )
            stored += self.store.put(entry)
        self.store.add_document(doc_key, contents, fingerprint, len(tokens))
        return stored

    def _stored(self, kv: torch.Tensor, quantizer: Any) -> torch.Tensor | QuantizedTensor:
        """A chunk's slice as kept: quantized, or cloned so it does not pin its whole document."""
        kind = self.config.kv_quantization
        return quantizer(kv, kind) if kind else kv.clone()

    def _warm_prefix_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """KV of the warm prefix, computed once."""
        with self._prefix_lock:
            if self._prefix_kv is None:
                cache = make_cache()
                if len(self._warm_prefix_tokens):
                    ids = torch.from_numpy(self._warm_prefix_tokens).to(self.device)
                    with self._model_lock:
                        forward_last_logits(self.model, ids, torch.arange(len(ids), device=self.device), cache)
                    self._prefix_kv = stacked_kv(cache)
                else:
                    layers, heads, head_dim = model_shape(self.model)
                    empty = torch.empty(layers, heads, 0, head_dim, dtype=self.dtype, device=self.device)
                    self._prefix_kv = (empty, empty)
            return self._prefix_kv

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
        mode: Mode | None = None,
        repair: RepairStrategy | RepairConfig | None = None,
        store_prompt: bool | None = None,
        return_first_logits: bool = False,
        timeout_s: float | None = None,
    ) -> GenerationStream:
        """Stream text deltas; bad input raises here, before any model work.

        `repair` overrides the engine's repair (a strategy name or a RepairConfig);
        `return_first_logits` keeps the first token's fp32 logits on the result, for evals;
        `timeout_s` ends decoding once that much time has passed (finish_reason "timeout").
        """
        started = time.perf_counter()
        params = SamplingParams(max_new_tokens, temperature, top_p, top_k, seed, list(stop or []))
        mode = self._check_mode(mode)
        repair_config = self.config.repair.with_strategy(repair)
        tokens = self.tokenize_prompt(prompt)
        tokenize_s = time.perf_counter() - started
        if len(tokens) >= self.max_context:
            raise PromptTooLongError(
                f"prompt has {len(tokens)} tokens; the context window of {self.name} is {self.max_context}"
            )
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        deadline = started + timeout_s if timeout_s is not None else float("inf")
        store_prompt = self.config.store_prompt_prefixes if store_prompt is None else store_prompt
        steps = self._run(
            tokens,
            params,
            mode,
            repair_config,
            store_prompt and mode != "full",
            return_first_logits,
            started,
            tokenize_s,
            deadline,
        )
        return GenerationStream(steps)

    def next_token_logits(
        self, prompt: Prompt, *, mode: Mode | None = None, repair: RepairStrategy | RepairConfig | None = None
    ) -> tuple[torch.Tensor, ReusePlan]:
        """fp32 logits of the first new token and how the prompt was served; stores nothing."""
        mode = self._check_mode(mode)
        tokens = self.tokenize_prompt(prompt)
        plan = self._plan(tokens, self._boundaries(tokens), mode)
        prefill = self._prefill.run(tokens, plan, StageTimings(), self.config.repair.with_strategy(repair))
        return prefill.logits, plan

    def tokenize_prompt(self, prompt: Prompt) -> np.ndarray:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt is empty")
            ids = self.tokenizer(prompt).input_ids
        else:
            messages = list(prompt)
            if not messages or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
                raise ValueError("chat prompt must be a non-empty list of {'role': ..., 'content': ...} messages")
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
        return np.asarray(ids, dtype=np.int64)

    def _check_mode(self, mode: Mode | None) -> Mode:
        mode = mode or self.config.mode
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "reuse" and not self.reuse_supported:
            raise ValueError(f"reuse is off for {self.name}: {self.unsupported_reason}")
        return mode

    def _run(
        self,
        tokens: np.ndarray,
        params: SamplingParams,
        mode: Mode,
        repair: RepairConfig,
        store_prompt: bool,
        return_first_logits: bool,
        started: float,
        tokenize_s: float,
        deadline: float,
    ) -> Iterator[str]:
        timings = StageTimings(tokenize_s=tokenize_s)
        mark = time.perf_counter()
        boundaries = self._boundaries(tokens)
        plan = self._plan(tokens, boundaries, mode)
        timings.lookup_s, mark = time.perf_counter() - mark, time.perf_counter()
        prefill = self._prefill.run(tokens, plan, timings, repair)
        cache, logits, slot_positions = prefill.cache, prefill.logits, prefill.slot_positions
        exact = plan.tokens("approximate") == 0  # False while the answer reads moved KV
        refresh_s, exact_end, exact_from = 0.0, plan.exact_end, None
        first_logits = logits.cpu() if return_first_logits else None
        mark = time.perf_counter()

        generator = params.generator(logits.device)
        max_new = min(params.max_new_tokens, self.max_context - len(tokens))
        generated: list[int] = []
        emitted, text, finish, ttft = 0, "", "length", 0.0
        while True:
            if not exact and (
                repair.refresh and generated or repair.verify_margin and top_margin(logits) < repair.verify_margin
            ):
                # From here on the answer reads exact KV: with refresh from the second token, and
                # before any near-tie on moved KV is taken.
                started_refresh = time.perf_counter()
                cache, slot_positions, logits = self._exact_prefill(tokens, generated)
                exact, exact_end, exact_from = True, len(tokens), len(generated)
                mark = time.perf_counter()
                spent = mark - started_refresh
                refresh_s += spent
                if not generated:
                    timings.verify_s = spent
                    first_logits = logits.cpu() if return_first_logits else None
            token = sample_token(logits, params, generator)
            if not generated:  # the first token: an end-of-sequence one breaks out below
                timings.sample_s = time.perf_counter() - mark
                ttft = time.perf_counter() - started
            if token in self._stop_ids:
                finish = "eos"
                break
            generated.append(token)
            text = self.tokenizer.decode(generated, skip_special_tokens=True)
            cut = _find_stop(text, params.stop, max(0, emitted - max((len(s) for s in params.stop), default=0)))
            if cut is not None:
                text, finish = text[:cut], "stop"
                break
            safe = len(text) - held_back(text, params.stop)
            if safe > emitted:
                yield text[emitted:safe]
                emitted = safe
            if len(generated) >= max_new:
                break
            if time.perf_counter() > deadline:
                finish = "timeout"
                break
            if not exact and repair.refresh:
                continue  # the next token comes from exact KV (above): a step on moved KV would be wasted
            position = torch.tensor([len(tokens) + len(generated) - 1], device=self.device)
            with self._model_lock:
                logits = forward_last_logits(self.model, torch.tensor([token], device=self.device), position, cache)
        if len(text) > emitted:
            yield text[emitted:]
        if store_prompt:
            self._store_prompt_chunks(tokens, boundaries, plan, cache, slot_positions, exact_end)
        return GenerationResult(
            text=text,
            mode=mode,
            finish_reason=finish,  # type: ignore[arg-type]
            ttft_s=ttft,
            total_s=time.perf_counter() - started,
            prompt_tokens=len(tokens),
            new_tokens=len(generated),
            reused_exact_tokens=plan.tokens("exact"),
            reused_approximate_tokens=plan.tokens("approximate"),
            computed_tokens=plan.tokens("computed"),
            exact_chunks=plan.exact_chunks,
            approximate_chunks=plan.approximate_chunks,
            missed_chunks=plan.missed_chunks,
            repair_strategy=repair.strategy if mode == "reuse" else "none",
            repair_tokens=prefill.repair_tokens,
            timings=timings,
            refresh_s=refresh_s,
            exact_from=exact_from,
            token_ids=generated,
            first_logits=first_logits,
        )

    def _exact_prefill(self, tokens: np.ndarray, generated: list[int]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """The cache and next-token logits full prefill would have after `generated`: the same
        prefill, then the same one-token steps, so a token it agrees on is full prefill's to the bit.
        Returns the cache, the slot positions of the prompt and the logits."""
        # NOTE: this recomputes from position 0, exact head included: simple, and the head of a RAG
        # prompt is short.
        cache, positions = make_cache(), torch.arange(len(tokens), device=self.device)
        with self._model_lock:
            logits = forward_last_logits(self.model, torch.from_numpy(tokens).to(self.device), positions, cache)
            for i, token in enumerate(generated):
                position = torch.tensor([len(tokens) + i], device=self.device)
                logits = forward_last_logits(self.model, torch.tensor([token], device=self.device), position, cache)
        return cache, positions, logits

    def _store_prompt_chunks(
        self,
        tokens: np.ndarray,
        boundaries: list[int],
        plan: ReusePlan,
        cache: Any,
        slot_positions: torch.Tensor,
        exact_end: int,
    ) -> None:
        """Keep the prompt's exactly computed chunks (those before `exact_end`) for later EXACT
        (prefix) hits."""
        prefixes = chained_prefix_hashes(self.fingerprint, tokens, boundaries)
        slot_of_position = torch.argsort(slot_positions)
        for i, (start, end) in enumerate(zip(boundaries[:-1], boundaries[1:])):
            if end > exact_end or end - start < self.config.chunk_size and end == len(tokens):
                break  # NOTE: a partial last chunk would never be hit: the next prompt's differs
            if i < plan.exact_chunks:
                continue
            keys, values = gather_slots(cache, slot_of_position[start:end])
            self.store.put(
                ChunkEntry(
                    tokens=tokens[start:end].copy(),
                    keys=keys,
                    values=values,
                    base_position=start,
                    fingerprint=self.fingerprint,
                    content_hash=content_hash(self.fingerprint, tokens[start:end]),
                    prefix_hash=prefixes[i],
                    approximate_ok=False,
                )
            )

    def _plan(self, tokens: np.ndarray, boundaries: list[int], mode: Mode) -> ReusePlan:
        return plan_reuse(tokens, boundaries, self.store, self.fingerprint, self.document_fingerprint, mode)

    def _boundaries(self, tokens: np.ndarray) -> list[int]:
        strategy = self.config.chunking
        texts = None if strategy == "fixed" else self._texts_of(tokens)
        return chunk_boundaries(texts, len(tokens), strategy, self.config.chunk_size, self.config.adaptive_slack)

    def _texts_of(self, tokens: np.ndarray) -> list[str]:
        missing = [int(t) for t in set(tokens.tolist()) if int(t) not in self._token_texts]
        for token, text in zip(missing, self.tokenizer.batch_decode([[t] for t in missing])):
            self._token_texts[token] = text
        return [self._token_texts[int(t)] for t in tokens]


def _default_store(config: EngineConfig, device: torch.device) -> ChunkStore:
    disk = None
    if config.cache_dir is not None:
        from .disk_store import DiskStore

        disk = DiskStore(config.cache_dir, config.match_window, device, config.disk_budget_bytes)
    return ChunkStore(config.memory_budget_bytes, config.match_window, disk=disk)


def _find_stop(text: str, stops: list[str], search_from: int) -> int | None:
    found = [i for i in (text.find(s, search_from) for s in stops) if i >= 0]
    return min(found) if found else None


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None)
        if value is not None:
            ids.update([value] if isinstance(value, int) else value)
    return ids
