"""What KVBoostLLM cannot do says so, LlamaIndex's way: no function calling, text only."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent, ReActAgent
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.program.function_program import FunctionCallingProgram
from llama_index.core.program.llm_program import LLMTextCompletionProgram
from llama_index.core.program.utils import get_program_for_llm
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.llms.kvboost import KVBoostLLM
from pydantic import BaseModel


class Answer(BaseModel):
    text: str


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def _run(agent: FunctionAgent, question: str) -> object:
    return await agent.run(question)


@pytest.fixture()
def llm() -> KVBoostLLM:
    return KVBoostLLM(model="/nowhere/model", context_window=2048)  # nothing here loads it


def test_llama_index_reads_that_there_is_no_function_calling(llm: KVBoostLLM) -> None:
    assert llm.metadata.is_function_calling_model is False and not isinstance(llm, FunctionCallingLLM)
    tool = FunctionTool.from_defaults(add)
    workflow = AgentWorkflow.from_tools_or_functions([tool], llm=llm)
    assert isinstance(next(iter(workflow.agents.values())), ReActAgent)  # tools through the prompt
    program = get_program_for_llm(Answer, PromptTemplate("{question}"), llm)
    assert isinstance(program, LLMTextCompletionProgram)  # structured_predict: through the prompt
    with pytest.raises(ValueError, match="does not support function calling"):
        FunctionCallingProgram.from_defaults(output_cls=Answer, prompt_template_str="{question}", llm=llm)
    with pytest.raises(ValueError, match="LLM must be a FunctionCallingLLM"):  # its own words, at its first step
        asyncio.run(_run(FunctionAgent(tools=[tool], llm=llm), "What is 2 + 3?"))
    assert llm._own_engine is None


def test_tool_calls_name_the_alternative(llm: KVBoostLLM) -> None:
    tool = FunctionTool.from_defaults(add)
    with pytest.raises(NotImplementedError, match="no function calling.*ReActAgent"):
        llm.chat_with_tools([tool], user_msg="What is 2 + 3?")
    with pytest.raises(NotImplementedError, match="ReActAgent"):
        llm.stream_chat_with_tools([tool], user_msg="What is 2 + 3?")
    with pytest.raises(NotImplementedError, match="ReActAgent"):
        asyncio.run(llm.achat_with_tools([tool], user_msg="What is 2 + 3?"))
    with pytest.raises(NotImplementedError, match="ReActAgent"):
        asyncio.run(llm.astream_chat_with_tools([tool], user_msg="What is 2 + 3?"))


def test_an_image_block_is_refused_not_dropped(llm: KVBoostLLM) -> None:
    image = ImageBlock(url="https://example.com/cat.png", image_mimetype="image/png")
    message = ChatMessage(role="user", blocks=[TextBlock(text="What is in this picture?"), image])
    with pytest.raises(ValueError, match="reads text only: message 1 has a part of type 'image'"):
        llm.chat([ChatMessage(role="system", content="Answer briefly."), message])
    with pytest.raises(ValueError, match="reads text only"):
        llm.stream_chat([message])
    assert llm._own_engine is None  # refused before the model loads
