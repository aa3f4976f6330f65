"""A tokenize body read into what to tokenize, before any load (POST /v1/tokenize).

`prompt` is text, tokenized as /v1/completions tokenizes a string prompt.
`messages` is made into the chat completion it would be and taken through
that path's own steps: `/v1/chat/completions`' field matrix (what the engine
ignores or refuses, serving/admission.py), its refusals and thinking
(`refusals`), its unused fields left out (`as_rendered`); the engine
renders it with `prompt_ids`, its tools shown, as `prepare` does.

vLLM's `add_generation_prompt` and `continue_final_message` are served where
they name what a chat completion renders: the generation prompt after a
user's (or tool's) message, or a trailing assistant message left open to be
continued (OAI-CONT-01). Any other combination is refused naming the field,
as is a `chat_template` of the request's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ... import headers as hdr
from ...engines.base import Engine
from ...errors import FieldNotHonoured, InvalidParameter
from ...generated import v1
from ...models.manager import ModelManager
from ...models.registry import ModelEntry
from ..admission import admit
from ..chat.tools import tool_plan
from ..completions.defaults import RequestDefaults
from ..completions.prepared import as_rendered, prompt_ids
from ..completions.refusals import refusals
from ..completions.requests import GenerationRequest, chat_request
from ..policy import report_unused, undeclared
from ..prompts import TextPrompt
from ..request_schemas import v1_schema

CHAT_FIELDS = ("messages", "tools", "chat_template_kwargs")  # what the chat completion gets
CHAT_ONLY = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs", "tools")


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenizeAsk:
    """What to tokenize: `text`, or `chat` (the chat completion the messages would be, its
    one prompt); the response's headers (the model, the fields left unused)."""

    text: TextPrompt | None
    chat: GenerationRequest | None
    token_strs: bool
    headers: dict[str, str]

    def ids(self, engine: Engine) -> list[int]:
        """The ids, as a completion's prompt gets them (blocking: the engine's tokenizer)."""
        if self.chat is None:
            assert self.text is not None
            return prompt_ids(engine, self.text)
        tools = tool_plan(self.chat.tools, engine.chat_template, self.chat.prompts[0])
        return prompt_ids(engine, self.chat.prompts[0], 0, tools)


def unused_headers(
    entry: ModelEntry, unused: Sequence[str], request_headers: Mapping[str, str], max_bytes: int
) -> dict[str, str]:
    """`X-miLLM-Model`, and the fields left unused reported (refused in strict mode)."""
    strict = hdr.strict_mode(request_headers)
    return {hdr.MODEL: entry.model_id, **report_unused(unused, strict, max_bytes)}


def read(
    req: v1.TokenizeRequest,
    body: Mapping[str, Any],
    entry: ModelEntry,
    *,
    manager: ModelManager,
    defaults: RequestDefaults,
    request_headers: Mapping[str, str],
    max_bytes: int,
) -> TokenizeAsk:
    """The ask of a tokenize body, or its refusal; nothing here needs the model loaded."""
    if (req.prompt is None) == (req.messages is None):
        both = req.prompt is not None
        raise InvalidParameter(
            "messages" if both else "prompt",
            "Send `prompt` or `messages`, not both."
            if both
            else "Send `prompt` (text to tokenize) or `messages` (a chat to render and tokenize).",
        )
    if req.chat_template is not None:
        raise FieldNotHonoured(
            "chat_template", "here: a chat is rendered with the model's own template"
        )
    strs = bool(req.return_token_strs)
    stray = list(undeclared(body, v1_schema().named("TokenizeRequest")))
    if req.prompt is not None:
        unused = [name for name in CHAT_ONLY if body.get(name) is not None] + stray
        text = TextPrompt(req.prompt, req.add_special_tokens is not False)
        headers = unused_headers(entry, unused, request_headers, max_bytes)
        return TokenizeAsk(text=text, chat=None, token_strs=strs, headers=headers)
    _check_turn(req)
    chat_body = {name: body[name] for name in CHAT_FIELDS if body.get(name) is not None}
    chat_body["model"] = entry.model_id
    admission = admit(manager, "chat", entry.model_id, chat_body, request_headers=request_headers)
    chat = chat_request(v1.ChatCompletionRequest.model_validate(chat_body))
    unused, thinking = refusals(chat, admission, defaults)
    chat = as_rendered(chat, [*admission.ignored, *unused], thinking)
    mine = [name for name in stray if name not in admission.ignored]
    headers = admission.headers([*unused, *mine], max_bytes)
    return TokenizeAsk(text=None, chat=chat, token_strs=strs, headers=headers)


def _check_turn(req: v1.TokenizeRequest) -> None:
    """vLLM's turn flags, served where they name what a chat completion renders."""
    cont = bool(req.continue_final_message)
    # absent, the generation prompt is what the other asks: continuing a message opens none
    generation = not cont if req.add_generation_prompt is None else req.add_generation_prompt
    assert req.messages is not None
    last = req.messages[-1].role
    if req.add_special_tokens:
        raise FieldNotHonoured(
            "add_special_tokens",
            "with `messages`: a chat's ids are a chat completion's, with the template's BOS, "
            "or the tokenizer's where the template writes none, never two (OAI-TOKIDS-02..05)",
        )
    if generation and cont:
        raise InvalidParameter(
            "continue_final_message",
            "`continue_final_message` and `add_generation_prompt` cannot both be true.",
        )
    if last == "assistant" and not cont:
        raise InvalidParameter(
            "continue_final_message",
            "The last message is the assistant's, which a chat completion continues "
            "(OAI-CONT-01): send `continue_final_message: true` and `add_generation_prompt: "
            "false`. A closed assistant turn is not rendered here.",
        )
    if last != "assistant" and cont:
        raise InvalidParameter(
            "continue_final_message",
            f"`continue_final_message` continues a trailing assistant message; the last "
            f"message is `{last}`.",
        )
    if not generation and not cont:
        raise FieldNotHonoured(
            "add_generation_prompt",
            "as false here: a chat completion renders the generation prompt after a chat "
            "that does not end with the assistant's message",
        )
