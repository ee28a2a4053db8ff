"""The OpenAI Agents SDK (`agents`, unmodified) runs an agent with one function tool to completion
against /v1/responses: the forced first turn calls the tool, the SDK runs it and sends its output
back (the whole history: the SDK's default), and the second turn answers. A response that ends
incomplete fails the SDK's run, so the turns get room to finish (64 tokens)."""

from __future__ import annotations

import asyncio

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

from tests.tokenizer.http_helpers import RunningServer

pytestmark = pytest.mark.slow


def test_an_agent_calls_its_tool_and_finishes(shared_server: RunningServer) -> None:
    set_tracing_disabled(True)  # NOTE: the SDK would otherwise export traces to OpenAI
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return f"It is sunny in {city}."

    client = openai.AsyncOpenAI(base_url=shared_server.url + "/v1", api_key="agent-key", max_retries=0, timeout=60)
    agent = Agent(name="weather", instructions="You answer questions about the weather.", tools=[get_weather],
                  model=OpenAIResponsesModel(model="default", openai_client=client),
                  model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=64))
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=3))
    assert len(cities) == 1 and cities[0]
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"] and kinds[-1] == "message_output_item"
    assert isinstance(result.final_output, str) and len(result.raw_responses) == 2
    assert all(r.response_id and r.response_id.startswith("resp_") for r in result.raw_responses)
    first, second = (r.usage for r in result.raw_responses)
    assert second.input_tokens_details.cached_tokens >= first.input_tokens  # the history came from the cache
