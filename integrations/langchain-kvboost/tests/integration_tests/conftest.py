"""Real components, offline: the embedded model, MiniLM embeddings, a FAISS index of NQ passages."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from langchain_community.vectorstores import FAISS
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnablePassthrough
from langchain_huggingface import HuggingFaceEmbeddings

from kvboost_rag import KVBoostRAG
from kvboost_rag.eval.prompt import SYSTEM, TEMPLATE
from kvboost_rag.neighbours import default_embedder_path
from kvboost_rag.testing.engines import fresh_engine, nq_examples, warm_in_another_process

PROMPT = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", TEMPLATE)])  # the eval's prompt


@pytest.fixture()
def engine() -> KVBoostRAG:
    """The session's model with an empty store, so tests do not see each other's chunks."""
    return fresh_engine()


@pytest.fixture()
def warm_with_cli() -> Callable[..., str]:
    return warm_in_another_process


@pytest.fixture(scope="session")
def nq_documents() -> list[Document]:
    return [Document(page_content=e.passages[0].as_document()) for e in nq_examples(12)]


@pytest.fixture(scope="session")
def nq_questions() -> list[str]:
    return [e.question for e in nq_examples(12)]


@pytest.fixture(scope="session")
def vectorstore(nq_documents: list[Document]) -> FAISS:
    embeddings = HuggingFaceEmbeddings(model_name=default_embedder_path(), encode_kwargs={"normalize_embeddings": True})
    return FAISS.from_documents(nq_documents, embeddings)


def format_docs(documents: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in documents)


@pytest.fixture(scope="session")
def build_chain(vectorstore: FAISS) -> Callable[[BaseChatModel], Runnable]:
    """The user's LCEL RAG chain, built the same way whatever the chat model: only `model` changes."""

    def build(model: BaseChatModel) -> Runnable:
        retriever = vectorstore.as_retriever(search_kwargs={"k": 3})
        return {"documents": retriever | format_docs, "question": RunnablePassthrough()} | PROMPT | model

    return build
