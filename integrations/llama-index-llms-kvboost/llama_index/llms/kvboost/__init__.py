from llama_index.llms.kvboost.base import KVBoostLLM
from llama_index.llms.kvboost.warming import (
    KVBoostResultRecorder,
    KVBoostRetrievalWarmer,
    KVBoostWarmTransformation,
    node_text,
)

__all__ = ["KVBoostLLM", "KVBoostResultRecorder", "KVBoostRetrievalWarmer", "KVBoostWarmTransformation", "node_text"]
