"""The request target: path segments, layers and query strings.

Path segments with invalid percent-encoded UTF-8 (`%ED%A0%80`, `%FF`), NUL and
control characters, 8,000 characters; layers that are not integers or past
the range; hostile `?model=` values; hostile query strings on every GET route
(`GET /api/events` too, read to its first event). Each is sent byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .edits import Case, base, body_text, case
from .targets import SAE, TARGETS

# target: its path with `{}` where the string parameter goes
SEGMENT_ROUTES = {
    "model": "/v1/models/{}",
    "schema": "/api/schemas/{}",
    "profile": "/api/profiles/{}",
    "profile-put": "/api/profiles/{}",
    "profile-delete": "/api/profiles/{}",
    "detach": "/api/steering/attachments/{}/0",
    "features-put": "/api/steering/attachments/{}/0/features",
    "features-delete": "/api/steering/attachments/{}/0/features",
}
BAD_SEGMENTS = (  # refused on every route, PUT included
    ("lone-high-surrogate", "%ED%A0%80"),
    ("lone-low-surrogate", "%ED%B0%80"),
    ("cesu-pair", "%ED%A0%BD%ED%B8%80"),
    ("ff", "%FF"),
    ("overlong-slash", "%C0%AF"),
    ("cut-sequence", "%E2%82"),
    ("lone-continuation", "%80"),
    ("past-unicode", "%F4%90%80%80"),
    ("in-a-name", "ab%FEcd"),
    ("nul", "%00"),
    ("newline", "%0A"),
    ("crlf", "%0D%0A"),
    ("unit-separator", "%1F"),
    ("del", "%7F"),
)
ODD_SEGMENTS = (  # on GET and DELETE: names nothing has (404), never a 5xx
    ("long", "a" * 8000),
    ("emoji", "%F0%9F%98%80"),
    ("replacement-char", "%EF%BF%BD"),
    ("space", "%20"),
    ("plus", "a+b"),
    ("dot-dot", ".."),
    ("encoded-dot-dot", "%2E%2E"),
    ("encoded-slash", "a%2Fb"),
    ("traversal", "..%2F..%2Fsettings.json"),
    ("question-mark", "%3F"),
    ("hash", "%23"),
    ("escaped-surrogate-text", "%5Cud800"),
    ("percent-alone", "%"),
    ("percent-bad-hex", "%zz"),
    ("percent-u", "%u00e9"),
)
LAYERS = (
    ("negative", "-1"),
    ("fraction", "1.5"),
    ("exponent", "1e3"),
    ("hex", "0x10"),
    ("past-max", "65536"),
    ("past-int64", "9223372036854775808"),
    ("twenty-digits", "99999999999999999999"),
    ("nan", "NaN"),
    ("ff", "%FF"),
    ("lone-surrogate", "%ED%A0%80"),
    ("nul", "%00"),
    ("space-first", "%201"),
    ("plus", "+1"),
)
MODEL_QUERIES = (
    ("lone-surrogate", "?model=%ED%A0%80"),
    ("ff", "?model=%FF"),
    ("empty", "?model="),
    ("nul", "?model=%00"),
    ("long", "?model=" + "a" * 4000),
    ("twice", "?model=a&model=b"),
    ("brackets", "?model[]=x"),
    ("percent-alone", "?model=%"),
)
GET_QUERIES = (  # on every GET route: unknown parameters, ignored; never a 5xx
    ("lone-surrogate-name", "?%ED%A0%80=1"),
    ("lone-surrogate-value", "?a=%ED%A0%80"),
    ("ff-fe", "?a=%FF%FE"),
    ("nul", "?a=%00"),
    ("percent-alone", "?a=%"),
    ("percent-bad-hex", "?a=%zz"),
    ("many", "?" + "&".join(f"a{i}=1" for i in range(500))),
    ("brackets", "?a[b][c]=1"),
    ("empty-pair", "?="),
    ("ampersands", "?&&&"),
    ("long-value", "?a=" + "x" * 4000),
    ("model-and-stream", "?stream=%ED%A0%80&model=%00"),
)


def paths() -> Iterator[Case]:
    for name, pattern in SEGMENT_ROUTES.items():
        body = base(name) if TARGETS[name][2] is not None else None
        text = None if body is None else body_text(name)
        kind = None if TARGETS[name][0] == "GET" else "application/json"
        odd = ODD_SEGMENTS if TARGETS[name][0] != "PUT" else ()
        for label, segment in (*BAD_SEGMENTS, *odd):
            yield case(
                f"paths-{name}-{label}",
                "paths",
                [name],
                text,
                {"status": "4xx"},
                content_type=kind,
                path=pattern.format(segment),
            )
    yield case(
        "paths-model-dot-dot-escape",
        "paths",
        ["model"],
        None,
        {"status": "4xx"},
        content_type=None,
        path="/v1/models/a/../../api/info",
    )
    for name in ("detach", "features-put", "features-delete"):
        text = None if TARGETS[name][2] is None else body_text(name)
        suffix = TARGETS[name][1].removeprefix(SAE)
        for label, layer in LAYERS:
            yield case(
                f"paths-{name}-layer-{label}",
                "paths",
                [name],
                text,
                {"status": "4xx"},
                path=f"/api/steering/attachments/hostile-sae/{layer}{suffix}",
            )
        for label, query in MODEL_QUERIES:
            yield case(
                f"paths-{name}-query-{label}",
                "paths",
                [name],
                text,
                {"status": "4xx"},
                query=query,
            )
    for label, query in GET_QUERIES:
        yield case(
            f"paths-get-{label}",
            "paths",
            "get",
            None,
            {"status": "not5xx"},
            content_type=None,
            query=query,
        )


FAMILIES: dict[str, Callable[[], Iterator[Case]]] = {"paths": paths}
