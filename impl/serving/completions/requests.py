"""Typed requests in, one complete frozen `GenerationRequest` out, with the
cross-field rules the schema cannot say (OAI-CHAT-10).

Everything the completion path needs from the body is read here, once: the
prompts, sampling, tools, output format, thinking, scoring. Sampling fields a
request leaves out stay None until the config's defaults apply, in one place
(serving/completions/defaults.py). The raw body has one reader besides this one: the
field matrix (serving/admission.py), which must see undeclared keys.

Each ask is resolved later against the model, under a name of its own:

    SteeringAsk     -> steered.resolution (refusals, echo), then a RequestSource (hooks)
    ToolAsk         -> a ToolPlan (the template's call format), in Prepared
    ThinkAsk        -> a bool, whether the template renders thinking (refusals.py)
    OutputFormat    -> a Constraint, compiled in prepare()
    ScoringAsk      -> a ScoreQuery per pass (scoring_service.py)
    ActivationsAsk  -> a Reading (reading.py), then a Capture per generation (hooks)
    the armed probes (not in the request) -> a ProbeRun, then a Monitor per choice (hooks)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

from pydantic import BaseModel

from ...engines.base import ChatPrompt
from ...errors import ApiError, InvalidParameter
from ...generated import v1
from ...steering.request import InlineSet, SteeringAsk
from ..chat.response_format import OutputFormat, output_format
from ..chat.thinking import KEY as THINKING_KEY
from ..chat.thinking import ThinkAsk
from ..chat.tools import ToolAsk, tool_ask
from ..prompts import Prompt, TextPrompt, TokenPrompt, entries, value_of
from ..renames import Renames
from .activations import ActivationsAsk
from .scoring import ScoringAsk, logprobs_asked, scoring_ask

Request: TypeAlias = v1.ChatCompletionRequest | v1.CompletionRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationRequest:
    """One chat or text completion request, whole: what it asks, typed."""

    endpoint: str
    model_id: str
    prompts: tuple[Prompt, ...]
    n: int
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # `stream_options.continuous_usage_stats` with `include_usage`
    max_tokens: int | None
    temperature: float | None  # None: the config's `temp` (RequestDefaults.apply)
    top_p: float | None  # None: the config's `top-p`
    frequency_penalty: float
    presence_penalty: float
    stops: tuple[str, ...]
    seed: int | None
    steering: SteeringAsk = field(default_factory=SteeringAsk)
    scoring: ScoringAsk | None = None
    top_k: int | None = None  # None: the config's `top-k` (Messages' `top_k` sets it); 0 is off
    tools: ToolAsk | None = None
    output: OutputFormat | None = None  # a constrained `response_format` (not `text`)
    think: ThinkAsk = field(default_factory=ThinkAsk)
    thinking_budget: int | None = None  # the most tokens a reasoning span may hold
    top_logprobs: int | None = None  # chat's, checked against `logprobs` after the policy
    precision: str | None = None  # `scoring_precision` as sent
    as_token_ids: bool = False  # `return_tokens_as_token_ids: true`
    # a generation's `logprobs` (not scoring's): the alternatives per token, None for none
    logprobs: int | None = None
    echo: bool = False  # completions' `echo`: the prompt's text (and logprobs) first
    logit_bias: tuple[tuple[int, float], ...] = ()  # checked against the vocabulary later
    ignore_eos: bool = False  # every end-of-generation id banned (`Prepared`'s bias)
    activations: ActivationsAsk | None = None  # `return_sae_activations` (OAI-ACT)
    truncate: bool = False  # oldest turns dropped past the window (Responses' `truncation`)
    names: Renames = ()  # a front end's names for the chat fields a report names
    sent: frozenset[str] = frozenset()  # the declared fields sent with a value (not null)

    @property
    def scoring_temperature(self) -> float:
        """The temperature a scoring request divides the logits by (OpenAI's default 1)."""
        return 1.0 if self.temperature is None else self.temperature


def _max_tokens(a: int | None, b: int | None) -> int | None:
    if a is not None and b is not None and a != b:
        raise ApiError(
            "invalid_parameter",
            f"max_tokens ({a}) and max_completion_tokens ({b}) differ; send one, or equal values.",
            "max_completion_tokens",
        )
    return a if a is not None else b


def _stops(raw: Any) -> tuple[str, ...]:
    value = value_of(raw)
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    return tuple(s for s in items if s)


def steering_ask(
    req: Request | v1.CreateResponseRequest | v1.CreateMessageRequest,
) -> SteeringAsk:
    """The request's `profile`, `steering_intensity` and inline `steering` (OAI-PROF/DIAL/INL);
    the Responses and Messages APIs' too (serving/responses, serving/messages)."""
    inline = None
    if req.steering is not None:
        features = tuple((f.index, f.strength) for f in req.steering.features)
        inline = InlineSet(req.steering.sae_id, features)
    intensity = value_of(req.steering_intensity)
    if isinstance(intensity, float) and not math.isfinite(intensity):
        raise InvalidParameter("steering_intensity", "steering_intensity must be a finite number.")
    return SteeringAsk(req.profile, intensity, inline)


def _common(
    endpoint: str, req: Request, prompts: tuple[Prompt, ...], **chat: Any
) -> GenerationRequest:
    """The fields both endpoints share; `chat` holds the chat-only ones."""
    stream = bool(req.stream)
    n = req.n or 1
    max_tokens = _max_tokens(req.max_tokens, req.max_completion_tokens)
    scoring = scoring_ask(endpoint, req, max_tokens)
    options = req.stream_options
    if n > 1 and stream and scoring is None:
        raise InvalidParameter("n", "n above 1 cannot be combined with stream: true.")
    return GenerationRequest(
        endpoint=endpoint,
        model_id=req.model,
        prompts=prompts,
        n=n,
        stream=stream,
        include_usage=bool(options and options.include_usage),
        continuous_usage=bool(options and options.include_usage and options.continuous_usage_stats),
        max_tokens=max_tokens,
        temperature=None if req.temperature is None else float(req.temperature),
        top_p=None if req.top_p is None else float(req.top_p),
        frequency_penalty=_or(req.frequency_penalty, 0.0),
        presence_penalty=_or(req.presence_penalty, 0.0),
        stops=_stops(req.stop),
        seed=req.seed,
        steering=steering_ask(req),
        scoring=scoring,
        output=output_format(_sent(req.response_format)),
        precision=req.scoring_precision,
        as_token_ids=req.return_tokens_as_token_ids is True,
        logprobs=None if scoring is not None else logprobs_asked(endpoint, req),
        echo=isinstance(req, v1.CompletionRequest) and req.echo is True,
        logit_bias=_logit_bias(req.logit_bias),
        ignore_eos=req.ignore_eos is True,
        activations=_activations(req),
        sent=frozenset(f for f in req.model_fields_set if getattr(req, f, None) is not None),
        **chat,
    )


def _logit_bias(raw: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """`logit_bias` as (id, bias) pairs: keys are token ids written as decimal strings,
    biases within -100..100 (each refusal names `logit_bias.<key>`)."""
    pairs = []
    for key, value in (raw or {}).items():
        param = f"logit_bias.{key}"
        if not (key.isascii() and key.isdigit()):
            raise InvalidParameter(param, f"logit_bias keys are token ids; {key!r} is not one.")
        if not -100 <= value <= 100:
            raise InvalidParameter(param, f"A logit bias lies within -100..100 (got {value}).")
        pairs.append((int(key), float(value)))
    return tuple(pairs)


def _activations(req: Request) -> ActivationsAsk | None:
    sent = _sent(req.return_sae_activations)
    return None if sent is None else ActivationsAsk.of(sent)


def _sent(value: Any) -> Any:
    """A typed field as the JSON it was sent as (unset members left out, as the client did)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if isinstance(value, list):
        return [_sent(item) for item in value]
    return value


def _or(value: float | None, default: float) -> float:
    return float(default if value is None else value)


def _message(message: v1.ChatMessage, where: str) -> dict[str, Any]:
    """The parts of a message the template sees (the rest is reported by the policy).

    Content is a string or text parts (LOC-CHAT-05); any other part (an
    image, audio, a file) is refused naming it, never dropped (LOC-CHAT-08).
    A history call's `arguments` reaches the template as an object: the JSON
    string OpenAI clients send is parsed (templates write it with `tojson`);
    a string that is not a JSON object is left as it is (OAI-TOOLS-18).
    """
    content = value_of(message.content)
    if isinstance(content, list):
        content = "".join(
            _part_text(part, f"{where}.content[{j}]") for j, part in enumerate(content)
        )
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        out["tool_calls"] = [_history_call(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning_content is not None:  # LOC-CHAT-10
        out["reasoning_content"] = message.reasoning_content
    return out


def _part_text(part: v1.ContentPart, where: str) -> str:
    if part.type != "text":
        raise InvalidParameter(
            f"{where}.type",
            f"Content parts of type `{part.type}` are not supported: this server reads text "
            'parts (`{"type": "text", "text": ...}`) only, and refuses any other rather '
            "than drop it.",
        )
    return part.text or ""


def _history_call(call: v1.ToolCallHistory) -> dict[str, Any]:
    arguments: Any = call.function.arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        arguments = parsed if isinstance(parsed, dict) else arguments
    function = {"name": call.function.name, "arguments": arguments or {}}
    return {"id": call.id, "type": "function", "function": function}


def chat_request(req: v1.ChatCompletionRequest) -> GenerationRequest:
    """A chat completion request: `messages`, then each `extra_messages` row, one prompt each."""
    kwargs = dict(req.chat_template_kwargs or {})
    rows = [req.messages, *(req.extra_messages or ())]
    names = ["messages", *(f"extra_messages[{k}]" for k in range(len(rows) - 1))]
    prompts = tuple(
        ChatPrompt(tuple(_message(m, f"{name}[{i}]") for i, m in enumerate(value_of(row))), kwargs)
        for name, row in zip(names, rows, strict=True)
    )
    if len(prompts) > 1 and req.stream:
        raise InvalidParameter(
            "extra_messages", "extra_messages (batched chat) cannot be combined with stream: true."
        )
    think = ThinkAsk(
        req.think, (req.chat_template_kwargs or {}).get("enable_thinking"), req.reasoning_effort
    )
    tools = tool_ask(_sent(req.tools), _sent(req.tool_choice), req.parallel_tool_calls)
    return _common("chat", req, prompts, tools=tools, think=think, top_logprobs=req.top_logprobs)


def completion_request(req: v1.CompletionRequest) -> GenerationRequest:
    """A text completion request: one prompt per string or token-id list (OAI-CMPL-02)."""
    found, single = entries(req.prompt, "prompt")
    add = True if req.add_special_tokens is None else req.add_special_tokens
    prompts = tuple(
        TextPrompt(entry, add)
        if isinstance(entry, str)
        else TokenPrompt(entry, "prompt" if single else f"prompt[{i}]")
        for i, entry in enumerate(found)
    )
    return _common("completions", req, prompts)


def with_thinking(req: GenerationRequest, enabled: bool) -> GenerationRequest:
    """`req` whose chat prompts render with `enable_thinking` set to `enabled`."""
    prompts = tuple(
        replace(p, template_kwargs={**p.template_kwargs, THINKING_KEY: enabled})
        if isinstance(p, ChatPrompt)
        else p
        for p in req.prompts
    )
    return replace(req, prompts=prompts)
