"""What ChatKVBoost cannot do says so, and what to use instead: tools, structured output, images."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_kvboost import ChatKVBoost
from pydantic import BaseModel


class Answer(BaseModel):
    text: str


def test_bind_tools_names_the_alternative() -> None:
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    with pytest.raises(NotImplementedError, match="no tool calling.*chat model that supports bind_tools"):
        ChatKVBoost(model="/nowhere/model").bind_tools([add])


def test_with_structured_output_names_the_alternative() -> None:
    with pytest.raises(NotImplementedError, match="no with_structured_output.*PydanticOutputParser"):
        ChatKVBoost(model="/nowhere/model").with_structured_output(Answer)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image", "source_type": "base64", "data": "iVBORw0KGgo=", "mime_type": "image/png"},
        {"type": "file", "source_type": "url", "url": "https://example.com/a.pdf"},
    ],
)
def test_an_image_part_is_refused_not_dropped(part: dict) -> None:
    chat = ChatKVBoost(model="/nowhere/model")
    message = HumanMessage(content=[{"type": "text", "text": "What is in this picture?"}, part])
    with pytest.raises(ValueError, match=f"reads text only: message 1 has a part of type '{part['type']}'"):
        chat.invoke([SystemMessage(content="Answer briefly."), message])
    with pytest.raises(ValueError, match="reads text only"):
        list(chat.stream([message]))
    assert chat._own_engine is None  # refused before the model loads
