"""`kvboost-rag cache stats|verify|prune`: inspect and maintain the persistent chunk store (a
directory, a Redis namespace, or both).

Each command first checks that what `--store` names holds a store: opening one creates it, and a
mistyped path or namespace is not a new, empty store. `stats` on a directory reads its index alone
(`store/disk/summary.py`), without torch, so it answers at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .app import cache_app, store_location
from .options import table_options
from .sizes import parse_bytes

if TYPE_CHECKING:
    from ..store.disk import DiskStore
    from ..store.disk.summary import DiskSummary
    from ..store.location import StoreLocations
    from ..store.redis import RedisStore
    from ..store.tier import ModelStats

UNNAMED = "(not recorded)"  # a store written before model names were


def _locations(store: str | None) -> StoreLocations:
    """What `store` names, each part checked to hold a store; where one does not, a message and
    exit 1, having created nothing."""
    from ..store.disk.summary import holds_store
    from ..store.location import StoreLocations

    try:
        locations = StoreLocations.parse(store_location(store))
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--store") from None
    if locations.directory is None and locations.redis_url is None:
        raise typer.BadParameter(
            "'memory' keeps chunks in one process: name a directory or a Redis URL", param_hint="--store"
        )
    missing: list[str] = []
    if locations.directory is not None and not holds_store(Path(locations.directory)):
        where = "check --store or KVBOOST_RAG_STORE" if store else "the default one: `kvboost-rag warm FILES` makes it"
        missing.append(f"{locations.directory}: no chunk store there ({where})")
    if locations.redis_url is not None:
        with _reporting(locations):
            from ..store.location import RedisLocation
            from ..store.redis.connection import namespace_exists

            redis = RedisLocation.parse(locations.redis_url)
            if not namespace_exists(redis):
                missing.append(f"{redis.redacted()}: no chunk store in namespace {redis.namespace!r} (check --store)")
    for line in missing:
        typer.echo(line, err=True)
    if missing:
        raise typer.Exit(code=1)
    return locations


@contextmanager
def _reporting(locations: StoreLocations) -> Iterator[None]:
    """A store that cannot be read, at opening or mid-command: a clear message and exit code 1
    instead of a traceback."""
    import sqlite3

    from ..store.disk.index import StoreVersionError

    redis_errors: tuple[type[Exception], ...] = ()
    redacted = ""
    if locations.redis_url is not None:
        from ..store.location import RedisLocation

        try:  # redis-py is an extra: imported where a URL asks for it
            from redis.exceptions import RedisError
        except ImportError as error:
            typer.echo(f"a Redis store needs: pip install 'kvboost-rag[redis]' ({error})", err=True)
            raise typer.Exit(code=1) from None
        redis_errors, redacted = (RedisError,), RedisLocation.parse(locations.redis_url).redacted()
    try:
        yield
    except StoreVersionError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(code=1) from error
    except (OSError, sqlite3.DatabaseError) as error:
        typer.echo(f"{locations.directory}: {error}; `kvboost-rag cache verify` rebuilds the index", err=True)
        raise typer.Exit(code=1) from error
    except redis_errors as error:
        typer.echo(f"{redacted}: {error}", err=True)
        raise typer.Exit(code=1) from error


@contextmanager
def _opened(locations: StoreLocations) -> Iterator[list[DiskStore | RedisStore]]:
    """The tiers of a store that exists (`_locations`), closed after the command."""
    tiers: list[DiskStore | RedisStore] = []
    with _reporting(locations):
        try:
            if locations.directory is not None:
                from ..store.disk import DiskStore

                tiers.append(DiskStore(locations.directory))
            if locations.redis_url is not None:
                tiers.append(_redis(locations.redis_url))
            yield tiers
        finally:
            for tier in tiers:
                tier.close()


def _redis(url: str) -> RedisStore:
    from ..store.redis import RedisStore

    tier = RedisStore(url)
    tier.connect()
    return tier


@cache_app.command("stats")
@table_options("store")
def cache_stats(*, options: dict[str, Any]) -> None:
    """What is stored: documents, chunks and bytes per model (by name and fingerprint)."""
    locations = _locations(options.get("store"))
    with _reporting(locations):
        if locations.directory is not None:
            from ..store.disk.summary import summarize

            _print_disk(summarize(Path(locations.directory)))
    if locations.redis_url is not None:
        with _reporting(locations):
            from ..store.location import RedisLocation
            from ..store.redis.connection import NamespaceConnection
            from ..store.redis.maintenance import model_stats

            redis = RedisLocation.parse(locations.redis_url)
            label = f"{redis.redacted()} (namespace {redis.namespace})"
            connection = NamespaceConnection(redis, None, label)
            try:  # the namespace's records only: no chunk is loaded, so torch is not imported
                _print_models(label, model_stats(connection))
            finally:
                connection.close()


def _print_disk(summary: DiskSummary) -> None:
    _print_models(str(summary.root), summary.models)
    for model, settings in summary.settings:  # what an engine opened with no settings adopts
        typer.echo(f"written with ({model}): {settings}")
    if not summary.has_index:
        typer.echo("no index beside the chunk files: `kvboost-rag cache verify` rebuilds it from them")
    if summary.has_index and summary.read_only:
        typer.echo("(read-only)")


def _print_models(where: str, rows: list[ModelStats]) -> None:
    typer.echo(where)
    if not rows:
        typer.echo("(empty)")
        return
    width = max(len(row.model or UNNAMED) for row in rows)
    typer.echo(f"{'model':{width}} {'fingerprint':16} {'documents':>9} {'chunks':>8} {'MiB':>9} {'pinned':>7}")
    for row in rows:
        typer.echo(
            f"{row.model or UNNAMED:{width}} {row.fingerprint:16} {row.documents:9} {row.chunks:8} "
            f"{row.bytes / 2**20:9.1f} {row.pinned_chunks:7}"
        )


@cache_app.command("verify")
@table_options("store")
def cache_verify(*, options: dict[str, Any]) -> None:
    """Check the index (rebuilt from the chunk files when damaged or missing) and every chunk;
    corrupted chunks are dropped (and recomputed when next warmed). In Redis, index entries
    naming evicted chunks are removed too."""
    from ..store.disk.recovery import verify_store
    from ..store.location import StoreLocations

    locations = _locations(options.get("store"))
    dropped = 0
    if locations.directory is not None:
        report = verify_store(locations.directory)
        if report.index_damage:
            typer.echo(
                f"index damaged ({'; '.join(report.index_damage)[:200]}): rebuilt {report.rebuilt_chunks} chunks "
                f"and {report.rebuilt_documents} documents from the files; "
                f"{report.unrecoverable_files} unrecoverable files removed"
            )
        checked = report.verify
        typer.echo(
            f"{locations.directory}: checked {checked.checked} chunks: {len(checked.dropped)} dropped, "
            f"{checked.orphans_removed} stray files removed, {checked.adopted} unindexed chunks indexed again"
        )
        dropped += len(checked.dropped)
    if locations.redis_url is not None:
        with _opened(StoreLocations(None, locations.redis_url)) as (redis_tier,):
            found = redis_tier.verify()
            typer.echo(
                f"{redis_tier}: checked {found.checked} chunks: {len(found.dropped)} dropped, "
                f"{found.postings_removed} index entries of evicted chunks removed"  # type: ignore[union-attr]
            )
            dropped += len(found.dropped)
    if dropped:
        raise typer.Exit(code=1)


@cache_app.command("prune")
@table_options("store")
def cache_prune(
    budget: Annotated[str, typer.Option(help="keep at most this much, e.g. 2GiB")],
    *,
    options: dict[str, Any],
) -> None:
    """Evict least recently used, unpinned chunks until the store fits the budget."""
    limit = parse_bytes(budget)
    with _opened(_locations(options.get("store"))) as tiers:
        for tier in tiers:
            evicted = tier.prune(limit)
            typer.echo(f"{tier}: evicted {evicted} chunks; {tier.total_bytes() / 2**20:.1f} MiB stored")
