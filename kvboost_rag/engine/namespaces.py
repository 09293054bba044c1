"""Namespaces: several tenants in one store, none finding another's chunks.

A namespace's name is in every key its chunks are written and found under (`KeySpace.derive`), in
every tier, so a document one namespace warmed, or a prompt it sent, is a miss for every other:
never reused, counted or listed there. The shared namespace ("") is read by every namespace beside
its own (moved reuse only): a public corpus warmed once, by an admin or `kvboost-rag warm`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..plan.keys import KeySpace
from .keeping import AnswerKeeper
from .warming import Warmer

SHARED = ""  # the namespace every other one reads too


@dataclass(slots=True)
class Namespace:
    """One namespace's keys, and the warmer and keeper that write under them."""

    name: str
    keys: KeySpace
    warmer: Warmer
    keeper: AnswerKeeper
    settings_recorded: bool = False  # its model name and the store's settings are in every tier


class Namespaces:
    """The namespaces an engine has served, made on first use."""

    def __init__(self, make: Callable[[str], Namespace]) -> None:
        self._make = make
        self._made: dict[str, Namespace] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> Namespace:
        with self._lock:
            found = self._made.get(name)
            if found is None:
                found = self._made[name] = self._make(name)
            return found

    @property
    def shared(self) -> Namespace:
        return self[SHARED]
