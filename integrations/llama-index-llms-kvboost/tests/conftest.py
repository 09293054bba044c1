"""Real components, offline: the embedded model, MiniLM embeddings, a FAISS index of NQ passages."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import faiss
import pytest
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.llms import LLM
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import TransformComponent
from llama_index.embeddings.huggingface import HuggingFaceEmbedding
from llama_index.llms.kvboost import KVBoostResultRecorder
from llama_index.vector_stores.faiss import FaissVectorStore

from kvboost_rag import KVBoostRAG
from kvboost_rag.neighbours import default_embedder_path
from kvboost_rag.testing.engines import fresh_engine, nq_examples, shared_test_engine, warm_in_another_process

Handler = TypeVar("Handler", bound=BaseEventHandler)


@contextmanager
def attached(handler: Handler) -> Iterator[Handler]:
    """An instrumentation handler on the root dispatcher for the duration of a block."""
    get_dispatcher().add_event_handler(handler)
    try:
        yield handler
    finally:
        get_dispatcher().event_handlers.remove(handler)


@pytest.fixture()
def attach() -> Callable[[Handler], contextlib.AbstractContextManager[Handler]]:
    """`with attach(handler):` the handler listens to every LlamaIndex event of the block."""
    return attached


@pytest.fixture()
def recorder() -> Iterator[KVBoostResultRecorder]:
    """Each KVBoostLLM call's generation result (a query engine's Response drops it)."""
    with attached(KVBoostResultRecorder()) as handler:
        yield handler


@pytest.fixture(scope="session")
def shared_engine() -> KVBoostRAG:
    return shared_test_engine()


@pytest.fixture()
def engine() -> KVBoostRAG:
    """The session's model with an empty store, so tests do not see each other's chunks."""
    return fresh_engine()


@pytest.fixture()
def warm_with_cli() -> Callable[..., str]:
    return warm_in_another_process


@pytest.fixture(scope="session")
def embed_model() -> HuggingFaceEmbedding:
    return HuggingFaceEmbedding(model_name=default_embedder_path(), device="cpu")


@pytest.fixture(scope="session")
def nq_documents() -> list[Document]:
    """Gold NQ passages, the title as metadata (so the LLM sees a metadata header)."""
    examples = nq_examples(12)
    return [Document(text=e.passages[0].text, metadata={"title": e.passages[0].title}) for e in examples]


@pytest.fixture(scope="session")
def nq_questions() -> list[str]:
    return [e.question for e in nq_examples(12)]


@pytest.fixture(scope="session")
def top_k() -> int:
    return 3


@pytest.fixture()
def build_query_engine(
    nq_documents: list[Document], embed_model: HuggingFaceEmbedding, top_k: int
) -> Callable[..., RetrieverQueryEngine]:
    """The user's RAG chain, built the same way whatever the LLM: only `llm` changes."""

    def build(llm: LLM, ingestion: Sequence[TransformComponent] = ()) -> RetrieverQueryEngine:
        store = FaissVectorStore(faiss_index=faiss.IndexFlatIP(384))
        index = VectorStoreIndex.from_documents(
            nq_documents,
            storage_context=StorageContext.from_defaults(vector_store=store),
            embed_model=embed_model,
            transformations=[SentenceSplitter(chunk_size=512, chunk_overlap=0), *ingestion],
        )
        return index.as_query_engine(llm=llm, similarity_top_k=top_k)

    return build
