"""Warming nodes at ingestion and at retrieval, with the text the LLM will be shown."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr, field_validator
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMCompletionEndEvent
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent
from llama_index.core.schema import BaseNode, MetadataMode, TransformComponent

from kvboost_rag.frameworks.warming import check_warm_target, retrieved_together, warm_quietly
from kvboost_rag.neighbours import DEFAULT_NEIGHBOURS, found_by, nearest_others

ENGINE_DOC = "The engine to warm: a KVBoostRAG, the KVBoostLLM that answers, or None (the default engine)."


def _checked_engine(value: Any, owner: str) -> Any:
    """A wrong `engine=` is a TypeError at construction, not a warning per node later."""
    check_warm_target(value, owner)
    return value


def node_text(node: BaseNode) -> str:
    """A node as response synthesis puts it in a prompt: metadata header included, stripped."""
    return node.get_content(metadata_mode=MetadataMode.LLM).strip()


class KVBoostWarmTransformation(TransformComponent):
    """An ingestion-pipeline step: warms each node as it is ingested and passes it on unchanged.

        IngestionPipeline(transformations=[SentenceSplitter(), KVBoostWarmTransformation(engine=engine),
                                           embed_model], vector_store=vector_store)

    Place it after the splitter, so it warms the nodes that retrieval will return, and after the
    embed model: the nodes are then warmed among their `neighbours` (default 4) nearest nodes of the
    batch by embedding, as they will stand among them in prompts (FusionRAG): groups of mutual
    neighbours in two passes each, every node after half its group or more, so its reused KV is
    closer to full prefill's and prompts need less repair, for ~2x plain warming's work. Before
    the embed model nodes are warmed alone (a warning where `neighbours` was asked for); 0: alone.
    A node that cannot be warmed becomes a warning: warming never fails ingestion. `engine`: the
    `KVBoostLLM` that answers, a `KVBoostRAG`, or None (the default engine); anything else is a
    TypeError at construction.

    `show_progress` (as LlamaIndex's extractors take it): a bar while nodes are warmed, which can
    take minutes; None follows a `show_progress` the pipeline passes, else shows one from 10 nodes.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    engine: Any = Field(default=None, exclude=True, description=ENGINE_DOC)
    neighbours: int | None = Field(
        default=None, ge=0, description="nearest nodes each node is warmed after (None: 4 where nodes are embedded)"
    )
    show_progress: bool | None = Field(
        default=None, description="a progress bar while warming (None: the pipeline's, else from 10 nodes)"
    )

    @classmethod
    def class_name(cls) -> str:
        return "KVBoostWarmTransformation"

    @field_validator("engine")
    @classmethod
    def _engine_or_model(cls, value: Any) -> Any:
        return _checked_engine(value, cls.__name__)

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        texts = [node_text(n) for n in nodes]
        count = DEFAULT_NEIGHBOURS if self.neighbours is None else self.neighbours
        show = self.show_progress if self.show_progress is not None else kwargs.get("show_progress")
        how = found_by("node embeddings", count)
        warm_quietly(self.engine, texts, self._nearest(nodes, texts), neighbours_from=how, show_progress=show)
        return nodes

    def _nearest(self, nodes: Sequence[BaseNode], texts: list[str]) -> Callable[[str], list[str]] | None:
        """Each text's nearest texts in the batch by the nodes' embeddings; None (with a warning)
        where a node has none yet, so the nodes are warmed alone."""
        if self.neighbours == 0 or len(nodes) < 2:
            return None
        if any(n.embedding is None for n in nodes):
            if self.neighbours is None:  # the default: nothing to find them by, so alone
                return None
            warnings.warn(
                "KVBoostWarmTransformation(neighbours=...) needs embedded nodes: place it after the "
                "embed model; warming each node alone",
                stacklevel=3,
            )
            return None
        count = DEFAULT_NEIGHBOURS if self.neighbours is None else self.neighbours
        nearest = nearest_others(np.asarray([n.embedding for n in nodes], np.float32), count)
        by_text = {text: [texts[j] for j in others] for text, others in zip(texts, nearest)}
        return lambda text: by_text.get(text, [])


class KVBoostRetrievalWarmer(BaseEventHandler):
    """An instrumentation handler: on retrieval end, warms the retrieved nodes before synthesis.

        from llama_index.core.instrumentation import get_dispatcher
        get_dispatcher().add_event_handler(KVBoostRetrievalWarmer(engine=engine))

    The nodes not yet warm are warmed together with the best-ranked `neighbours` others retrieved
    with them (default 4; 0: alone; two passes a group), as the prompt will place them around each
    other, so less of them needs repair. Nodes already warm cost a lookup only. Warming never fails
    the query: errors become warnings. `engine`: as `KVBoostWarmTransformation`'s.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    engine: Any = Field(default=None, exclude=True, description=ENGINE_DOC)
    neighbours: int | None = Field(default=None, ge=0, description="retrieved nodes each is warmed after")
    warmed_documents: int = 0

    @classmethod
    def class_name(cls) -> str:
        return "KVBoostRetrievalWarmer"

    @field_validator("engine")
    @classmethod
    def _engine_or_model(cls, value: Any) -> Any:
        return _checked_engine(value, cls.__name__)

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, RetrievalEndEvent):
            texts = [node_text(n.node) for n in event.nodes]
            nearest = retrieved_together(texts, self.neighbours) if self.neighbours != 0 else None
            report = warm_quietly(self.engine, texts, nearest, show_progress=False)  # a query's few nodes
            self.warmed_documents += report.encoded_documents


class KVBoostResultRecorder(BaseEventHandler):
    """An instrumentation handler that keeps the generation result of each KVBoostLLM call
    (TTFT, reused tokens, repair), for a query engine's answers, whose Response drops them."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _results: list[dict[str, Any]] = PrivateAttr(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @classmethod
    def class_name(cls) -> str:
        return "KVBoostResultRecorder"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, (LLMChatEndEvent, LLMCompletionEndEvent)) and event.response is not None:
            raw = event.response.raw
            if isinstance(raw, dict) and "ttft_s" in raw:
                with self._lock:
                    self._results.append(raw)

    @property
    def results(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._results)
