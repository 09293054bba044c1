"""LangChain integration of kvboost-rag."""

from langchain_kvboost.callbacks import KVBoostRetrievalWarmer
from langchain_kvboost.chat_models import ChatKVBoost
from langchain_kvboost.llms import KVBoostLLM
from langchain_kvboost.warming import warm_documents

__all__ = ["ChatKVBoost", "KVBoostLLM", "KVBoostRetrievalWarmer", "warm_documents"]
