"""LangChain's own standard integration tests (`langchain-tests`) against `miserver serve`.

`ChatModelIntegrationTests` drives `langchain_openai.ChatOpenAI` and
`EmbeddingsIntegrationTests` drives `OpenAIEmbeddings`, both pointed at the
default server (SmolLM2's GGUF on llama.cpp) and both on the validating httpx
clients of tests/openai_reference.py, so every body and stream chunk LangChain
receives must also validate against OpenAI's own schemas (OAI-GEN-02).

The capability properties declare what miserver serves: tool calling,
`tool_choice`, structured output (pydantic, TypedDict, JSON schema), JSON mode
and usage metadata, streamed usage included. Image, audio, PDF and
Anthropic-style inputs are not served (text models only), and the VCR timing
test needs recorded cassettes: those stay skipped with langchain-tests' own
one-line reasons. Nothing here reaches the internet: `tiktoken` is never asked
for an encoding (embeddings send raw text, `check_embedding_ctx_length=False`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from langchain_tests.integration_tests import (
    ChatModelIntegrationTests,
    EmbeddingsIntegrationTests,
)

from tests import openai_reference
from tests.conftest import GGUF_ID, MODEL_ID
from tests.e2e.conftest import LiveServer
from tests.openai_reference import Check, http

pytestmark = [
    pytest.mark.e2e,
    # langchain-openai dumps the SDK's parsed stream chunks, whose `parsed` field is typed
    # None: pydantic warns on every structured-output stream, against OpenAI too
    pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning"),
]

"""The default model: what `miserver serve` loads with no `--model`."""
MAX_TOKENS = 512
"""Generous: structured output and tool calls must be able to finish their document."""
RETRIES = 8
"""A request's retries of a 503 model_busy while the model switches back."""


@dataclass(frozen=True, slots=True)
class Target:
    """The default server and the validating clients LangChain reaches it through."""

    base_url: str
    check: Check
    http_client: http.Client
    http_async_client: http.AsyncClient

    def clients(self) -> dict[str, Any]:
        """The model-override tests name the conversion, and a request that meets the switch
        back gets 503 model_busy with Retry-After (1 s): up to RETRIES tries, a second apart,
        where LangChain's default two did not outlast a switch on a busy CI machine."""
        return {
            "base_url": self.base_url,
            "api_key": "not-needed",
            "max_retries": RETRIES,
            "timeout": openai_reference.TIMEOUT,
            "http_client": self.http_client,
            "http_async_client": self.http_async_client,
        }


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def target(default_server: LiveServer, openai_check: Check) -> AsyncIterator[Target]:
    """The clients live as long as the module; the async one on the session's event loop."""
    sync = openai_reference.client(openai_check)
    async_ = openai_reference.async_client(openai_check)
    try:
        yield Target(default_server.base_url, openai_check, sync, async_)
    finally:
        sync.close()
        await async_.aclose()


class Served:
    """A standard-test class that reaches `target` (whose `openai_check` fails the test on
    any body that breaks OpenAI's schema: tests/e2e/conftest.py)."""

    served: Target

    @pytest.fixture(autouse=True)
    def _served(self, target: Target) -> None:
        self.served = target


class TestChatOpenAIOnMiserver(Served, ChatModelIntegrationTests):
    """OAI-GEN-02, OAI-INTEG-04, OAI-TOOLS-01..07, OAI-TOOLS-12..19, OAI-SO-01..05,
    OAI-STREAM-05: ChatOpenAI passes LangChain's standard chat-model tests."""

    @property
    def chat_model_class(self) -> type[ChatOpenAI]:
        return ChatOpenAI

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {
            **self.served.clients(),
            "model": GGUF_ID,
            "temperature": 0,
            # SmolLM2-135M repeats itself inside a JSON string under plain greedy decoding
            # until max_tokens; a mild penalty on what it already wrote lets documents end
            "frequency_penalty": 0.5,
            "max_tokens": MAX_TOKENS,
            "stream_usage": True,  # a custom base_url leaves it off by default
            "use_responses_api": False,  # Chat Completions (the Responses API: the class below)
        }

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @pytest.mark.xfail(
        reason="SmolLM2-135M names other keys than the prompt asks for under json_object, "
        "which allows any object, so the Joke model misses a field; json_schema structured "
        "output passes",
        raises=OutputParserException,  # pydantic's ValidationError, as LangChain's parser wraps it
        strict=True,  # greedy decoding: the same reply every run, so a pass is news
    )
    def test_json_mode(self, model: BaseChatModel) -> None:
        super().test_json_mode(model)

    @pytest.mark.xfail(
        reason="SmolLM2-135M writes a placeholder, not the CJK name, into the arguments; the "
        "server keeps Unicode unescaped (test_tools_generic.py::test_unicode_arguments_*)",
        raises=AssertionError,  # langchain-tests' "Unicode characters not found in" assert
        strict=True,  # greedy decoding: the same reply every run, so a pass is news
    )
    def test_unicode_tool_call_integration(
        self,
        model: BaseChatModel,
        *,
        tool_choice: str | None = None,
        force_tool_call: bool = True,
    ) -> None:
        super().test_unicode_tool_call_integration(
            model, tool_choice=tool_choice, force_tool_call=force_tool_call
        )

    @property
    def model_override_value(self) -> str:
        """The same weights' transformers conversion: naming it loads it (OAI-ERR-30)."""
        return MODEL_ID


class TestChatOpenAIResponsesOnMiserver(TestChatOpenAIOnMiserver):
    """Issue 44 acceptance: the same standard tests with `use_responses_api=True`, so that
    ChatOpenAI speaks the Responses API (`/v1/responses`, its typed stream events, function
    tools flat, `text.format`); every body and event is checked against OpenAI's Responses
    schemas. The same subset passes, and the same two known failures fail."""

    @property
    def chat_model_params(self) -> dict[str, Any]:
        """The chat class's, with the penalty as an extension of the body: the SDK's
        `responses.create` takes no `frequency_penalty` (miserver's route does)."""
        params = {**super().chat_model_params, "use_responses_api": True}
        params["extra_body"] = {"frequency_penalty": params.pop("frequency_penalty")}
        return params


class TestOpenAIEmbeddingsOnMiserver(Served, EmbeddingsIntegrationTests):
    """OAI-GEN-02, OAI-EMB-01, OAI-EMB-03, OAI-EMB-04: OpenAIEmbeddings passes LangChain's
    standard embeddings tests (the SDK's default base64, decoded)."""

    @property
    def embeddings_class(self) -> type[OpenAIEmbeddings]:
        return OpenAIEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {
            **self.served.clients(),
            "model": GGUF_ID,
            "check_embedding_ctx_length": False,  # raw text, never tiktoken
            "tiktoken_enabled": False,
        }
