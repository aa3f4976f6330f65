"""Builds the server: the Connexion app from spec/openapi, and its state.

Server (ASGI)             lifespan: load the launch model, close at exit
  -> RootAliases          vLLM's root paths (/tokenize) rewritten to their /v1 path
  -> RequestIdMiddleware  x-request-id on every response, its logs and events
  -> Refusals             every error answer counted by its code (/metrics)
  -> SecurityMiddleware   Host, Origin, API key, body cap, media type, the body
                          parsed once as strict JSON (http/body.py); headers
  -> connexion AsyncApp   routing + validation against spec/openapi/v1.yaml
     -> handlers/         thin: typed request in, service call, response out
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from connexion import AsyncApp
from connexion.exceptions import ProblemException
from connexion.lifecycle import ConnexionRequest, ConnexionResponse
from connexion.options import SwaggerUIOptions
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from .access import AccessPolicy, access_policy
from .contract import document as contract_document
from .errors import ApiError, fault, internal_error
from .events import EventBus, LogEvents
from .http import inprocess
from .http.aliases import RootAliases, root_paths
from .http.anthropic import AnthropicConventions
from .http.documents import add_document, document
from .http.operations import Route, decorated_once
from .http.pages import Pages
from .http.refusals import Refusals
from .http.request_id import RequestIdMiddleware
from .http.security import SecurityMiddleware
from .http.validation import LocalBodyValidator, OpenAIBodyValidator, OpenAIParameterValidator
from .local import health
from .local.config import CONFIG_KEY, SETTINGS_FILE, ConfigService
from .local.decisions import DecisionService
from .local.probe_scores import ProbeScores
from .local.session import Session
from .metrics import Metrics
from .models.catalog import Catalog, shipped
from .models.downloads import Downloads
from .models.hf_admin import HfAdmin
from .models.hub import Hub
from .models.locator import ModelLocator
from .models.lock import ModelLock
from .models.manager import ModelManager
from .models.registry import ModelRegistry, embedded_default
from .planner.service import Planner
from .probes.admin import ProbeAdmin
from .serving.batches.lines import Answer
from .serving.batches.runner import BatchRunner
from .serving.batches.service import BatchService
from .serving.completions.service import CompletionService
from .serving.embeddings import EmbeddingService
from .serving.files import FileService
from .serving.messages.service import MessagesService
from .serving.responses.service import ResponsesService
from .serving.scheduler import Scheduler
from .serving.tokenizer.service import TokenizerService
from .settings import Settings
from .steering.admin import SteeringAdmin
from .steering.circuit_admin import CircuitAdmin
from .steering.dial import Bounds
from .steering.live import LiveSteering
from .steering.sae import SAERegistry
from .store.batches import BatchStore
from .store.circuits import CircuitStore
from .store.database import Database
from .store.documents import Document, FileDocument, RowDocument
from .store.files import FileStore
from .store.probes import ProbeStore
from .store.profiles import ProfileStore
from .store.responses import ResponseStore
from .tracing import Tracing

log = logging.getLogger(__name__)

_PROBLEM_CODES = {
    400: "invalid_parameter",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerState:
    settings: Settings
    manager: ModelManager
    scheduler: Scheduler
    completions: CompletionService
    responses: ResponsesService
    files: FileService
    batches: BatchService
    messages: MessagesService
    steering: LiveSteering
    admin: SteeringAdmin
    circuits: CircuitAdmin
    probes: ProbeAdmin
    probe_scores: ProbeScores
    decisions: DecisionService
    embeddings: EmbeddingService
    tokenizer: TokenizerService
    session: Session
    bus: EventBus
    config: ConfigService
    downloads: Downloads
    hf: HfAdmin
    planner: Planner
    metrics: Metrics


def _respond(error: ApiError) -> ConnexionResponse:
    return ConnexionResponse(
        status_code=error.status,
        body=error.body_bytes(),
        mimetype="application/json",
        headers=error.headers,
    )


def _api_error(_request: ConnexionRequest, exc: Exception) -> ConnexionResponse:
    assert isinstance(exc, ApiError)
    if exc.status >= 500:
        log.error("%s: %s", exc.code, exc.message)
    return _respond(exc)


def _http_error(request: ConnexionRequest, exc: Exception) -> ConnexionResponse:
    status = exc.status_code if isinstance(exc, HTTPException) else getattr(exc, "status", 500)
    detail = exc.detail if isinstance(exc, HTTPException | ProblemException) else None
    code = _PROBLEM_CODES.get(int(status))
    if code == "invalid_parameter" and request.url.path.startswith("/api/"):
        code = "invalid_request"  # a required body missing: not a JSON object (LOC-GEN-15)
    if code is None:
        log.error("unexpected problem %r", exc)
        return _respond(internal_error())
    message = (
        str(detail)
        if detail
        else {404: "No such route.", 405: "Method not allowed."}.get(
            int(status), "The request is invalid."
        )
    )
    return _respond(ApiError(code, message))


def _server_fault(_request: ConnexionRequest, exc: Exception) -> ConnexionResponse:
    log.error("unhandled error", exc_info=exc)
    return _respond(fault(exc))  # a device out of memory is insufficient_memory (OAI-ERR-28)


def _model_refusal(manager: ModelManager) -> Callable[[str], ApiError | None]:
    """What a Batch API line naming `model` gets at validation: the refusal the route gives a
    name this server does not serve by (OAI-GGUF-08), or None."""

    def refusal(model: str) -> ApiError | None:
        try:
            manager.entry(model)
        except ApiError as exc:
            return exc
        return None

    return refusal


def _registry(settings: Settings) -> tuple[ModelRegistry, str | None]:
    """The registry and the id of the model to serve at start.

    `--model PATH` serves that file or folder. Otherwise the embedded
    SmolLM2 (its GGUF on llama.cpp, and its transformers conversion) is
    listed beside the models directory, and `--model ID` (default: the
    GGUF) picks the model to serve at start.
    """
    given = Path(settings.model).expanduser() if settings.model else None
    if given is not None and given.exists():
        registry = ModelRegistry(settings.resolved_models_dir, given)
        return registry, registry.launch.model_id if registry.launch else None
    try:
        embedded: Path | None = embedded_default()
    except FileNotFoundError:
        embedded = None
    registry = ModelRegistry(settings.resolved_models_dir, embedded)
    default = registry.launch.model_id if registry.launch else None
    return registry, settings.model or default


def build_connexion(route: Route | None = None) -> AsyncApp:
    """The Connexion app for spec/openapi, with OpenAI-format errors everywhere; `route`
    sends the operations it names on once validated (a cluster's ingress)."""
    spec_dir = Path(str(resources.files("miserver.spec") / "openapi"))
    app = decorated_once(
        AsyncApp(
            __name__,
            # the documents are served as written by handlers.contract, not as Connexion
            # resolves them
            swagger_ui_options=SwaggerUIOptions(swagger_ui=False, serve_spec=False),
        ),
        route,
    )
    bodies = {"v1.yaml": OpenAIBodyValidator, "api.yaml": LocalBodyValidator}  # LOC-GEN-14
    for name, body in bodies.items():
        add_document(
            app,
            document(spec_dir / name),
            validator_map={
                "body": {"application/json": body},
                "parameter": OpenAIParameterValidator,
            },
            strict_validation=False,
            validate_responses=False,
        )
    app.add_error_handler(ApiError, _api_error)
    app.add_error_handler(ProblemException, _http_error)
    app.add_error_handler(HTTPException, _http_error)
    app.add_error_handler(Exception, _server_fault)
    return app


def _live_steering(settings: Settings, db: Database) -> LiveSteering:
    """Steering state: the SAEs on disk, the profiles and the live set in the database."""
    bounds = Bounds.configured(settings.cluster_intensity_min, settings.cluster_intensity_max)
    envelope = Bounds.configured(settings.circuit_intensity_min, settings.circuit_intensity_max)
    return LiveSteering(
        SAERegistry(settings.resolved_saes_dir),
        ProfileStore(db),
        db,
        bounds,
        circuits=CircuitStore(db),
        circuit_bounds=envelope,
    )


def _downloads(settings: Settings, catalog: Catalog, bus: EventBus) -> Downloads:
    """The model downloads from the catalog, announced on the bus."""
    return Downloads(
        catalog,
        settings.resolved_models_dir,
        settings.hf_endpoint,
        bus.publish,
        wait_s=settings.download_retry_wait_s,
        wait_max_s=settings.download_retry_wait_max_s,
    )


def _config_document(settings: Settings, database: Database) -> Document:
    """Where the config is kept: `settings.json` in the data dir, or the database's row when
    the state is in PostgreSQL (every replica of a cluster reads the same one)."""
    if settings.database_url is not None:
        return RowDocument(database, CONFIG_KEY)
    return FileDocument(settings.data_dir / SETTINGS_FILE)


def _decisions(
    manager: ModelManager, scheduler: Scheduler, executor: ThreadPoolExecutor, config: ConfigService
) -> DecisionService:
    """`/api/decide`, on while the session's config says so."""
    return DecisionService(
        manager, scheduler, executor, enabled=lambda: bool(config.in_session("decide"))
    )


def _metrics(
    settings: Settings, manager: ModelManager, scheduler: Scheduler, bus: EventBus
) -> Metrics:
    """The metrics: gauges read from the manager and scheduler, downloads from the bus; off
    with --no-metrics."""
    metrics = Metrics(lambda: health.live(manager, scheduler, metrics), on=not settings.no_metrics)
    bus.tap("download", metrics.download)
    return metrics


def _planner(
    settings: Settings,
    bus: EventBus,
    config: ConfigService,
    manager: ModelManager,
    session: Session,
) -> Planner:
    return Planner(
        bus=bus,
        config=config,
        manager=manager,
        session=session,
        models_dir=settings.resolved_models_dir,
        isolated=not settings.no_isolated_probes,
    )


# the routes whose requests may join a batch, counted on their way to it (serving/arrivals.py)
GENERATING = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"})

# the routes whose requests wait for the slot
QUEUED = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/embeddings",
        "/api/decide",
        "/api/probes/score",
    }
)


class Server:
    """The ASGI application: one model manager, one scheduler, one Connexion app.

    `policy` is the security model's start-up result (`access_policy`, which
    raises StartRefused before anything is built); by default it is computed
    from `settings`. `flags` are the parameter table's own launch flags as given
    (`local.params.launch_values`): the config's launch layer beside `settings`.
    In a cluster (miserver.cluster) `route` sends operations on to other
    processes once validated, and `batches` says whether this one runs the
    Batch API's lines.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        preload: bool = True,
        policy: AccessPolicy | None = None,
        flags: Mapping[str, Any] | None = None,
        route: Route | None = None,
        batches: bool = True,
    ) -> None:
        self.policy = policy if policy is not None else access_policy(settings)
        self.settings = settings
        self._preload = preload
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        registry, self._launch_id = _registry(settings)
        self._db = Database(settings.database)
        self.bus = EventBus()
        self._log_events = LogEvents(self.bus)
        logging.getLogger("miserver").addHandler(self._log_events)
        self.tracing = Tracing(settings.otlp_traces_endpoint)  # OTLP spans, when set
        self.state = self._services(registry, flags)
        self._app = RootAliases(
            AnthropicConventions(
                RequestIdMiddleware(
                    Refusals(
                        SecurityMiddleware(
                            Pages(build_connexion(route)),
                            self.policy,
                            settings.json_max_depth,
                            gate=self._gate,
                        ),
                        self.state.metrics,
                    )
                )
            ),
            root_paths(contract_document("v1")),
        )
        if batches:
            self.state.batches.runner = BatchRunner(
                self.state.batches.store,
                self.state.files.store,
                self._in_process,
                lambda: self.state.scheduler.rows,
                self.state.batches.announce,
            )

    async def _in_process(self, path: str, body: bytes) -> Answer:
        """A Batch API line, posted to its route through this whole server (batches/runner)."""
        return await inprocess.post(self, path, body, key=self.policy.key)

    def _services(self, registry: ModelRegistry, flags: Mapping[str, Any] | None) -> ServerState:
        """Every service the handlers reach, wired to one manager and one scheduler.

        The manager and the config know each other: the config follows the manager's loads,
        and each load asks the config how it goes (`config` is bound below, before any load)."""
        settings = self.settings
        manager = ModelManager(
            registry,
            settings,
            self._executor,
            lock=ModelLock(self._db),
            load_options=lambda: config.load_options(),
        )
        scheduler = Scheduler(
            settings.queue_max_waiting, settings.queue_retry_after, rows=manager.batch_rows
        )
        locator = ModelLocator(registry, settings.scan_dirs, settings.models_only)
        session = Session(manager, scheduler, self.bus, launch_id=self._launch_id, locator=locator)
        config = ConfigService.open(
            settings,
            self.bus,
            self._launch_id,
            manager,
            locator=locator,
            document=_config_document(settings, self._db),
            flags=flags,
        )
        return self._state(manager, scheduler, session, config)

    def _state(
        self, manager: ModelManager, scheduler: Scheduler, session: Session, config: ConfigService
    ) -> ServerState:
        """The services built on the shared manager, scheduler, session and config."""
        settings, executor, bus = self.settings, self._executor, self.bus
        metrics = _metrics(settings, manager, scheduler, bus)
        live = _live_steering(settings, self._db)
        probes = ProbeAdmin(ProbeStore(self._db, keep=settings.probe_events_max), metrics)
        service = CompletionService(
            settings, manager, scheduler, executor,
            live=live, generating=session.generating_one, bus=bus,
            defaults=config.request_defaults, probes=probes, metrics=metrics, tracing=self.tracing,
        )  # fmt: skip
        admin = SteeringAdmin(live, manager)
        catalog = Catalog(shipped(settings.catalog_file), settings.data_dir / "added-models.json")
        tokenizer = TokenizerService(settings, manager, scheduler, defaults=config.request_defaults)
        files = FileService(
            FileStore(self._db, settings.data_dir / "files", settings.files_max_bytes)
        )
        return ServerState(
            settings=settings,
            manager=manager,
            scheduler=scheduler,
            completions=service,
            responses=ResponsesService(
                service, ResponseStore(self._db, limit=settings.responses_max_stored), manager
            ),
            files=files,
            batches=BatchService(BatchStore(self._db), files, _model_refusal(manager), bus),
            steering=live,
            admin=admin,
            circuits=CircuitAdmin(live, admin),
            probes=probes,
            probe_scores=ProbeScores(
                settings, manager, scheduler, executor, live=live, probes=probes
            ),
            decisions=_decisions(manager, scheduler, executor, config),
            embeddings=EmbeddingService(settings, manager, scheduler, executor),
            tokenizer=tokenizer,
            messages=MessagesService(service, tokenizer, settings.ignored_fields_header_max_bytes),
            session=session,
            bus=bus,
            config=config,
            downloads=_downloads(settings, catalog, bus),
            hf=HfAdmin(Hub(settings.hf_endpoint), catalog),
            planner=_planner(settings, bus, config, manager, session),
            metrics=metrics,
        )

    def _gate(self, method: str, path: str) -> ApiError | None:
        """A request that would wait for the slot is refused before its body is parsed while
        the queue is full (issue 17: refusing stays cheap while the batch decodes)."""
        if method != "POST" or path not in QUEUED:
            return None
        return self.state.scheduler.refusal()

    def reload(self, epoch: int | None = None) -> None:
        """Read the operator's state again from the data dir, where another process of the
        same cluster changed it: steering (its epoch moved to `epoch`, the cluster's), probes,
        the model lock, the config."""
        state = self.state
        state.steering.reload(epoch)
        state.probes.reload()
        if state.manager.lock is not None:
            state.manager.lock.reload()
        state.config.reload()

    @property
    def database(self) -> Database:
        return self._db

    def launch_model_id(self) -> str | None:
        return self._launch_id

    async def startup(self) -> None:
        model_id = self.launch_model_id()
        if self._preload and model_id is not None:
            engine = str(self.state.config.values["engine"])  # `--engine`, as a load reads it
            entry = self.state.session.locator.find(model_id, peer_local=True, engine=engine)
            if self.state.config.auto_plan:  # `--auto-plan`: the start's load plans too
                await self.state.planner.plan_for_load(entry)
            async with self.state.scheduler.hold():
                await self.state.manager.ensure(entry)
        if self.state.batches.runner is not None:
            self.state.batches.runner.start()  # kept batches go on where they stopped

    def shutdown(self) -> None:
        logging.getLogger("miserver").removeHandler(self._log_events)
        self.state.manager.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.tracing.close()
        self._db.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        scope["miserver"] = self.state
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in GENERATING:
            with self.state.completions.arrivals.arriving():  # serving/arrivals.py
                await self._app(scope, receive, send)
            return
        await self._app(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.state.batches.runner is not None:
                    await self.state.batches.runner.stop()
                await self.state.downloads.close()
                self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return
