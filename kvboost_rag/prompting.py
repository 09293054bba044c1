"""The RAG prompt shared by the demo, the benchmark and the eval."""

from __future__ import annotations

SYSTEM = "Answer the question using the documents. Reply with a short answer only."


def rag_messages(question: str, documents: list[str], system: str = SYSTEM) -> list[dict[str, str]]:
    """Chat messages holding the documents as warmed, separated by blank lines."""
    context = "\n\n".join(documents)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Documents:\n\n{context}\n\nQuestion: {question}\nAnswer:"},
    ]
