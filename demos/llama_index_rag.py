"""A LlamaIndex VectorStoreIndex over FAISS with a RetrieverQueryEngine, answered twice: full
prefill, then kvboost.

The query engine is the usual one; the only change between the two runs is the LLM object. The
passages are pre-warmed by an ingestion transformation (`--warm-at ingestion`,
`KVBoostWarmTransformation`) or as the retriever returns them (`--warm-at retrieval`,
`KVBoostRetrievalWarmer`). Offline, on the embedded default model.
"""

from __future__ import annotations

import time

import faiss
from demo_table import HEADER, Row, corpus_and_questions, format_row, format_summary, framework_demo_args
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.llms import ChatMessage
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.prompts import ChatPromptTemplate
from llama_index.embeddings.huggingface import HuggingFaceEmbedding
from llama_index.llms.kvboost import (
    KVBoostLLM,
    KVBoostResultRecorder,
    KVBoostRetrievalWarmer,
    KVBoostWarmTransformation,
)
from llama_index.vector_stores.faiss import FaissVectorStore

from kvboost_rag import KVBoostRAG
from kvboost_rag.eval.prompt import SYSTEM, TEMPLATE
from kvboost_rag.neighbours import default_embedder_path

# The eval's prompt, with LlamaIndex's names for the retrieved text and the question.
QA_TEMPLATE = ChatPromptTemplate(
    [
        ChatMessage(role="system", content=SYSTEM),
        ChatMessage(role="user", content=TEMPLATE.format(documents="{context_str}", question="{query_str}")),
    ]
)


def main() -> None:
    args = framework_demo_args(__doc__)
    examples, questions = corpus_and_questions(args)
    documents = [Document(text=e.passages[0].text, metadata={"title": e.passages[0].title}) for e in examples]
    print("Loading the embedded default model and all-MiniLM-L6-v2 ...")
    engine = KVBoostRAG.from_pretrained(store="memory")  # each run starts cold and leaves no files
    embed_model = HuggingFaceEmbedding(model_name=default_embedder_path(), device="cpu")

    ingestion = [SentenceSplitter(chunk_size=512, chunk_overlap=0)]
    if args.warm_at == "ingestion":
        ingestion.append(KVBoostWarmTransformation(engine=engine))
    else:
        get_dispatcher().add_event_handler(KVBoostRetrievalWarmer(engine=engine))
    started = time.perf_counter()
    index = VectorStoreIndex.from_documents(
        documents,
        storage_context=StorageContext.from_defaults(vector_store=FaissVectorStore(faiss.IndexFlatIP(384))),
        embed_model=embed_model,
        transformations=ingestion,
    )
    seconds = time.perf_counter() - started
    print(f"Ingested {len(documents)} passages into FAISS ({args.warm_at} warming) in {seconds:.1f} s")

    def query_engine(llm: KVBoostLLM):  # the user's query engine; only the LLM changes
        return index.as_query_engine(llm=llm, similarity_top_k=args.k, text_qa_template=QA_TEMPLATE)

    full_engine = query_engine(KVBoostLLM(engine=engine, mode="full", max_tokens=24, stop=["\n"]))
    kvboost_engine = query_engine(KVBoostLLM(engine=engine, max_tokens=24, stop=["\n"]))
    recorder = KVBoostResultRecorder()
    get_dispatcher().add_event_handler(recorder)
    engine.generate("Warm-up.", max_new_tokens=1, mode="full")

    print(f"\n{HEADER}")
    rows = []
    for question in questions:
        full_engine.query(question)
        answer = kvboost_engine.query(question)
        full, ours = recorder.results[-2:]
        rows.append(
            Row(
                question,
                full["ttft_s"],
                ours["ttft_s"],
                ours["reuse_share"],
                str(answer),
                full["total_s"],
                ours["total_s"],
            )
        )
        print(format_row(rows[-1]))
    print(format_summary(rows, f"LlamaIndex RetrieverQueryEngine, k={args.k}, warmed at {args.warm_at}"))


if __name__ == "__main__":
    main()
