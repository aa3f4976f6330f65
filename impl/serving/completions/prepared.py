"""A request made concrete against one engine: prompt ids, budgets, tools, reasoning, grammar.

`prepare()` runs once an engine is at hand, before any generation and before
a stream's 200: it fixes the tool plan (refusing a template that cannot take
tools), renders and tokenizes every prompt, fixes each budget against the
window, reads the probes' `last_user` windows, and compiles the output
grammar. What it makes, a `Prepared`, is frozen: nothing writes into it
later, and another engine (a reload while the request waited) gets a
`Prepared` of its own. `job()` makes one choice's generation of it;
`Prepared.choice()` shapes one finished choice (validated when constrained,
calls parsed when tools ran).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from ...engines.base import (
    Capability,
    ChatPrompt,
    Constraint,
    ConstraintUnsupported,
    Engine,
    Hooks,
    ModelFacts,
    PromptError,
    Rng,
    SamplingParams,
)
from ...engines.capabilities import Constrainer, Inspectable
from ...engines.logprobs import BAN
from ...errors import ApiError, InvalidParameter
from ...models.manager import ModelManager
from ..chat import schema_subset
from ..chat.reasoning import ReasoningPlan, reasoning_plan
from ..chat.replies import ReplyStream, whole
from ..chat.response_format import OutputFormat
from ..chat.tools import ToolPlan, shown, tool_plan
from ..chat.truncation import without_oldest_turn
from ..prompts import Prompt, TextPrompt, TokenPrompt
from ..scheduler import Ticket
from ..telemetry import Meter
from . import shapes
from .defaults import RequestDefaults
from .generation import ChoiceEnd, ChoiceJob, Collected
from .logprobs import Shaper, joined
from .requests import GenerationRequest, with_thinking

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A request made concrete against `engine` (`prepare()`); frozen."""

    request: GenerationRequest
    engine: Engine
    prompt_ids: tuple[list[int], ...]
    budgets: tuple[int, ...]
    # How the chat template marks tool calls and reasoning spans. `tools` is None when the
    # request shows the model no tools; `reasoning` is None when no reasoning span is read
    # off the reply (`_may_reason`).
    tools: ToolPlan | None
    reasoning: ReasoningPlan | None
    # Each prompt's `last_user` window, read only when an armed probe needs one (else ()).
    user_spans: tuple[tuple[int, int] | None, ...] = ()

    @property
    def output(self) -> OutputFormat | None:
        return self.request.output

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.prompt_ids)

    @property
    def constraint(self) -> Constraint | None:
        """The grammar every choice is generated under: the output format's, or the tools'
        (a forced call's continuation, a generic document; never both: OAI-SO-26)."""
        if self.output is not None:
            return self.output.constraint
        return None if self.tools is None else self.tools.constraint

    def choice(
        self, index: int, read: Collected, finish_reason: str, stop: str | None = None
    ) -> dict[str, Any]:
        """One finished choice: validated when constrained, its reasoning split off and its
        calls parsed, its reported tokens shaped (choices run prompt by prompt, `n` each);
        with echo, the prompt's text first; `stop`, the stop sequence that ended it."""
        endpoint, text = self.request.endpoint, read.text
        if self.output is not None:
            finish_reason = self.output.finish(text, finish_reason)
        spans = self.reasoning
        answer = whole(
            text, None if spans is None else spans.split(index // self.request.n, text), self.tools
        )
        if answer.calls:
            finish_reason = "tool_calls"
        content = answer.content if read.echo is None else read.echo + (answer.content or "")
        logprobs = None
        if self.request.logprobs is not None:
            shaper = self.shaper(index // self.request.n)
            if read.echo is not None:
                logprobs = shaper.echoed(read.prompt, read.echo)
            logprobs = joined(logprobs, shaper.shaped(read.tokens))
        out = shapes.choice(
            endpoint, index, content, finish_reason, calls=answer.calls, logprobs=logprobs
        )
        if spans is not None:  # LOC-CHAT-68
            out["message"]["reasoning_content"] = answer.reasoning
        return shapes.with_stop(out, stop)

    def shaper(self, i: int) -> Shaper:
        """Prompt i's reported tokens' shapes (logprobs.py); a completion's offsets start at
        the prompt text's length."""
        r = self.request
        start = len(prompt_text(self.engine, r.prompts[i]))
        return Shaper(r.endpoint, r.as_token_ids, self.engine.token_text, start)

    def echo(self, i: int) -> str | None:
        """Prompt i's text as echo sends it first; None without echo."""
        return prompt_text(self.engine, self.request.prompts[i]) if self.request.echo else None

    def reply_stream(self, i: int) -> ReplyStream:
        """Prompt i's streamed reply: reasoning split off, calls held (LOC-CHAT-57)."""
        spans = None if self.reasoning is None else self.reasoning.stream(i)
        return ReplyStream(spans, self.tools)

    def fits(self, window: int) -> bool:
        """Whether every prompt and its budget fit a row of `window` tokens."""
        sizes = zip(self.prompt_ids, self.budgets, strict=True)
        return all(len(ids) + budget <= window for ids, budget in sizes)


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


def as_rendered(
    req: GenerationRequest, unused: Sequence[str], thinking: bool | None
) -> GenerationRequest:
    """`req` as its prompts are rendered: the fields reported unused left out
    (`without_unused`), and the thinking `refusals` settled passed to the template (None:
    the template is not asked)."""
    used = without_unused(req, unused)
    return used if thinking is None else with_thinking(used, thinking)


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

    def usage(self, prepared: Prepared) -> dict[str, Any]:
        return shapes.usage(prepared.prompt_tokens, self.completion, self.cached)

    def so_far(self, prepared: Prepared, generated: int, cached: int) -> dict[str, Any]:
        """The usage while a choice is `generated` tokens in (its prompt found `cached`)."""
        return shapes.usage(
            prepared.prompt_tokens, self.completion + generated, self.cached + cached
        )


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


def prompt_text(engine: Engine, prompt: Prompt) -> str:
    """A prompt's text as echo writes it, and where a completion's `text_offset` starts: a
    text prompt as sent, the text a token prompt's ids stand for; "" for a chat."""
    if isinstance(prompt, TextPrompt):
        return prompt.text
    if isinstance(prompt, TokenPrompt):
        return engine.decode(prompt.ids, keep_special=True)
    return ""


INLINE_CHARS = 4096  # text this short renders and tokenizes in a fraction of a millisecond
INLINE_MESSAGES = 16


def is_short(prompt: Prompt, tools: ToolPlan | None) -> bool:
    """Whether rendering and tokenizing `prompt` is quick enough to run on the event loop
    (ModelManager.with_tokenizer): short text, a few messages, no tools to render."""
    if isinstance(prompt, TokenPrompt):
        return len(prompt.ids) <= INLINE_CHARS
    if not isinstance(prompt, ChatPrompt):
        return len(prompt.text) <= INLINE_CHARS
    if tools is not None or prompt.tools or len(prompt.messages) > INLINE_MESSAGES:
        return False
    size = sum(len(str(m.get("content") or "")) for m in prompt.messages)
    return size <= INLINE_CHARS


async def prepare(
    req: GenerationRequest,
    engine: Engine,
    manager: ModelManager,
    defaults: RequestDefaults,
    *,
    user_spans: bool = False,
) -> Prepared:
    """Tokenize every prompt and fix its budget; refusals before any generation.
    `user_spans`: read each prompt's `last_user` window too (an armed probe needs it)."""
    tools = tool_plan(req.tools, engine.chat_template, req.prompts[0] if req.prompts else None)
    check_bias(req.logit_bias, engine.facts.vocab_size)
    ids_of, budgets, prompts = [], [], []
    for i, prompt in enumerate(req.prompts):
        served, ids, size = await _fitted(req, engine, manager, defaults, i, prompt, tools)
        prompts.append(served)
        ids_of.append(ids)
        budgets.append(size)
    if req.truncate:  # what was served, for the choices' shapes and the probes' windows
        req = replace(req, prompts=tuple(prompts))
    reasoning = None
    if _may_reason(req, tools):
        short = sum(map(len, ids_of)) <= INLINE_CHARS
        reasoning = await manager.with_tokenizer(
            partial(reasoning_plan, engine, ids_of), inline=short
        )
    if req.output is not None:
        await _compile(req.output, engine, manager)
    tools = await _tools_compiled(tools, engine, manager)
    spans: list[tuple[int, int] | None] = []
    if user_spans:
        for i, prompt in enumerate(req.prompts):
            span = partial(user_span, engine, prompt, ids_of[i], tools)
            spans.append(await manager.with_tokenizer(span, inline=is_short(prompt, tools)))
    return Prepared(
        request=req,
        engine=engine,
        prompt_ids=tuple(ids_of),
        budgets=tuple(budgets),
        tools=tools,
        reasoning=reasoning,
        user_spans=tuple(spans),
    )


async def _tools_compiled(
    tools: ToolPlan | None, engine: Engine, manager: ModelManager
) -> ToolPlan | None:
    """The tool plan whose call constraint the grammar library takes, loosened until it does
    (any object as arguments, then none)."""
    while tools is not None and tools.constraint is not None:
        try:
            await manager.with_tokenizer(partial(_compiled, engine, tools.constraint))
            return tools
        except ConstraintUnsupported as exc:
            log.warning("the tool call constraint is loosened: %s", exc)
            tools = tools.loosened()
    return tools


def _compiled(engine: Engine, constraint: Constraint) -> None:
    """Compile `constraint` on `engine`; one that enforces no grammar refuses it."""
    if not isinstance(engine, Constrainer):
        raise ConstraintUnsupported(f"the {engine.facts.engine} engine enforces no grammar")
    engine.compile_constraint(constraint)


def user_span(
    engine: Engine, prompt: Prompt, ids: Sequence[int], tools: ToolPlan | None
) -> tuple[int, int] | None:
    """A prompt's `last_user` window: the last user message's content in the render served
    (its tools shown, OAI-TOOLS-31); a text completion's whole prompt; None on an engine
    that reads no residual stream (its probes report `engine_unsupported`)."""
    if not isinstance(prompt, ChatPrompt):
        return (0, len(ids))
    if not isinstance(engine, Inspectable):
        return None
    honoured = Capability.TOOLS in engine.capabilities
    return engine.user_span(shown(tools, prompt, engine.chat_template, honoured))


async def _fitted(
    req: GenerationRequest,
    engine: Engine,
    manager: ModelManager,
    defaults: RequestDefaults,
    i: int,
    prompt: Prompt,
    tools: ToolPlan | None,
) -> tuple[Prompt, list[int], int]:
    """Prompt i as served, its ids and its budget; with `truncate`, its oldest turns dropped
    until it fits the window."""
    while True:
        ids = await manager.with_tokenizer(
            partial(prompt_ids, engine, prompt, i, tools), inline=is_short(prompt, tools)
        )
        if not ids:
            where = "prompt" if req.endpoint == "completions" else "messages"
            code = "invalid_parameter" if req.scoring is None else "invalid_scoring_request"
            raise ApiError(code, f"prompt {i} tokenizes to nothing; nothing to continue.", where)
        try:
            return prompt, ids, budget(req, engine, ids, defaults)
        except ApiError as exc:
            shorter = _shortened(req, prompt, exc)
            if shorter is None:
                raise
            prompt = shorter


def _shortened(req: GenerationRequest, prompt: Prompt, exc: ApiError) -> ChatPrompt | None:
    """`prompt` less its oldest turn when `req.truncate` asks for it and `exc` says the
    prompt does not fit the window (chat/truncation.py); else None."""
    if not req.truncate or exc.code != "context_length_exceeded":
        return None
    return without_oldest_turn(prompt) if isinstance(prompt, ChatPrompt) else None


def _may_reason(req: GenerationRequest, tools: ToolPlan | None) -> bool:
    """Whether a reasoning span is read off the reply: a generated chat reply that neither a
    grammar nor a forced call's opening holds from its first token (LOC-CHAT-40)."""
    constrained = req.output is not None or (tools is not None and tools.constraint is not None)
    forced = tools is not None and bool(tools.opening)
    return req.endpoint == "chat" and req.scoring is None and not constrained and not forced


async def _compile(output: OutputFormat, engine: Engine, manager: ModelManager) -> None:
    """The grammar is built before any generation; one the library refuses is the client's."""
    try:
        await manager.with_tokenizer(partial(_compiled, engine, output.constraint))
    except ConstraintUnsupported as exc:
        param = "response_format" if output.kind == "json_object" else schema_subset.PARAM
        raise ApiError(
            "response_format_unsupported",
            f"The schema cannot be enforced by the constraint library: {exc}.",
            param,
        ) from exc


def bias(req: GenerationRequest, facts: ModelFacts) -> tuple[tuple[int, float], ...]:
    """The request's `logit_bias`; with `ignore_eos`, every end-of-generation id banned over
    it (a bias of -100), so the choice ends only at its budget, a stop string or the
    window, as vLLM's and llama.cpp's servers do."""
    if not req.ignore_eos:
        return req.logit_bias
    ends = set(facts.eog_ids)
    kept = tuple(pair for pair in req.logit_bias if pair[0] not in ends)
    return kept + tuple((i, BAN) for i in facts.eog_ids)


def check_bias(bias: Sequence[tuple[int, float]], vocab_size: int) -> None:
    """A biased id outside the vocabulary is refused, naming `logit_bias.<id>`."""
    for token_id, _ in bias:
        if token_id >= vocab_size:
            raise InvalidParameter(
                f"logit_bias.{token_id}",
                f"Token id {token_id} is outside the model's vocabulary (0..{vocab_size - 1}).",
            )


def budget(
    req: GenerationRequest, engine: Engine, ids: Sequence[int], defaults: RequestDefaults
) -> int:
    """`max_tokens` clamped to n-predict's maximum, or (absent or 0) n-predict cut to what
    the window leaves (LOC-CHAT-21); refused past the window. With echo, 0 is 0: the
    prompt is scored and nothing generated (as OpenAI's legacy completions and vLLM)."""
    limit = engine.facts.context_length
    left = limit - len(ids)
    if req.echo and req.max_tokens == 0:  # the prompt scored, nothing generated (echo)
        return 0
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


def job(
    prepared: Prepared,
    i: int,
    rng: Rng | None,
    ticket: Ticket,
    *,
    hooks: Hooks,
    meter: Meter | None,
) -> ChoiceJob:
    """Prompt i's generation: its ids, budget, sampling, constraint and hooks; the ticket's
    halt (a model switch) and cancel (`POST /api/cancel`) stop it."""
    r = prepared.request
    temperature, top_p, top_k = r.temperature, r.top_p, r.top_k
    assert temperature is not None and top_p is not None and top_k is not None, (
        "RequestDefaults.apply comes first"
    )
    params = SamplingParams(
        max_tokens=prepared.budgets[i],
        temperature=temperature,
        top_p=top_p,
        frequency_penalty=r.frequency_penalty,
        presence_penalty=r.presence_penalty,
        constraint=prepared.constraint,
        top_k=top_k,
        logit_bias=bias(r, prepared.engine.facts),
        logprobs=r.logprobs,
        prompt_logprobs=r.logprobs if r.echo else None,
        thinking=None
        if prepared.reasoning is None
        else prepared.reasoning.budget(i, r.thinking_budget),
    )
    return ChoiceJob(
        prompt_ids=prepared.prompt_ids[i],
        params=params,
        stop_strings=r.stops,
        rng=rng,
        halted=ticket.halt,
        background=ticket.background,
        hooks=hooks,
        # call and reasoning markers may be special tokens
        keep_special=prepared.tools is not None or prepared.reasoning is not None,
        cancelled=ticket.cancel,
        meter=meter,
        whole=not r.stream,  # a JSON reply is read whole: no wake-up of the loop per token
        echo=prepared.echo(i),
    )
