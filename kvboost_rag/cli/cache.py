"""`kvboost-rag cache stats|verify|prune`: inspect and maintain the persistent chunk store."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from .app import StoreOption, cache_app, store_dir
from .sizes import parse_bytes

if TYPE_CHECKING:
    from ..store.disk import DiskStore


@contextmanager
def _opened(store: str | None) -> Iterator[DiskStore]:
    """The store; where its index cannot be read, at opening or mid-command, a clear message and
    exit code 1 instead of a traceback."""
    import sqlite3

    from ..store.disk import DiskStore

    try:
        disk = DiskStore(store_dir(store))
        try:
            yield disk
        finally:
            disk.close()
    except (OSError, sqlite3.DatabaseError) as error:
        typer.echo(f"{store_dir(store)}: {error}; `kvboost-rag cache verify` rebuilds the index", err=True)
        raise typer.Exit(code=1) from error


@cache_app.command("stats")
def cache_stats(store: StoreOption = None) -> None:
    """What is stored: documents, chunks and bytes per model."""
    with _opened(store) as disk:
        _print_stats(disk)


def _print_stats(disk: DiskStore) -> None:
    rows = disk.stats()
    typer.echo(f"{disk.root}")
    typer.echo(f"{'model fingerprint':18} {'documents':>9} {'chunks':>8} {'MiB':>9} {'pinned':>7}")
    for row in rows:
        typer.echo(
            f"{row.fingerprint:18} {row.documents:9} {row.chunks:8} {row.bytes / 2**20:9.1f} {row.pinned_chunks:7}"
        )
    if not rows:
        typer.echo("(empty)")
    orphans = disk.orphan_files()
    if orphans:
        typer.echo(f"{orphans} chunk files no index row names (`kvboost-rag cache verify` removes them)")
    if disk.read_only:
        typer.echo("(read-only)")


@cache_app.command("verify")
def cache_verify(store: StoreOption = None) -> None:
    """Check the index (rebuilt from the chunk files when damaged or missing) and every chunk;
    corrupted chunks are dropped (and recomputed when next warmed)."""
    from ..store.disk.recovery import verify_store

    report = verify_store(store_dir(store))
    if report.index_damage:
        typer.echo(
            f"index damaged ({'; '.join(report.index_damage)[:200]}): rebuilt {report.rebuilt_chunks} chunks "
            f"and {report.rebuilt_documents} documents from the files; "
            f"{report.unrecoverable_files} unrecoverable files removed"
        )
    checked = report.verify
    typer.echo(
        f"checked {checked.checked} chunks: {len(checked.dropped)} dropped, "
        f"{checked.orphans_removed} stray files removed"
    )
    if checked.dropped:
        raise typer.Exit(code=1)


@cache_app.command("prune")
def cache_prune(
    budget: Annotated[str, typer.Option(help="keep at most this much, e.g. 2GiB")],
    store: StoreOption = None,
) -> None:
    """Evict least recently used, unpinned chunks until the store fits the budget."""
    limit = parse_bytes(budget)
    with _opened(store) as disk:
        evicted = disk.prune(limit)
        typer.echo(f"evicted {evicted} chunks; {disk.total_bytes() / 2**20:.1f} MiB stored")
