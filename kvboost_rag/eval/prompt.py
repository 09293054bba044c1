"""The one RAG prompt of the demos, benchmarks and the eval: documents as warmed, then the question."""

from __future__ import annotations

from typing import Any

SYSTEM = "Answer the question using the documents. Reply with a short answer only."
TEMPLATE = "Documents:\n\n{documents}\n\nQuestion: {question}\nAnswer:"


def rag_prompt(question: str, documents: list[str], template: str = TEMPLATE, chat: bool = True) -> Any:
    """Chat messages (system, user) holding the documents separated by blank lines, or with
    `chat=False` the user text alone."""
    user = template.format(documents="\n\n".join(documents), question=question)
    if not chat:
        return user
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def rag_messages(question: str, documents: list[str]) -> list[dict[str, str]]:
    """The chat prompt with the default template."""
    return rag_prompt(question, documents)
