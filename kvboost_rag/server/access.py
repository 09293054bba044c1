"""Who is calling: a tenant's key names its namespace, an API key has every right.

A tenant's requests reuse and keep chunks in its own namespace (`engine/namespaces.py`) and read
the shared corpus; it sees its own part of `/kvboost/store` only, continues only its own Responses
conversations, and may not prune the store or scrape `/metrics` (store-wide figures). An API key
(`--api-key`) works on the shared namespace: it warms the public corpus every tenant reads, sees
the whole store and prunes it. Where tenants are set, an API key's own prompts are not kept (every
tenant would read them). A server with no keys is open, one namespace, as before tenants.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine.inputs import check_namespace
from ..engine.namespaces import SHARED


@dataclass(frozen=True, slots=True)
class Caller:
    namespace: str  # whose chunks its requests reuse, keep and list
    admin: bool  # the whole store, pruning, /metrics
    keeps_prompts: bool = True  # False: an API key's prompts beside tenants (readable by all of them)


OPEN = Caller(SHARED, admin=True)  # a server without keys


@dataclass(frozen=True, slots=True)
class Access:
    """The server's keys: `api_keys` with every right, `tenants` (name -> keys) each a namespace."""

    api_keys: tuple[str, ...] = ()
    tenants: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for name, keys in self.tenants.items():
            if not check_namespace(name):
                raise ValueError("a tenant needs a name")
            if not keys:
                raise ValueError(f"tenant {name!r} has no key")
        for key in [*self.api_keys, *(key for keys in self.tenants.values() for key in keys)]:
            if not isinstance(key, str) or not key or key != key.strip() or " " in key:
                raise ValueError("a key is a non-empty string without spaces")
            if key in seen:
                raise ValueError("a key is given twice (to two tenants, or to a tenant and --api-key)")
            seen.add(key)

    @property
    def open(self) -> bool:
        return not self.api_keys and not self.tenants

    @property
    def tenanted(self) -> bool:
        return bool(self.tenants)

    def caller(self, token: str) -> Caller | None:
        """Who holds `token`; None: nobody. Every key is compared, in constant time each."""
        found: Caller | None = None
        keeps = not self.tenanted
        for key in self.api_keys:
            if secrets.compare_digest(token.encode(), key.encode()):
                found = Caller(SHARED, admin=True, keeps_prompts=keeps)
        for name, keys in self.tenants.items():
            for key in keys:
                if secrets.compare_digest(token.encode(), key.encode()):
                    found = Caller(name, admin=False)
        return found

    @classmethod
    def of(cls, api_keys: Iterable[str] = (), tenants: Iterable[str] = (), file: str | Path | None = None) -> Access:
        """From the command line: `api_keys`, `tenants` as NAME=KEY (a name may come back with
        more keys), and a JSON file {"tenants": {name: key or [keys]}, "api_keys": [keys]}."""
        named: dict[str, list[str]] = {}
        admin = list(api_keys)
        for pair in tenants:
            name, sign, key = pair.partition("=")
            if not sign:
                raise ValueError("--tenant takes NAME=KEY (one has no '=')")
            named.setdefault(name.strip(), []).append(key)
        if file is not None:
            loaded = _read(Path(file))
            for name, keys in loaded["tenants"].items():
                named.setdefault(name, []).extend([keys] if isinstance(keys, str) else keys)
            admin += loaded["api_keys"]
        return cls(tuple(admin), {name: tuple(keys) for name, keys in named.items()})


def _read(path: Path) -> dict[str, Any]:
    """The tenants file, checked: a wrong shape names what is wrong, never a key."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"tenants file {path}: {error}") from None
    if not isinstance(data, dict) or set(data) - {"tenants", "api_keys"}:
        raise ValueError(f'tenants file {path}: expected {{"tenants": {{name: key or [keys]}}, "api_keys": [keys]}}')
    tenants, admin = data.get("tenants", {}), data.get("api_keys", [])
    valid = isinstance(tenants, dict) and all(
        isinstance(keys, str) or (isinstance(keys, list) and all(isinstance(k, str) for k in keys))
        for keys in tenants.values()
    )
    if not valid or not isinstance(admin, list) or not all(isinstance(k, str) for k in admin):
        raise ValueError(f"tenants file {path}: each tenant's keys are a string or a list of strings, api_keys a list")
    return {"tenants": tenants, "api_keys": admin}
