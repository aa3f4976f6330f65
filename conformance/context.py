"""What every check receives: where the server is, which model to ask for, one HTTP client.

The kit speaks only HTTP. `base_url` is the OpenAI base URL including `/v1`
(`http://127.0.0.1:8000/v1`); the management surface, where a server has one,
is `root + "/api"`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MAX_EXAMPLES = 10
PROMPT = [{"role": "user", "content": "Say hello."}]


class KitError(Exception):
    """The kit cannot run at all (server unreachable, no model): nothing was checked."""


@dataclass(slots=True)
class Context:
    """The server under test and the knobs every check shares."""

    base_url: str
    model: str
    client: httpx.Client
    api_key: str | None = None
    max_examples: int = DEFAULT_MAX_EXAMPLES

    @classmethod
    def open(
        cls,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        max_examples: int = DEFAULT_MAX_EXAMPLES,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> Context:
        """Connect and pick the model: `model`, else the listed one that is loaded, else the first
        listed."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        client = httpx.Client(headers=headers, timeout=timeout)
        base = base_url.rstrip("/")
        try:
            chosen = _chosen_model(client, base, model)
        except BaseException:
            client.close()
            raise
        return cls(base, chosen, client, api_key, max_examples)

    def __enter__(self) -> Context:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.client.close()

    @property
    def root(self) -> str:
        """The server's origin plus any prefix before `/v1`."""
        return self.base_url.removesuffix("/v1")

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def get(self, path: str) -> httpx.Response:
        """GET `base_url + path` (`/models`)."""
        return self.client.get(self.base_url + path)

    def post(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> httpx.Response:
        """POST a JSON body to `base_url + path` (`/chat/completions`)."""
        return self.client.post(self.base_url + path, json=body, headers=headers)

    def post_raw(self, path: str, content: bytes) -> httpx.Response:
        """POST `content` as it is, labelled JSON (a body `json.dumps` would not write)."""
        headers = {"Content-Type": "application/json"}
        return self.client.post(self.base_url + path, content=content, headers=headers)

    def get_api(self, path: str) -> httpx.Response:
        """GET `root + "/api" + path` (a management endpoint; 404 on servers without one)."""
        return self.client.get(f"{self.root}/api{path}")

    def api_json(self, path: str) -> Any:
        """The JSON of a 200 from `GET root/api + path`; None for any other answer."""
        response = self.get_api(path)
        try:
            return response.json() if response.status_code == 200 else None
        except ValueError:
            return None

    def chat_body(self, **fields: Any) -> dict[str, Any]:
        """A short greedy chat request for the chosen model, with `fields` added or replaced."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": PROMPT,
            "max_tokens": 4,
            "temperature": 0,
        }
        body.update(fields)
        return body

    def completion_body(self, **fields: Any) -> dict[str, Any]:
        """A short greedy text-completion request for the chosen model."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": "The capital of France is",
            "max_tokens": 4,
            "temperature": 0,
        }
        body.update(fields)
        return body


def _chosen_model(client: httpx.Client, base: str, model: str | None) -> str:
    """`model`, else the LOADED entry of GET /models, else its first; KitError if unreachable."""
    try:
        response = client.get(f"{base}/models")
    except httpx.HTTPError as exc:
        raise KitError(f"cannot reach {base}/models: {exc}") from exc
    if model:
        return model
    if response.status_code != 200:
        raise KitError(f"GET {base}/models answered {response.status_code}; pass --model")
    try:
        entries = response.json()["data"]
        ids = [(str(e["id"]), e.get("state")) for e in entries]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KitError(f"GET {base}/models is not a model list; pass --model") from exc
    if not ids:
        raise KitError(f"GET {base}/models lists no model; pass --model")
    loaded = [name for name, state in ids if state == "LOADED"]
    return loaded[0] if loaded else ids[0][0]
