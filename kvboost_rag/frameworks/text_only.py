"""Inputs the engine cannot read: an image, audio or file part of a chat message is refused.

Dropping such a part and answering anyway would answer a question the model never saw, so each
framework refuses it, as the server does (a 400), with one message saying what to do instead.
"""

from __future__ import annotations

# Non-text part types by LangChain's, OpenAI's, Anthropic's and LlamaIndex's (`block_type`) names.
MEDIA_PARTS = frozenset(
    {"image", "image_url", "input_image", "audio", "input_audio", "video", "file", "input_file", "document"}
)


def refuse_media(kind: object, message_index: int, model: str) -> None:
    """A ValueError where a message part is an image, audio, video or file: the model reads text only."""
    if kind in MEDIA_PARTS:
        raise ValueError(
            f"{model} reads text only: message {message_index} has a part of type {kind!r}, which the model would "
            "never see. Put the text it stands for in the message instead (an image's caption or OCR, a "
            "file's extracted text), or use a multimodal model for this step."
        )
