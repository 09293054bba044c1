"""An LCEL RAG chain over a FAISS index of NQ passages, answered twice: full prefill, then kvboost.

The chain is the usual one (retriever | format | prompt | chat model); the only change between
the two runs is the chat model object. The passages are pre-warmed where they are added to the
vector store (`--warm-at ingestion`, `warm_documents`) or as the retriever returns them
(`--warm-at retrieval`, `KVBoostRetrievalWarmer`). Offline, on the embedded default model.
"""

from __future__ import annotations

import time
import warnings

from demo_table import HEADER, Row, corpus_and_questions, format_row, format_summary, framework_demo_args
from langchain_community.vectorstores import FAISS
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_huggingface import HuggingFaceEmbeddings
from langchain_kvboost import ChatKVBoost, KVBoostRetrievalWarmer, warm_documents

from kvboost_rag import KVBoostRAG
from kvboost_rag.eval.prompt import SYSTEM, TEMPLATE
from kvboost_rag.neighbours import default_embedder_path

PROMPT = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", TEMPLATE)])  # the eval's prompt


def format_docs(documents: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in documents)


def main() -> None:
    args = framework_demo_args(__doc__)
    examples, questions = corpus_and_questions(args)
    documents = [Document(page_content=e.passages[0].as_document()) for e in examples]
    print("Loading the embedded default model and all-MiniLM-L6-v2 ...")
    engine = KVBoostRAG.from_pretrained(store="memory")  # each run starts cold and leaves no files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # sentence-transformers' own deprecations
        embeddings = HuggingFaceEmbeddings(
            model_name=default_embedder_path(), encode_kwargs={"normalize_embeddings": True}
        )
    started = time.perf_counter()
    vectorstore = FAISS.from_documents(documents, embeddings)
    print(f"Indexed {len(documents)} passages in FAISS in {time.perf_counter() - started:.1f} s")
    callbacks = []
    if args.warm_at == "ingestion":
        report = warm_documents(engine, documents)  # right where they went into the vector store
        print(f"Pre-warmed them at ingestion: {report.tokens_encoded} tokens in {report.seconds:.1f} s")
    else:
        callbacks = [KVBoostRetrievalWarmer(engine)]
        print("Warming at retrieval: each retrieved passage is warmed before the prompt is built")

    retriever = vectorstore.as_retriever(search_kwargs={"k": args.k})

    def rag_chain(model: ChatKVBoost):  # the user's chain; only the model changes
        return {"documents": retriever | format_docs, "question": RunnablePassthrough()} | PROMPT | model

    full_chain = rag_chain(ChatKVBoost(engine=engine, mode="full", max_tokens=24, stop=["\n"]))
    kvboost_chain = rag_chain(ChatKVBoost(engine=engine, max_tokens=24, stop=["\n"]))
    engine.generate("Warm-up.", max_new_tokens=1, mode="full")

    print(f"\n{HEADER}")
    rows = []
    for question in questions:
        full = full_chain.invoke(question)
        ours = kvboost_chain.invoke(question, config={"callbacks": callbacks})
        full_meta, meta = full.response_metadata, ours.response_metadata
        rows.append(
            Row(
                question,
                full_meta["ttft_s"],
                meta["ttft_s"],
                meta["reuse_share"],
                ours.content,
                full_meta["total_s"],
                meta["total_s"],
            )
        )
        print(format_row(rows[-1]))
    print(format_summary(rows, f"LangChain LCEL chain, k={args.k}, warmed at {args.warm_at}"))


if __name__ == "__main__":
    main()
