"""`kvboost-rag warm`: pre-warm documents into the persistent chunk store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import DtypeOption, ModelOption, StoreOption, app, store_dir
from .sizes import parse_bytes


@app.command()
def warm(
    paths: Annotated[list[Path], typer.Argument(help=".txt, .md, .json, .jsonl (.gz) files or directories")],
    store: StoreOption = None,
    model: ModelOption = None,
    dtype: DtypeOption = None,
    chunk_size: Annotated[int, typer.Option()] = 128,
    chunking: Annotated[str, typer.Option(help="fixed, semantic or adaptive")] = "fixed",
    quantization: Annotated[str | None, typer.Option(help="int8 or int4 (default: none)")] = None,
    warm_prefix: Annotated[str, typer.Option(help="text encoded before each document, not kept")] = "",
    memory_budget: Annotated[str, typer.Option(help="memory for chunks while warming")] = "1GiB",
) -> None:
    """Pre-warm documents into the persistent chunk store. Idempotent and resumable: documents
    already stored are skipped without model work, so an interrupted run continues."""
    from tqdm import tqdm

    from ..config import EngineConfig
    from ..engine import KVBoostRAG
    from .documents import document_files, read_documents

    try:
        files = document_files(paths)
        documents = [doc for path in files for doc in read_documents(path)]
        config = EngineConfig.from_options(
            chunk_size=chunk_size,
            chunking=chunking,
            kv_quantization=quantization,
            warm_prefix=warm_prefix,
            memory_budget_bytes=parse_bytes(memory_budget),
            store=str(store_dir(store)),
        )
    except (ValueError, FileNotFoundError) as error:
        raise typer.BadParameter(str(error)) from error
    if not documents:
        raise typer.BadParameter("no documents found in " + ", ".join(map(str, paths)))
    engine = KVBoostRAG.from_pretrained(model, dtype=dtype, config=config)
    skipped = chunks = 0
    # Progress in characters: proportional to the work, without tokenizing every document twice.
    with tqdm(total=sum(map(len, documents)), unit="char", unit_scale=True, desc=f"warm {len(documents)} docs") as bar:
        for document in documents:
            report = engine.warm(document)
            skipped += report.skipped_documents
            chunks += report.chunks_stored
            bar.update(len(document))
    typer.echo(
        f"{len(documents)} documents from {len(files)} files: {len(documents) - skipped} warmed ({chunks} chunks), "
        f"{skipped} already warm. Store: {engine.config.store}"
    )
