"""The conversations behind the server's Responses API answers, for `previous_response_id`.

A response names its conversation by its id: the next request sends that id instead of the
history, and the server prepends the kept messages (instructions, inputs and answers so far). The
engine keeps each turn's KV (`store_prompt`), so the history is reused, not prefilled again. Kept
in memory, the most recent `capacity` conversations, each with the namespace it was asked in: an id
not kept, or kept for another tenant, is a 400, as OpenAI answers one it does not know.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from .errors import APIError

Messages = list[dict[str, str]]
DEFAULT_CAPACITY = 1024


class KeptResponses:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, tuple[str, Messages]] = OrderedDict()

    def history(self, response_id: str, namespace: str = "") -> Messages:
        """The messages up to and with the answer `response_id` gave, where `namespace` asked them."""
        with self._lock:
            namespace_and_messages = self._kept.get(response_id)
            if namespace_and_messages is None or namespace_and_messages[0] != namespace:
                raise APIError(
                    400,
                    f"Previous response with id '{response_id}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            self._kept.move_to_end(response_id)
            return list(namespace_and_messages[1])

    def keep(self, response_id: str, namespace: str, messages: Messages) -> None:
        with self._lock:
            self._kept[response_id] = (namespace, messages)
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)
