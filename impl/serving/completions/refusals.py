"""A completion request's cross-field refusals, and the headers that echo what it asked.

They run after the field matrix's (so an engine refuses a field itself first)
and before any load: nothing here needs the model.
"""

from __future__ import annotations

from ... import headers as hdr
from ...errors import FieldNotHonoured, InvalidParameter
from ..admission import Admission
from ..chat.response_format import check_combination
from ..chat.thinking import settle
from .defaults import RequestDefaults
from .requests import GenerationRequest
from .scoring import check_mode, check_top_logprobs, unused_fields


def refusals(
    req: GenerationRequest, admission: Admission, defaults: RequestDefaults
) -> tuple[list[str], bool | None]:
    """Refuse what no model could serve; the fields found unused, and whether a chat
    renders thinking (None: the template is not asked)."""
    check_top_logprobs(req.top_logprobs, req.logprobs is not None or _scores_logprobs(req))
    if req.output is not None:
        check_combination(
            req.output,
            stops=bool(req.stops),
            scoring=req.scoring is not None,
            tools=req.tools is not None,
        )
    if req.tools is not None and req.scoring is not None:
        raise FieldNotHonoured("tools", "on scoring requests (nothing is generated)")
    if req.scoring is None and req.precision == "float32":
        raise InvalidParameter(
            "scoring_precision",
            'scoring_precision "float32" applies to scoring requests only '
            "(logprobs or allowed_token_ids, max_tokens: 1).",
        )
    if req.scoring is not None:
        check_mode(
            req.sent,
            max_tokens=req.max_tokens,
            n=req.n,
            stream=req.stream,
            temperature=req.scoring_temperature,
        )
        return unused_fields(req.sent), None
    # `return_tokens_as_token_ids` keys reported tokens: unused when none are
    unused = ["return_tokens_as_token_ids"] if req.as_token_ids and req.logprobs is None else []
    if req.endpoint != "chat" or not admission.honours("think"):
        return unused, None
    forced = req.tools is not None and req.tools.forced
    thinking, overridden = settle(  # LOC-CHAT-29
        req.think,
        defaults.think,
        constrained=req.output is not None or forced,
        kwargs_honoured=admission.honours("chat_template_kwargs"),
    )
    return [*unused, *overridden], thinking


def _scores_logprobs(req: GenerationRequest) -> bool:
    return req.scoring is not None and req.scoring.logprobs


def echoes(req: GenerationRequest) -> dict[str, str]:
    """The headers that echo the request: its seed (the config's too, once the defaults
    apply; accepted and changing nothing on scoring, OAI-SEED-10) and its constraint."""
    out = {}
    if req.seed is not None:
        out[hdr.SEED] = hdr.seed(req.seed, _seed_scope(req))
    if req.output is not None:
        out[hdr.CONSTRAINED] = req.output.header()
    return out


def _seed_scope(req: GenerationRequest) -> str:
    """`X-miLLM-Seed`'s scope: `batch-shape` for `extra_messages` rows (OAI-SEED-06)."""
    return "batch-shape" if req.endpoint == "chat" and len(req.prompts) > 1 else "request"
