"""A request made concrete against the resident model: prompts, budgets, grammar, tools.

`prepare()` runs once the slot is held and the model resident, before any
generation and before a stream's 200: it fixes the tool plan (refusing a
template that cannot take tools), renders and tokenizes every prompt, fixes
each budget against the window, and compiles the output grammar. `job()`
makes one choice's generation of it; `Plan.choice()` shapes one finished
choice (validated when constrained, calls parsed when tools ran).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ...engines.base import (
    Capability,
    ChatPrompt,
    Constraint,
    ConstraintUnsupported,
    Engine,
    PromptError,
    Rng,
    SamplingParams,
)
from ...errors import ApiError, InvalidParameter
from ...models.manager import ModelManager
from ...models.registry import ModelEntry
from ...probes.watch import Watch
from ...steering.header import Unknown, serialize
from ...steering.source import RequestSource
from ..chat import schema_subset
from ..chat.reasoning import ReasoningPlan, reasoning_plan
from ..chat.replies import ReplyStream, whole
from ..chat.response_format import OutputFormat
from ..chat.tools import ToolAsk, ToolPlan, shown, tool_plan
from ..prompts import Prompt, TokenPrompt
from ..scheduler import Ticket
from ..telemetry import Meter
from . import shapes
from .activations import Reading
from .defaults import RequestDefaults
from .generation import ChoiceEnd, ChoiceJob
from .requests import GenerationRequest

log = logging.getLogger(__name__)


@dataclass(slots=True, kw_only=True)
class Plan:
    """A request made concrete against the model: token ids and budgets."""

    request: GenerationRequest
    entry: ModelEntry
    prompt_ids: list[list[int]] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)
    steering: RequestSource | None = None
    # How the chat template marks tool calls and reasoning spans, both fixed by `prepare()`
    # once the model is resident. `tools` is None when the request shows the model no tools;
    # `reasoning` is None when no reasoning span is read off the reply (`_may_reason`).
    tools: ToolPlan | None = None
    reasoning: ReasoningPlan | None = None
    # The config's request defaults, read once when the request came in: a request that
    # waits in the queue keeps the defaults it saw.
    defaults: RequestDefaults = field(default_factory=RequestDefaults)
    prepared_for: Engine | None = None  # the engine `prepare` read the prompts with
    reading: Reading | None = None  # `return_sae_activations`, resolved (OAI-ACT)
    watch: Watch | None = None  # the armed probes, while any is (REQ-000 PROBE)
    user_spans: list[tuple[int, int] | None] = field(default_factory=list)  # `last_user`

    @property
    def output(self) -> OutputFormat | None:
        return self.request.output

    @property
    def tool_ask(self) -> ToolAsk | None:
        return self.request.tools

    def steering_header(self) -> str:
        """X-miLLM-Steering, read after generation from what the hooks applied (OAI-HDR-02).

        A state that cannot be read is `unknown`, never omitted or guessed (OAI-GRAM-07).
        """
        if self.steering is None:
            return "none"
        try:
            return self.steering.header()
        except Exception:
            log.exception("reading the applied steering state failed")
            return serialize([Unknown("read_failed")])

    def rung_header(self) -> str | None:
        """X-miLLM-Circuit-Rung for what the hooks applied (None: omitted, OAI-RUNG-09..17)."""
        if self.steering is None:
            return None
        try:
            return self.steering.rung()
        except Exception:  # an unreadable state claims no evidence (OAI-RUNG-11)
            log.exception("reading the applied circuits failed")
            return None

    @property
    def constraint(self) -> Constraint | None:
        """The grammar every choice is generated under: the output format's, or the tools'
        (a forced call's continuation, a generic document; never both: OAI-SO-26)."""
        if self.output is not None:
            return self.output.constraint
        return None if self.tools is None else self.tools.constraint

    def choice(self, index: int, text: str, finish_reason: str) -> dict[str, Any]:
        """One finished choice: validated when constrained, its reasoning split off and its
        calls parsed (choices run prompt by prompt, `n` each)."""
        endpoint = self.request.endpoint
        if self.output is not None:
            finish_reason = self.output.finish(text, finish_reason)
        spans = self.reasoning
        answer = whole(
            text, None if spans is None else spans.split(index // self.request.n, text), self.tools
        )
        if answer.calls:
            finish_reason = "tool_calls"
        out = shapes.choice(endpoint, index, answer.content, finish_reason, calls=answer.calls)
        if spans is not None:  # LOC-CHAT-68
            out["message"]["reasoning_content"] = answer.reasoning
        return out

    def reply_stream(self, i: int) -> ReplyStream:
        """Prompt i's streamed reply: reasoning split off, calls held (LOC-CHAT-57)."""
        spans = None if self.reasoning is None else self.reasoning.stream(i)
        return ReplyStream(spans, self.tools)


def without_unused(req: GenerationRequest, ignored: Sequence[str]) -> GenerationRequest:
    """The request less what the policy reported as unused: a reported field has no effect.

    Message fields are reported as `messages[i].name` (row 0) or
    `extra_messages[k][i].name` (row k + 1); the template never sees them (OAI-TOOLS-33).
    """
    unused = set(ignored)
    prompts = tuple(
        _without(p, row, unused) if isinstance(p, ChatPrompt) else p
        for row, p in enumerate(req.prompts)
    )
    return replace(req, prompts=prompts)


def _without(prompt: ChatPrompt, row: int, unused: set[str]) -> ChatPrompt:
    where = "messages" if row == 0 else f"extra_messages[{row - 1}]"
    messages = tuple(
        {k: v for k, v in m.items() if f"{where}[{i}].{k}" not in unused}
        for i, m in enumerate(prompt.messages)
    )
    kwargs = {} if "chat_template_kwargs" in unused else prompt.template_kwargs
    return replace(prompt, messages=messages, template_kwargs=kwargs)


@dataclass(slots=True)
class Tally:
    """Token counts over a request's choices, for `usage`."""

    completion: int = 0
    cached: int = 0

    def add(self, end: ChoiceEnd, *, first_of_prompt: bool) -> None:
        self.completion += end.completion_tokens
        if first_of_prompt:  # the prompt is counted once, as prompt_tokens is
            self.cached += end.cached_tokens

    def usage(self, plan: Plan) -> dict[str, Any]:
        prompt = sum(len(ids) for ids in plan.prompt_ids)
        return shapes.usage(prompt, self.completion, self.cached)


def prompt_ids(
    engine: Engine, prompt: Prompt, row: int = 0, tools: ToolPlan | None = None
) -> list[int]:
    """The ids of one prompt, its tools shown; a refusal names the row's messages."""
    if isinstance(prompt, TokenPrompt):  # sent as ids: checked, never tokenized
        return prompt.checked(engine.facts.vocab_size)
    if not isinstance(prompt, ChatPrompt):
        return engine.tokenize(prompt.text, add_special_tokens=prompt.add_special_tokens)
    try:
        honoured = Capability.TOOLS in engine.capabilities
        return engine.render_chat(shown(tools, prompt, engine.chat_template, honoured))
    except PromptError as exc:
        # Row 0 is `messages`; row k the (k-1)th `extra_messages` conversation (CSCORE-21).
        param = (
            exc.param
            if row == 0
            else exc.param.replace("messages", f"extra_messages[{row - 1}]", 1)
        )
        raise InvalidParameter(param, f"The messages cannot be rendered: {exc}") from exc


INLINE_CHARS = 4096  # text this short renders and tokenizes in a fraction of a millisecond
INLINE_MESSAGES = 16


def is_short(prompt: Prompt, tools: ToolPlan | None) -> bool:
    """Whether rendering and tokenizing `prompt` is quick enough to run on the event loop
    (ModelManager.tokenize): short text, a few messages, no tools to render."""
    if isinstance(prompt, TokenPrompt):
        return len(prompt.ids) <= INLINE_CHARS
    if not isinstance(prompt, ChatPrompt):
        return len(prompt.text) <= INLINE_CHARS
    if tools is not None or prompt.tools or len(prompt.messages) > INLINE_MESSAGES:
        return False
    size = sum(len(str(m.get("content") or "")) for m in prompt.messages)
    return size <= INLINE_CHARS


async def prepare(plan: Plan, engine: Engine, manager: ModelManager) -> None:
    """Tokenize every prompt and fix its budget; refusals before any generation. Prepared
    again for another engine (a reload), it starts over."""
    plan.prompt_ids, plan.budgets, plan.reasoning = [], [], None
    plan.prepared_for = engine
    plan.tools = tool_plan(plan.tool_ask, engine.chat_template)
    for i, prompt in enumerate(plan.request.prompts):
        ids = await manager.tokenize(
            partial(prompt_ids, engine, prompt, i, plan.tools), inline=is_short(prompt, plan.tools)
        )
        if not ids:
            where = "prompt" if plan.request.endpoint == "completions" else "messages"
            code = (
                "invalid_parameter" if plan.request.scoring is None else ("invalid_scoring_request")
            )
            raise ApiError(code, f"prompt {i} tokenizes to nothing; nothing to continue.", where)
        plan.prompt_ids.append(ids)
        plan.budgets.append(budget(plan.request, engine, ids, plan.defaults))
    if _may_reason(plan):
        short = sum(map(len, plan.prompt_ids)) <= INLINE_CHARS
        plan.reasoning = await manager.tokenize(
            partial(reasoning_plan, engine, plan.prompt_ids), inline=short
        )
    if plan.output is not None:
        await _compile(plan.output, engine, manager)
    while plan.tools is not None and plan.tools.constraint is not None:
        try:
            await manager.tokenize(partial(engine.compile_constraint, plan.tools.constraint))
            break
        except ConstraintUnsupported as exc:  # looser: any object as arguments, then none
            log.warning("the tool call constraint is loosened: %s", exc)
            plan.tools = plan.tools.loosened()


def user_span(plan: Plan, engine: Engine, i: int) -> tuple[int, int] | None:
    """Prompt i's `last_user` window: the last user message's content in the render served
    (its tools shown, OAI-TOOLS-31); a text completion's whole prompt."""
    prompt = plan.request.prompts[i]
    if not isinstance(prompt, ChatPrompt):
        return (0, len(plan.prompt_ids[i]))
    honoured = Capability.TOOLS in engine.capabilities
    return engine.user_span(shown(plan.tools, prompt, engine.chat_template, honoured))


def _may_reason(plan: Plan) -> bool:
    """Whether a reasoning span is read off the reply: a generated chat reply that neither a
    grammar nor a forced call's opening holds from its first token (LOC-CHAT-40)."""
    r = plan.request
    forced = plan.tools is not None and bool(plan.tools.opening)
    return r.endpoint == "chat" and r.scoring is None and plan.constraint is None and not forced


async def _compile(output: OutputFormat, engine: Engine, manager: ModelManager) -> None:
    """The grammar is built before any generation; one the library refuses is the client's."""
    try:
        await manager.tokenize(partial(engine.compile_constraint, output.constraint))
    except ConstraintUnsupported as exc:
        param = "response_format" if output.kind == "json_object" else schema_subset.PARAM
        raise ApiError(
            "response_format_unsupported",
            f"The schema cannot be enforced by the constraint library: {exc}.",
            param,
        ) from exc


def budget(
    req: GenerationRequest, engine: Engine, ids: Sequence[int], defaults: RequestDefaults
) -> int:
    """`max_tokens` clamped to n-predict's maximum, or (absent or 0) n-predict cut to what
    the window leaves (LOC-CHAT-21); refused past the window."""
    limit = engine.facts.context_length
    left = limit - len(ids)
    asked = defaults.ceiling(req.max_tokens)
    asked = asked if asked is not None else min(defaults.max_tokens, left)
    if left < 1 or asked > left:
        asked = max(asked, 1)
        param = ("messages" if req.endpoint == "chat" else "prompt") if left < 1 else "max_tokens"
        raise ApiError(
            "context_length_exceeded",
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{len(ids) + asked} tokens ({len(ids)} in the prompt, "
            f"{asked} for the completion). "
            "Please reduce the prompt or max_tokens.",
            param,
        )
    return asked


def job(plan: Plan, i: int, rng: Rng | None, ticket: Ticket, *, meter: Meter | None) -> ChoiceJob:
    """Prompt i's generation: its ids, budget, sampling, constraint and steering; the
    ticket's halt (a model switch) and cancel (`POST /api/cancel`) stop it."""
    r = plan.request
    temperature, top_p = r.temperature, r.top_p
    assert temperature is not None and top_p is not None, "RequestDefaults.apply comes first"
    params = SamplingParams(
        max_tokens=plan.budgets[i],
        temperature=temperature,
        top_p=top_p,
        frequency_penalty=r.frequency_penalty,
        presence_penalty=r.presence_penalty,
        constraint=plan.constraint,
        top_k=r.top_k,
    )
    return ChoiceJob(
        prompt_ids=plan.prompt_ids[i],
        params=params,
        stop_strings=r.stops,
        rng=rng,
        halted=ticket.halt,
        steering=plan.steering,
        # call and reasoning markers may be special tokens
        keep_special=plan.tools is not None or plan.reasoning is not None,
        cancelled=ticket.cancel,
        meter=meter,
        whole=not r.stream,  # a JSON reply is read whole: no wake-up of the loop per token
        capture=None if plan.reading is None else plan.reading.capture,
        monitor=None if plan.watch is None else plan.watch.monitor(),
    )
