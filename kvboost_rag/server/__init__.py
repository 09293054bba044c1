"""An OpenAI-compatible HTTP server over one engine (`kvboost-rag serve`); needs the `server` extra."""

from .access import Access
from .app import ServerSettings, create_app

__all__ = ["Access", "ServerSettings", "create_app"]
