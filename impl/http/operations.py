"""Connexion's operations, with each handler's decorator chain built once.

Connexion 3's `AsyncOperation` builds the chain that turns a request into a
handler's arguments and its return into a response (the parameter decorator
inspects the handler's signature) on every request: a few tenths of a
millisecond before every handler, time-to-first-token included. The chain
holds nothing of a request (each call reads the request and its operation from
Connexion's context), so `Operation` builds it on the first call and keeps it.

A cluster's ingress answers an operation by sending the request on (`Route`,
miserver.cluster) once Connexion has validated it, instead of calling its handler.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from connexion import AsyncApp
from connexion.apps.asynchronous import AsyncApi, AsyncOperation
from connexion.context import receive, scope
from connexion.decorators import StarletteDecorator
from connexion.operations import AbstractOperation
from starlette.types import ASGIApp, Receive, Scope, Send

# an operation id -> what answers that operation instead of its handler (None: the handler)
Route = Callable[[str], ASGIApp | None]


class _Decorator(StarletteDecorator):  # type: ignore[misc]
    def __call__(self, function: Callable[..., Any]) -> Callable[[], Awaitable[Any]]:
        decorated = self.decorate(function)  # Connexion's does this per request

        @functools.wraps(function)
        async def wrapper() -> Any:
            request = self.framework.get_request(
                uri_parser=self.uri_parser, scope=scope, receive=receive
            )
            return await decorated(request)

        return wrapper


class Operation(AsyncOperation):  # type: ignore[misc]
    """An `AsyncOperation` whose handler is decorated once; `sent_on`, when set, answers the
    validated request instead of the handler."""

    sent_on: ASGIApp | None = None

    @functools.cached_property
    def fn(self) -> Callable[[], Awaitable[Any]]:
        return _Decorator(pythonic_params=self.pythonic_params, jsonifier=self.jsonifier)(self._fn)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> Any:
        if self.sent_on is not None:
            return await self.sent_on(scope, receive, send)
        return await super().__call__(scope, receive, send)


class Api(AsyncApi):  # type: ignore[misc]
    routes: ClassVar[tuple[Route, ...]] = ()  # at most one: what sends operations on

    def make_operation(self, operation: AbstractOperation) -> Operation:
        made: Operation = Operation.from_operation(
            operation, pythonic_params=self.pythonic_params, jsonifier=self.jsonifier
        )
        for route in self.routes:
            made.sent_on = route(made.operation_id)
        return made


def decorated_once(app: AsyncApp, route: Route | None = None) -> AsyncApp:
    """`app`, its operations `Operation`s: call before its first `add_api`. `route` sends
    the operations it names on (a cluster's ingress)."""
    api = Api if route is None else type("RoutedApi", (Api,), {"routes": (route,)})
    app._middleware_app.api_cls = api  # the class its routed app makes its APIs with
    return app
