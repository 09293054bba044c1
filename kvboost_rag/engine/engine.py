"""KVBoostRAG: warm documents once, reuse their KV wherever they land in later prompts."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Generator, Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ..config import CHOOSING_STRATEGIES, MODES, EngineConfig, ExactnessConfig, Mode, RepairConfig, RepairStrategy
from ..hf.attention import use_reuse_attention
from ..hf.fingerprint import model_fingerprint
from ..hf.loader import load_model, resolve_dtype
from ..hf.model import context_window, eos_ids, rotary_module
from ..hf.packed_linear import pack_linear_layers
from ..ops.sparse_decode import SparseDecode
from ..plan.chunking import chunk_boundaries
from ..plan.keys import Fingerprint, KeySpace
from ..plan.matching import ReusePlan, plan_reuse
from ..store.chunk_store import ChunkStore
from ..store.location import StoreLocations
from ..store.open import open_store, record_settings
from .batching import Running
from .compute import process_compute
from .decode import DecodeObserver, Decoder
from .documents import DocumentWriter
from .inputs import check_documents, check_groups, check_namespace, check_real
from .keeping import AnswerKeeper
from .namespaces import SHARED, Namespace, Namespaces
from .prefill import PrefillRunner
from .prompts import Prompt, PromptTokenizer, PromptTooLongError
from .request import Asked, Request, RequestStats
from .result import GenerationResult, StageTimings, WarmReport
from .sampling import SamplingParams
from .stream import GenerationStream, finish_all
from .warming import Warmer

NO_OBSERVER = DecodeObserver()


class KVBoostRAG:
    """A HuggingFace causal LM with position-independent chunk KV reuse.

    Thread-safe: concurrent requests decode together, one forward pass a step (`batching.py`), a
    prefill runs between two steps, all model work where `compute.py` runs it; the store has its
    own lock.
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
        adapt_model: bool = True,
    ) -> None:
        """`store` shares an existing store; otherwise the one `config.store` names is opened
        (and its recorded settings adopted where `config` left them at their defaults).

        `adapt_model` changes `model` in place and for good, for speed only: sdpa attention goes
        to the engine's kernels for few-query passes (`hf.attention`), and bf16 linear layers on a
        CPU with oneDNN bf16 are packed (`hf.packed_linear`: plain weights dropped, their hash kept).
        False leaves the model as given (same answers up to kernel rounding, slower; CacheBlend's
        check layer attends for every token, sparse decode is dense). `from_pretrained` adapts its own.
        """
        config = config or EngineConfig()
        StoreLocations.parse(config.store)  # a bad one refused before the weights are read
        self.model, self.tokenizer = model, tokenizer
        self.name = name
        self.reuse_supported = reuse_supported
        self.unsupported_reason = unsupported_reason
        first_param = next(model.parameters())
        self.device, self.dtype = first_param.device, first_param.dtype
        self.fingerprint = model_fingerprint(model, tokenizer, self.dtype)
        if store is None:
            store, config = open_store(config, self.fingerprint, self.device)
        if not reuse_supported and config.mode == "reuse":
            config = replace(config, mode="full")  # a new config: the caller's is left as given
        self.config, self.store = config, store
        self.max_context = context_window(model)
        self._compute = process_compute()  # every forward pass of the process, on one thread
        if adapt_model:  # after the fingerprint, which hashes the weights as loaded
            if reuse_supported:
                use_reuse_attention(model)  # reuse passes are few queries over a long cache
            pack_linear_layers(model)
        self._prefill = PrefillRunner(model, rotary_module(model) if reuse_supported else None, self._compute)
        stop_ids, config = eos_ids(model, tokenizer), self.config
        self._decoder = Decoder(
            model, tokenizer, self._compute, stop_ids, config.draft_tokens, config.cuda_graphs, config.max_running
        )
        self.batcher = self._decoder.batcher  # the running batch: its size, listeners of its steps
        self._prompts = PromptTokenizer(tokenizer, name)
        self._prefix_tokens = np.asarray(
            tokenizer(config.warm_prefix).input_ids if config.warm_prefix else [], np.int64
        )
        self._namespaces = Namespaces(self._namespace)
        self.keys = self._namespaces.shared.keys  # the shared namespace's
        self.document_fingerprint = self.keys.document

    def _namespace(self, name: str) -> Namespace:
        """A namespace's keys, warmer and keeper. Warmed chunks depend on how they were cut,
        encoded and kept too: their keys say so."""
        config, prefix_tokens = self.config, self._prefix_tokens
        cutting = f"{config.chunking}:{config.chunk_size}:{config.adaptive_slack}"
        keys = KeySpace.derive(self.fingerprint, config.kept_as, prefix_tokens.tobytes(), cutting, name)
        writer = DocumentWriter(self.store, keys, config.kept_as)
        model, compute = self.model, self._compute
        warmer = Warmer(model, self.tokenizer, writer, self.boundaries, compute, self.max_context, prefix_tokens)
        return Namespace(
            name, keys, warmer, AnswerKeeper(writer, self.boundaries, config.chunk_size, config.match_window)
        )

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str] | None = None,
        *,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device | None = None,
        allow_unsupported: bool = False,
        weights: str | None = None,
        config: EngineConfig | None = None,
        **options: Any,
    ) -> KVBoostRAG:
        """Any HF RoPE decoder by hub name, folder or GGUF file; None is the embedded default.

        dtype defaults to bfloat16 where it is native (CUDA, CPUs with AVX512-BF16 or AMX), else
        float32; device to CUDA when present. `weights`: "int4", "float" or "auto" (None): int4 where
        a GGUF's Q4_1 blocks load as they are, on a CPU (`hf.weights`). `options` are `EngineConfig` fields.
        The engine owns the model it loads, and adapts it (see `adapt_model`).
        """
        if config is not None and options:
            raise ValueError("pass either config or config keyword options, not both")
        config = config or EngineConfig.from_options(**options)
        StoreLocations.parse(config.store)  # a bad store is refused before the model loads
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        # loaded on the compute thread, as every later pass runs (`compute.py`: one thread's kernels)
        loaded = process_compute().run(
            load_model, name_or_path, resolve_dtype(dtype, device), device, allow_unsupported, weights
        )
        options = {"name": loaded.name, "reuse_supported": loaded.reuse_supported}
        options["unsupported_reason"] = loaded.unsupported_reason
        return process_compute().run(functools.partial(cls, loaded.model, loaded.tokenizer, config, **options))

    # documents ---------------------------------------------------------------------------
    def warm(
        self,
        documents: str | Iterable[str],
        *,
        pin: bool = False,
        neighbours: Sequence[Sequence[str]] | None = None,
        neighbours_from: str = "",
        namespace: str = SHARED,
        wait: bool = True,
    ) -> WarmReport:
        """Encode each document in one pass and store it chunk by chunk; one already warm (however
        warmed) costs a lookup. `pin` keeps its chunks in memory whatever the budget. `neighbours[i]`:
        texts encoded before document i, such as its nearest in the user's index, so its KV has seen
        what it is usually retrieved with (FusionRAG); only the document's own KV is kept, with a
        record of them and of `neighbours_from` (how they were found, e.g. "all-MiniLM-L6-v2").
        `namespace`: whose documents they are (`namespaces.py`); "" is the shared corpus. Writers
        warming one store at once encode each document once: one another writer is encoding is
        waited for, or with `wait=False` left to it and counted in `deferred_documents` (warm it
        again later to be sure it is there)."""
        texts = check_documents(documents)  # all of them, before the store or the model is touched
        space = self._writing(namespace)
        return space.warmer.warm(texts, pin=pin, neighbours=neighbours, neighbours_from=neighbours_from, wait=wait)

    def warm_together(
        self,
        groups: Iterable[Iterable[str]],
        *,
        pin: bool = False,
        neighbours_from: str = "",
        namespace: str = SHARED,
        wait: bool = True,
    ) -> WarmReport:
        """Warm groups of documents that are each other's neighbours (clusters of your index), each
        member after half its group or more, for ~2x plain warming's work (`Warmer.warm_together`);
        `wait` as for `warm`."""
        checked = check_groups(groups)
        space = self._writing(namespace)
        return space.warmer.warm_together(checked, pin=pin, neighbours_from=neighbours_from, wait=wait)

    def namespace_fingerprints(self, namespace: str) -> frozenset[Fingerprint]:
        """The fingerprints a namespace's chunks carry (its documents', its kept prompts'): its
        rows of the store's stats."""
        return frozenset(self._namespaces[check_namespace(namespace)].keys.entry_fingerprints)

    def _writing(self, namespace: str) -> Namespace:
        """The namespace about to store documents, its settings and name recorded in every tier."""
        space = self._namespaces[check_namespace(namespace)]
        if not space.settings_recorded:
            label = f"{self.name} [{space.name}]" if space.name else self.name
            space.settings_recorded = record_settings(self.store, self.fingerprint, space.keys, self.config, label)
        return space

    # generation --------------------------------------------------------------------------
    def generate(self, prompt: Prompt, **kwargs: Any) -> GenerationResult:
        """Answer a prompt (text or chat messages); see `stream` for the options."""
        return self.stream(prompt, **kwargs).finish()

    def generate_batch(self, prompts: Sequence[Prompt], **kw: Any) -> list[GenerationResult]:
        """Answers in the prompts' order, decoding together: the batch runs `max_running` of them
        at once (the engine's option) and queues the rest; all checked before any work."""
        return finish_all([self.stream(prompt, **kw) for prompt in prompts])

    def stream(
        self,
        prompt: Prompt,
        *,
        sampling: SamplingParams | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        ignore_eos: bool | None = None,
        min_p: float | None = None,
        repetition_penalty: float | None = None,
        mode: Mode | None = None,
        repair: RepairStrategy | RepairConfig | None = None,
        exactness: ExactnessConfig | None = None,
        store_prompt: bool | None = None,
        return_first_logits: bool = False,
        timeout_s: float | None = None,
        observer: DecodeObserver | None = None,
        namespace: str = SHARED,
    ) -> GenerationStream:
        """Stream text deltas; bad input raises here, before any model work.

        Sampling: a `SamplingParams` as `sampling`, or its fields one by one (`max_new_tokens`,
        `temperature`, ...; None: its default), not both. `repair` overrides the engine's prefill
        repair (a strategy name or a RepairConfig), `exactness` what the answer reads after its
        first token; `return_first_logits` keeps the first token's fp32 logits on the result, for
        evals; `timeout_s` ends decoding once that much time has passed (finish_reason "timeout");
        `observer` sees every decode step; `ignore_eos` decodes past end-of-sequence tokens (answers
        of a fixed length, for benchmarks); `namespace`: whose chunks it reuses beside the shared
        corpus, and where its prompt is kept (`namespaces.py`).
        """
        started = time.perf_counter()
        settings = (max_new_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, min_p, repetition_penalty)
        params = SamplingParams.given(sampling, settings)
        mode = self._check_mode(mode)
        namespace = check_namespace(namespace)
        if timeout_s is not None and not check_real(timeout_s, "timeout_s") > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        tokens = self.tokenize_prompt(prompt)
        timings = StageTimings(tokenize_s=time.perf_counter() - started)
        if len(tokens) >= self.max_context:
            raise PromptTooLongError(
                f"prompt has {len(tokens)} tokens; the context window of {self.name} is {self.max_context}"
            )
        asked = Asked(
            tokens=tokens,
            params=params,
            mode=mode,
            repair=self.config.repair.with_strategy(repair),
            exactness=exactness or self.config.exactness,
            store_prompt=(self.config.store_prompt if store_prompt is None else store_prompt) and mode != "full",
            return_first_logits=return_first_logits,
            started=started,
            deadline=started + timeout_s if timeout_s is not None else float("inf"),
            namespace=namespace,
        )
        sparse = self.config.sparse_decode
        request = Request(
            asked, RequestStats(timings), sparse_decode=SparseDecode(sparse) if sparse.applies(len(tokens)) else None
        )
        running = Running(request, self._run(request, observer or NO_OBSERVER))
        return GenerationStream(running, self.batcher, len(tokens))

    def plan(self, prompt: Prompt, *, mode: Mode | None = None, namespace: str = SHARED) -> ReusePlan:
        """How a prompt would be served from the store now: which tokens are reused, and how."""
        tokens = self.tokenize_prompt(prompt)
        return self._plan(tokens, self.boundaries(tokens), self._check_mode(mode), check_namespace(namespace))

    def next_token_logits(
        self, prompt: Prompt, *, mode: Mode | None = None, repair: RepairStrategy | RepairConfig | None = None
    ) -> tuple[torch.Tensor, ReusePlan]:
        """fp32 logits of the first new token after the prefill (repair included) and the plan
        it ran; stores nothing. For evaluations of a prefill on its own."""
        mode = self._check_mode(mode)
        tokens = self.tokenize_prompt(prompt)
        plan = self._plan(tokens, self.boundaries(tokens), mode, SHARED)
        prefill = self._compute.run(
            self._prefill.run, tokens, plan, StageTimings(), self.config.repair.with_strategy(repair)
        )
        return prefill.logits, plan

    def tokenize_prompt(self, prompt: Prompt) -> np.ndarray:
        """The prompt's token ids; a bad prompt is a TypeError or ValueError naming what is wrong."""
        return self._prompts.tokenize(prompt)

    def boundaries(self, tokens: np.ndarray) -> list[int]:
        """Where the engine cuts these tokens into chunks."""
        strategy = self.config.chunking
        texts = None if strategy == "fixed" else self._prompts.token_texts(tokens)
        return chunk_boundaries(texts, len(tokens), strategy, self.config.chunk_size, self.config.adaptive_slack)

    # internals ---------------------------------------------------------------------------
    def _check_mode(self, mode: Mode | None) -> Mode:
        mode = mode or self.config.mode
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "reuse" and not self.reuse_supported:
            raise ValueError(f"reuse is off for {self.name}: {self.unsupported_reason}")
        return mode

    def _run(self, request: Request, observer: DecodeObserver) -> Generator[str, None, GenerationResult]:
        timings = request.stats.timings
        mark = time.perf_counter()
        request.boundaries = self.boundaries(request.asked.tokens)
        request.plan = plan = self._plan(
            request.asked.tokens, request.boundaries, request.asked.mode, request.asked.namespace
        )
        timings.lookup_s = time.perf_counter() - mark
        prefill = self._prefill.run(request.asked.tokens, plan, timings, request.asked.repair)
        request.cache, request.logits, request.slot_positions = prefill.cache, prefill.logits, prefill.slot_positions
        request.stats.repair_tokens = request.stats.recomputed_tokens = prefill.repair_tokens
        request.exact, request.exact_end = plan.tokens("approximate") == 0, plan.exact_end
        request.stats.first_logits = prefill.logits.cpu() if request.asked.return_first_logits else None
        if (
            request.asked.exactness.settle_share
            and request.asked.repair.strategy in CHOOSING_STRATEGIES
            and not request.exact
            and self._decoder.needs_exact(request, observer)
        ):
            self._settle(request)
        max_new = min(request.asked.params.max_new_tokens, self.max_context - len(request.asked.tokens))
        yield from self._decoder.run(request, max_new, observer)
        if request.asked.store_prompt:
            self._namespaces[request.asked.namespace].keeper.keep(request)
        return request.result()

    def _settle(self, request: Request) -> None:
        """A near-tied first token on moved KV: the prefill again with a larger share of the moved
        tokens recomputed; the decode loop recomputes the whole prompt only if the tie remains."""
        assert request.plan is not None  # planned before the prefill
        started = time.perf_counter()
        share = max(request.asked.exactness.settle_share, request.asked.repair.rho)
        wider = replace(
            request.asked.repair,
            rho=share,
            rho_after_neighbours=None,
            rho_among_strangers=None,
            max_tokens_per_run=None,
        )
        prefill = self._prefill.run(request.asked.tokens, request.plan, StageTimings(), wider)
        request.cache, request.logits, request.slot_positions = prefill.cache, prefill.logits, prefill.slot_positions
        request.stats.repair_tokens = prefill.repair_tokens
        request.stats.recomputed_tokens += prefill.repair_tokens
        request.stats.timings.settle_s = time.perf_counter() - started
        if request.asked.return_first_logits:
            request.stats.first_logits = prefill.logits.cpu()

    def _plan(self, tokens: np.ndarray, boundaries: list[int], mode: Mode, namespace: str) -> ReusePlan:
        """A namespace's plan: its own chunks, and the shared corpus's moved."""
        own, shared = self._namespaces[namespace].keys, self._namespaces.shared.keys
        with self.store.serving():  # the plan's chunks are not evicted while it is made
            return plan_reuse(tokens, boundaries, self.store, own, mode, shared)
