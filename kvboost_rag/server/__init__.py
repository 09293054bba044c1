"""An OpenAI-compatible HTTP server over one engine (`kvboost-rag serve`); needs the `server` extra."""

from .app import ServerSettings, create_app

__all__ = ["ServerSettings", "create_app"]
