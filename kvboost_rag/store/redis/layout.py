"""Where each piece of a namespace lives in Redis: key names whose hash tags keep every multi-key
operation inside one hash slot, so the same layout runs on one server and on a Redis Cluster.

A chunk goes to one of `shards` groups (by its content hash); the group's tag `{ns:g}` is on
the chunk's value, on its prefix pointer and on the window postings that index it there, so one
script writes all of them at once. A lookup asks every group (one command per group, pipelined).
Settings and the manifest share the tag `{ns:meta}`; a document record is in its own key's group.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class KeyLayout:
    namespace: str
    shards: int

    def group_of(self, key: bytes) -> int:
        return int.from_bytes(key[:4], "big") % self.shards

    def groups(self) -> range:
        return range(self.shards)

    def chunk(self, content: bytes) -> str:
        return f"{self._tag(self.group_of(content))}:c:{content.hex()}"

    def prefix(self, group: int, prefix: bytes) -> str:
        """The pointer from a chunk's prefix hash (EXACT lookups) to its content hash."""
        return f"{self._tag(group)}:p:{prefix.hex()}"

    def window(self, group: int, window: bytes) -> str:
        """The set of the group's chunks that hold this token window (approximate matching)."""
        return f"{self._tag(group)}:w:{window.hex()}"

    def document(self, doc_key: bytes) -> str:
        return f"{self._tag(self.group_of(doc_key))}:d:{doc_key.hex()}"

    def claim(self, doc_key: bytes) -> str:
        """Which writer is encoding the document now (a value with a TTL)."""
        return f"{self._tag(self.group_of(doc_key))}:claim:{doc_key.hex()}"

    @property
    def manifest(self) -> str:
        return "{%s:meta}:manifest" % self.namespace

    def settings(self, model: bytes) -> str:
        return "{%s:meta}:settings:%s" % (self.namespace, model.hex())

    @property
    def models(self) -> str:
        """The hash of model names (chunk fingerprint hex -> the name of the model that wrote them)."""
        return "{%s:meta}:models" % self.namespace

    def pattern(self, kind: str) -> str:
        """A SCAN pattern for one kind of key of this namespace (maintenance only, never matching)."""
        return "{%s:*}:%s:*" % (self.namespace, kind)

    @staticmethod
    def hex_of(key: str | bytes) -> bytes:
        """The hash a chunk, window or document key names."""
        text = key.decode() if isinstance(key, bytes) else key
        return bytes.fromhex(text.rsplit(":", 1)[1])

    def _tag(self, group: int) -> str:
        return "{%s:%d}" % (self.namespace, group)
