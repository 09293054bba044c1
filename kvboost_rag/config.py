"""Engine settings: plain dataclasses, checked when built.

Three concerns, three settings: how chunks are cut, matched and kept (`EngineConfig`), how the
prefill repairs moved KV (`RepairConfig`), and what the answer reads after its first token
(`ExactnessConfig`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

Mode = Literal["full", "prefix", "reuse"]
ChunkingStrategy = Literal["fixed", "semantic", "adaptive"]
RepairStrategy = Literal["none", "boundary", "cacheblend", "query"]
Deviation = Literal["value", "key"]
Quantization = Literal["int8", "int4"]
KVFormat = Literal["dense", "int8", "int4"]  # how warmed chunks are kept: "dense" as computed

MODES: tuple[Mode, ...] = ("full", "prefix", "reuse")
CHUNKING_STRATEGIES: tuple[ChunkingStrategy, ...] = ("fixed", "semantic", "adaptive")
REPAIR_STRATEGIES: tuple[RepairStrategy, ...] = ("none", "boundary", "cacheblend", "query")
CHOOSING_STRATEGIES: tuple[RepairStrategy, ...] = ("cacheblend", "query")  # a share of moved tokens, ranked
KV_FORMATS: tuple[KVFormat, ...] = ("dense", "int8", "int4")
DEFAULT_KV_FORMAT: Quantization = "int8"  # measured: issue 55 (docs/research-log.md)
# A draft and its last token are verified as rows of one pass; the int4 kernel's rows are each
# row's own up to 4 rows (`hf.int4_linear.INT4_MAX_ROWS`), so a pass's logits are those of its steps.
MAX_DRAFT_TOKENS = 3
DEFAULT_MAX_RUNNING = 8  # requests decoding together (`EngineConfig.max_running`)
# `EngineConfig.store` value that keeps chunks in this process's memory only.
MEMORY_ONLY = "memory"


def _check_optional_count(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"{name} must be None or an integer >= 0, got {value!r}")


@dataclass(slots=True, frozen=True)
class RepairConfig:
    """What the prefill recomputes of the moved (reused) KV.

    `strategy`: how the moved tokens to recompute are chosen. `cacheblend` (the default): every
    token through layers 0..`check_layer`, ranked by their K (or V: `deviation`) deviation there,
    the top ones through the rest (CacheBlend). `query` (FusionRAG's query-guided choice): the
    prompt's uncached tokens are computed over the reused KV first, and the moved tokens ranked by
    the attention the question (the uncached tokens after the last moved one) pays them, summed
    over the last `query_layers` layers and every head; the top ones are recomputed with the
    uncached tokens in a second pass. At the same share it picks better (first-token KL 0.037
    against 0.069 at 0.15 of 60 NQ prompts' moved tokens), but its first pass costs ~70 ms against
    CacheBlend's ~30 at k=5 on 2 CPU cores, and on 500 held-out questions its measured setting
    (`query_guided()`) agreed with full prefill more often and answered right less often, later
    (docs/research-log.md, "Issue 51"): an option, not the default. `boundary`, `none`: see
    plan/repair.py.

    `rho`: share of moved tokens recomputed, at most `max_tokens_per_run` for each reused run (a
    document's moved KV; None: no cap): a moved document's error sits at its first tokens, where
    the attention sink was (EPIC), so a long document needs no more repair than a short one;
    `blend_boundary_tokens` of each run's first tokens are recomputed besides. rho = 1 recomputes
    every moved token, cap or not: full prefill's logits. `rho_after_neighbours`: the share for
    chunks whose document was warmed after its nearest documents, one of which stands in the
    prompt (their KV is closer to full prefill's, so less needs recomputing; None: `rho` for every
    chunk; rho 1 recomputes every chunk whatever its warming). `rho_among_strangers`: the share for
    chunks warmed after neighbours none of which stands in the prompt (their KV attended to text
    this prompt lacks, and deviates more than KV warmed alone; None: `rho`, as if warmed alone);
    a prompt's budget is each moved chunk's share of its tokens, spent on the top tokens of the
    whole prompt.
    `min_reused_share`: below this share of moved tokens in a prompt, repair is skipped (little was
    reused, little can be wrong). `narrow_check_layer`: CacheBlend's check layer's attention and
    feed-forward run for the selected tokens only (the next layer drops the rest); off runs them
    for every token, with the same logits, as the reference for that shortcut.
    """

    strategy: RepairStrategy = "cacheblend"
    rho: float = 0.15
    rho_after_neighbours: float | None = 0.05
    rho_among_strangers: float | None = 0.3
    max_tokens_per_run: int | None = 32
    check_layer: int = 1
    deviation: Deviation = "key"
    query_layers: int = 8
    boundary_tokens: int = 16
    tail_tokens: int = 0
    blend_boundary_tokens: int = 0  # `cacheblend` and `query` also recompute this many first tokens of each run
    min_reused_share: float = 0.0
    narrow_check_layer: bool = True

    @classmethod
    def query_guided(cls) -> RepairConfig:
        """The query-guided repair as chosen on seed 1's questions: the last 8 layers' attention,
        each moved run's first 4 tokens, half CacheBlend's shares (0.08 / 0.03 / 0.15)."""
        return cls("query", rho=0.08, rho_after_neighbours=0.03, rho_among_strangers=0.15, blend_boundary_tokens=4)

    def __post_init__(self) -> None:
        if self.strategy not in REPAIR_STRATEGIES:
            raise ValueError(f"repair strategy must be one of {REPAIR_STRATEGIES}, got {self.strategy!r}")
        if not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"rho must be in [0, 1], got {self.rho!r}")
        if self.rho_after_neighbours is not None and not 0.0 <= self.rho_after_neighbours <= 1.0:
            raise ValueError(f"rho_after_neighbours must be None or in [0, 1], got {self.rho_after_neighbours!r}")
        if self.rho_among_strangers is not None and not 0.0 <= self.rho_among_strangers <= 1.0:
            raise ValueError(f"rho_among_strangers must be None or in [0, 1], got {self.rho_among_strangers!r}")
        if self.check_layer < 0:
            raise ValueError("check_layer must be >= 0")
        if not isinstance(self.query_layers, int) or isinstance(self.query_layers, bool) or self.query_layers < 1:
            raise ValueError(f"query_layers must be an integer >= 1, got {self.query_layers!r}")
        _check_optional_count("max_tokens_per_run", self.max_tokens_per_run)
        if self.deviation not in ("value", "key"):
            raise ValueError(f"deviation must be 'value' or 'key', got {self.deviation!r}")
        if min(self.boundary_tokens, self.tail_tokens, self.blend_boundary_tokens) < 0:
            raise ValueError("token counts must be >= 0")
        if not 0.0 <= self.min_reused_share <= 1.0:
            raise ValueError("min_reused_share must be in [0, 1]")

    def with_strategy(self, strategy: RepairStrategy | RepairConfig | None) -> RepairConfig:
        """An override as `stream(repair=...)` takes it: a strategy name or a whole config."""
        if strategy is None:
            return self
        if isinstance(strategy, RepairConfig):
            return strategy
        return replace(self, strategy=strategy)


@dataclass(slots=True, frozen=True)
class ExactnessConfig:
    """What the answer reads after the prefill, while the prefill read moved KV.

    `verify_margin`: a token among the answer's first `verify_tokens` whose probability leads the
    runner-up's by less than this is not taken on moved KV: the prompt and the answer so far are
    recomputed as full prefill would, and the answer goes on from that exact KV. Near-ties are
    where moved KV flips a choice; a clear token keeps reuse's speed. 0 never verifies; 0.05 was
    chosen on NQ questions outside the eval's (benchmarks/verify_margin.py).
    `verify_tokens`: how many leading answer tokens are checked (None: every token). The first
    token decides most short answers; checking every token recomputed two thirds of them.
    `settle_share`: a near-tied first token is first settled by the prefill again with this share
    of the moved tokens recomputed (the same choice, every chunk alike); only a tie that remains
    recomputes the whole prompt. 0: the whole prompt at once.
    `refresh` (opt-in): after the first token, recompute the prompt so that every later token
    reads full prefill's KV: the answer is full prefill's whenever its first token is, for one
    full prefill before the second token, so the whole answer takes longer than full prefill's.
    """

    verify_margin: float = 0.05
    verify_tokens: int | None = 1
    refresh: bool = False
    settle_share: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.verify_margin <= 1.0:
            raise ValueError(f"verify_margin must be in [0, 1], got {self.verify_margin!r}")
        if not 0.0 <= self.settle_share < 1.0:
            raise ValueError(
                f"settle_share must be in [0, 1) (1 is the whole prompt's recompute), got {self.settle_share!r}"
            )
        _check_optional_count("verify_tokens", self.verify_tokens)

    @classmethod
    def off(cls) -> ExactnessConfig:
        """Nothing recomputed after the prefill: the answer reads the repaired KV throughout."""
        return cls(verify_margin=0.0, refresh=False, settle_share=0.0)

    @classmethod
    def exact_answer(cls) -> ExactnessConfig:
        """The answer full prefill would give whenever its first token agrees (the first token
        verified on a near-tie, the rest refreshed): about 1.2x full prefill's answer time."""
        return cls(verify_margin=0.05, verify_tokens=1, refresh=True)

    def checks(self, answered: int) -> bool:
        """Whether the token after `answered` answer tokens is checked for a near-tie."""
        return bool(self.verify_margin) and (self.verify_tokens is None or answered < self.verify_tokens)


@dataclass(slots=True, frozen=True)
class SparseDecodeConfig:
    """Sparse decode: decode-time KV page selection (FreeKV, with Quest's page bound): each decoded token attends to
    the first `sink_tokens`, the last `recent_tokens` and the pages of `page_size` tokens that
    bound its attention scores highest, within `budget_tokens`; prompts shorter than
    `min_prompt_tokens` decode densely. `speculative`: a step attends to the pages its previous
    step's query chose, re-selecting for KV heads whose query moved (cosine similarity below
    `correction_threshold`; 1.0 re-selects every step, -1 never). The other heads' selections are
    made for all layers in one batch, so a lower threshold is faster and less exact (on the
    default model 0.9 corrects 60-80% of heads, 0.7 under 10%). Off by default: see
    docs/sparse-decode.md.
    """

    enabled: bool = False
    page_size: int = 32
    budget_tokens: int = 2048
    sink_tokens: int = 512
    recent_tokens: int = 512
    min_prompt_tokens: int = 4096
    speculative: bool = True
    correction_threshold: float = 0.9

    def __post_init__(self) -> None:
        for name in ("page_size", "budget_tokens", "min_prompt_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("sink_tokens", "recent_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
        if self.sink_tokens + self.recent_tokens > self.budget_tokens:
            raise ValueError("sink_tokens + recent_tokens must fit budget_tokens")
        if not -1.0 <= self.correction_threshold <= 1.0:
            raise ValueError(f"correction_threshold must be in [-1, 1], got {self.correction_threshold!r}")

    def applies(self, prompt_tokens: int) -> bool:
        return self.enabled and prompt_tokens >= self.min_prompt_tokens


@dataclass(slots=True, frozen=True)
class EngineConfig:
    """How the engine chunks, matches and keeps KV; frozen, so a config given to an engine is never
    changed by it (derive another with `dataclasses.replace`).

    `match_window` is the length of the token windows that index stored chunks: a document is
    found in a prompt wherever a run of at least `2 * match_window - 1` of its tokens appears
    unchanged, so shorter runs are computed rather than reused.
    `store`: where chunks persist: a directory, shared by every process and by `kvboost-rag
    warm`; a Redis URL (`redis://host:port/db`, see `store.redis.location`), shared by workers
    on many hosts; or both, comma-separated (looked up memory, then disk, then Redis). None is
    the user cache directory's store (the same one the CLI writes by default); "memory" keeps
    chunks in this process only. The store parses it (`store.location`): a bad one is refused
    when an engine is built, before any model loads.
    """

    chunk_size: int = 128
    chunking: ChunkingStrategy = "fixed"
    adaptive_slack: int = 16
    match_window: int = 16
    mode: Mode = "reuse"
    memory_budget_bytes: int = 4 * 1024**3
    # Keep each prompt's chunks after the answer (`stream(store_prompt=...)` decides per request).
    store_prompt: bool = True
    repair: RepairConfig = field(default_factory=RepairConfig)
    exactness: ExactnessConfig = field(default_factory=ExactnessConfig)
    sparse_decode: SparseDecodeConfig = field(default_factory=SparseDecodeConfig)
    # Tokens drafted from the prompt and verified in one pass while a request decodes alone on a
    # CPU (`engine.speculation`): the same answer in fewer passes; 0 switches drafting off.
    draft_tokens: int = 3
    # Requests decoding together, one step for all (continuous batching, `engine.batching`): the
    # batch's one bound; more wait their turn in arrival order.
    max_running: int = DEFAULT_MAX_RUNNING
    # On a CUDA GPU, decode steps replayed as CUDA graphs where a replay gives the eager step's
    # logits and runs faster, checked at the first step (`hf.graph_step`); no effect on a CPU.
    cuda_graphs: bool = True
    # Text encoded before every warmed document (its KV is not kept), so a document's first
    # tokens do not become an attention sink; "" encodes each document alone from position 0.
    warm_prefix: str = ""
    # Warmed chunks kept KIVI-quantized ("int8" or "int4"), dequantized when a prompt reuses them;
    # "dense" (or None) keeps them as computed. int8 by default: half of bf16's bytes (a quarter of
    # fp32's) with EM and agreement with full prefill within a point of dense on 500 NQ questions;
    # int4 moved 7 points of whole answers.
    kv_quantization: KVFormat | None = DEFAULT_KV_FORMAT
    store: str | None = None
    # Bytes the persistent store may hold; least recently used unpinned chunks are pruned past it.
    disk_budget_bytes: int | None = None

    def __post_init__(self) -> None:
        # NOTE: normalized through object.__setattr__, the one way to set a field of a frozen dataclass.
        if isinstance(self.repair, str):
            object.__setattr__(self, "repair", RepairConfig(strategy=self.repair))
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ValueError(f"chunk_size must be an integer >= 1, got {self.chunk_size!r}")
        if self.chunking not in CHUNKING_STRATEGIES:
            raise ValueError(f"chunking must be one of {CHUNKING_STRATEGIES}, got {self.chunking!r}")
        if not 0 <= self.adaptive_slack < self.chunk_size:
            raise ValueError("adaptive_slack must be in [0, chunk_size)")
        if not 1 <= self.match_window <= self.chunk_size:
            raise ValueError("match_window must be in [1, chunk_size]")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.kv_quantization is not None and self.kv_quantization not in KV_FORMATS:
            raise ValueError(f"kv_quantization must be 'dense', 'int8' or 'int4', got {self.kv_quantization!r}")
        if self.kv_quantization == "dense":
            object.__setattr__(self, "kv_quantization", None)  # one spelling inside: None keeps KV as computed
        if not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be True or False, got {self.cuda_graphs!r}")
        if not isinstance(self.draft_tokens, int) or not 0 <= self.draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(f"draft_tokens must be an integer in [0, {MAX_DRAFT_TOKENS}], got {self.draft_tokens!r}")
        if not isinstance(self.max_running, int) or isinstance(self.max_running, bool) or self.max_running < 1:
            raise ValueError(f"max_running must be an integer >= 1, got {self.max_running!r}")
        if self.memory_budget_bytes < 0:
            raise ValueError("memory_budget_bytes must be >= 0")
        if self.disk_budget_bytes is not None and self.disk_budget_bytes < 0:
            raise ValueError("disk_budget_bytes must be >= 0")
        if not isinstance(self.warm_prefix, str):
            raise TypeError(f"warm_prefix must be a str, got {type(self.warm_prefix).__name__}")
        if self.store is not None and not isinstance(self.store, str):
            object.__setattr__(self, "store", str(self.store))  # a Path

    @property
    def memory_only(self) -> bool:
        return self.store == MEMORY_ONLY

    @classmethod
    def from_options(cls, base: EngineConfig | None = None, **options: Any) -> EngineConfig:
        """A config from keyword options, with a clear error for any name it does not know.

        Framework packages, the CLI and the server all build their engine through this, so the
        same option names work everywhere and a misspelled one is never silently ignored.
        """
        check_option_names(options, engine_option_names())
        return replace(base or cls(), **options)

    @property
    def kept_as(self) -> Quantization | None:
        """The quantization warmed chunks are kept in; None: dense, as computed."""
        kind = self.kv_quantization
        return None if kind is None or kind == "dense" else kind

    def explicit_fields(self) -> set[str]:
        """Fields set to something other than their default (what a user chose)."""
        default = EngineConfig()
        return {f.name for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)}


def engine_option_names() -> set[str]:
    return {f.name for f in fields(EngineConfig)}


def check_option_names(
    options: Iterable[str],
    known: Iterable[str],
    what: str = "engine option",
    renamed: Mapping[str, str] | None = None,
) -> None:
    """TypeError naming each unknown option and the known one it probably means: its new name in
    `renamed`, else the closest. The one checker of option names: every front-end calls it.

    Python's own word for an unexpected keyword; a misspelled option silently ignored would
    change nothing and look like it worked.
    """
    known = sorted(known)
    unknown = sorted(set(options) - set(known))
    if not unknown:
        return
    hints = []
    for name in unknown:
        meant = (renamed or {}).get(name)
        close = [meant] if meant in known else difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise TypeError(f"unknown {what}{'s' if len(unknown) > 1 else ''}: {', '.join(hints)}")


def parse_repair(text: str) -> RepairStrategy | RepairConfig:
    """The text form every entry point takes (`--repair`, KVBOOST_RAG_REPAIR): 'none', 'boundary',
    'cacheblend', 'query'; 'cacheblend:0.05' (or 'query:0.05') recomputes that share of moved
    tokens for every chunk however it was warmed (the eval's 'cacheblend@0.05'); 'boundary:16'
    that many tokens at each reused run's start. ValueError for anything else."""
    strategy, colon, amount = text.strip().partition(":")
    if strategy not in REPAIR_STRATEGIES:
        raise ValueError(f"repair strategy must be one of {', '.join(REPAIR_STRATEGIES)}, got {strategy!r}")
    if not colon:
        return strategy
    try:
        if strategy in ("cacheblend", "query"):
            return RepairConfig(strategy, rho=float(amount), rho_after_neighbours=None)
        if strategy == "boundary":
            return RepairConfig("boundary", boundary_tokens=int(amount))
    except ValueError as error:
        raise ValueError(f"{text!r}: {error}") from None
    raise ValueError(f"{text!r}: 'none' takes no amount")
