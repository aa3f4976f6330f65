"""A Batch API input file read line by line, and the lines its output files hold (issue 50,
contract 0.31.0; REQ-000 open point 2)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from miserver.errors import ApiError, InvalidParameter
from miserver.serving.batches import lines
from miserver.serving.batches.lines import Answer

CHAT = "/v1/chat/completions"
BODY = {"model": "m:Q4_1", "messages": [{"role": "user", "content": "Hi"}]}


def line(**changes: Any) -> str:
    item = {"custom_id": "a", "method": "POST", "url": CHAT, "body": BODY} | changes
    return json.dumps({k: v for k, v in item.items() if v is not None})


def unknown(model: str) -> ApiError | None:
    return (
        ApiError("model_not_found", f"The model `{model}` does not exist.", "model")
        if (model != "m:Q4_1")
        else None
    )


def read(*raw: str) -> list[Any]:
    return lines.read("\n".join(raw).encode(), CHAT, unknown)


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        ("{not json", "invalid_json", None),
        ("[1, 2]", "invalid_request", None),
        (line(custom_id=None), "invalid_request", "custom_id"),
        (line(custom_id=""), "invalid_request", "custom_id"),
        (line(method="GET"), "invalid_request", "method"),
        (line(url="/v1/embeddings"), "invalid_request", "url"),
        (line(body=[1]), "invalid_request", "body"),
        (line(body=BODY | {"stream": True}), "invalid_request", "body.stream"),
        (line(extra=1), "invalid_request", "extra"),
    ],
)
def test_a_bad_line_becomes_an_error_line_and_the_batch_goes_on(
    raw: str, code: str, param: str | None
) -> None:
    """Issue 50 item 3: a line that is not OpenAI's request line is not run; its error line
    names the code, the field and the line number, and the next line is read as usual."""
    bad, good = read("", raw, line(custom_id="b"))
    assert bad.request is None and bad.failed and bad.line == 2
    error = json.loads(bad.result)
    assert error["response"] is None and error["id"].startswith("batch_req_")
    assert (error["error"]["code"], error["error"]["param"], error["error"]["line"]) == (
        code,
        param,
        2,
    )
    assert good.line == 3 and json.loads(good.request) == BODY and good.result is None


def test_a_custom_id_used_twice_is_refused_the_second_time() -> None:
    """Issue 50: `custom_id` names one line: the second line using one is an error line."""
    first, second = read(line(), line())
    assert first.request is not None
    assert json.loads(second.result)["error"]["code"] == "duplicate_custom_id"


def test_a_model_name_the_route_refuses_is_refused_at_validation() -> None:
    """OAI-GGUF-08: a line naming a model the server does not serve by that name gets the
    route's refusal when the batch is made: its status and error body, never run."""
    [refused] = read(line(body=BODY | {"model": "m"}))
    assert refused.request is None and refused.failed
    response = json.loads(refused.result)["response"]
    assert response["status_code"] == 404
    assert response["body"]["error"]["code"] == "model_not_found"


def test_files_that_make_no_batch_are_refused_naming_the_input_file() -> None:
    """Issue 50: a file that is not UTF-8, holds no line or more than OpenAI's 50,000 is
    refused whole, 400 naming `input_file_id`."""
    for content in (b"\xff\xfe", b"\n \n"):
        with pytest.raises(InvalidParameter) as caught:
            lines.read(content, CHAT, unknown)
        assert caught.value.param == "input_file_id"
    many = "\n".join(line(custom_id=str(i)) for i in range(lines.MAX_LINES + 1))
    with pytest.raises(InvalidParameter):
        lines.read(many.encode(), CHAT, unknown)


def test_an_answer_becomes_openais_output_line_with_its_millm_headers() -> None:
    """OAI-HDR-17, REQ-000 open point 2: the output line is OpenAI's, and
    `response.millm.headers` holds every X-miLLM-* header of the answer (not the others);
    its usage is counted, a refusal's is not."""
    body = {"id": "x", "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
    headers = {"x-millm-steering": "none", "x-request-id": "req_1", "content-type": "json"}
    ended = lines.answered("a", Answer(200, headers, json.dumps(body).encode()))
    out = json.loads(ended.result)
    assert not ended.failed and (ended.tokens.input, ended.tokens.output) == (7, 3)
    assert out["custom_id"] == "a" and out["error"] is None
    assert out["response"] == {
        "status_code": 200,
        "request_id": "req_1",
        "body": body,
        "millm": {"headers": {"x-millm-steering": "none"}},
    }
    refused = lines.answered("b", Answer(400, {}, b'{"error": {"code": "x"}}'))
    assert refused.failed and refused.tokens.input == 0
