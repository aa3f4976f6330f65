"""Every knob of the server in one typed place.

Each setting has a default, an environment variable and (for most) a
`miserver serve` flag; flags win over the environment. The security
settings (bind address, API key, origins, model confinement) are flags only:
nothing inherited from the environment changes who may reach the server
(LOC-SEC-01). docs/SETTINGS.md documents every one (a test keeps the two in
step).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import platformdirs


def _knob(default: Any, env: str | None, flag: str | None, help: str, *, shown: bool = True) -> Any:
    """A setting; `shown=False` keeps a secret out of the settings' repr (and so out of logs)."""
    metadata = {"env": env, "flag": flag, "help": help}
    return field(default=default, repr=shown, metadata=metadata)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    host: str = _knob(
        "127.0.0.1",
        None,
        "--host",
        "Address to bind (flag only). Beyond loopback it needs --api-key-file, --api-key "
        "or --no-api-key.",
    )
    port: int = _knob(8000, "MISERVER_PORT", "--port", "TCP port to bind.")
    api_key_file: Path | None = _knob(
        None,
        None,
        "--api-key-file",
        "File holding the API key every /api and /v1 request must send as "
        "`Authorization: Bearer KEY` (trailing line breaks and blanks ignored).",
    )
    api_key: str | None = _knob(
        None,
        None,
        "--api-key",
        "The API key itself (visible in the process list: prefer --api-key-file).",
        shown=False,
    )
    no_api_key: bool = _knob(
        False,
        None,
        "--no-api-key",
        "Serve a non-loopback --host with no key, on purpose (logged as a warning).",
    )
    allow_origin: tuple[str, ...] = _knob(
        (),
        None,
        "--allow-origin",
        "One more browser Origin admitted to /api and /v1 (e.g. a UI dev server); repeatable.",
    )
    models_only: bool = _knob(
        False,
        None,
        "--models-only",
        "Confine the model paths of every client, loopback included, to the model folders.",
    )
    model: str | None = _knob(
        None,
        "MISERVER_MODEL",
        "--model",
        "Model to serve at start: a path (HF folder or .gguf) or an id from the models "
        "directory. Default: the embedded SmolLM2-135M-Instruct.",
    )
    models_dir: Path | None = _knob(
        None,
        "MISERVER_MODELS_DIR",
        "--models-dir",
        "Directory of HF folders and .gguf files that /v1/models lists. Default: DATA_DIR/models.",
    )
    scan_dirs: tuple[Path, ...] = _knob(
        (),
        None,
        "--scan-dir",
        "One more directory GET /api/models lists, after the models directory, read one level "
        "deep and never written to (flag only); repeatable.",
    )
    hf_endpoint: str = _knob(
        "https://huggingface.co",
        "MISERVER_HF_ENDPOINT",
        "--hf-endpoint",
        "The one Hugging Face site (or mirror) every download and /api/hf request goes to; "
        "catalog files resolve against it.",
    )
    auto_plan: bool = _knob(
        False,
        "MISERVER_AUTO_PLAN",
        "--auto-plan",
        "Plan before every load (GET /api/plan's probes, its plan applied), the start's own "
        "load included, until PUT /api/config sets auto_plan otherwise (the person's choice "
        "is saved and wins).",
    )
    no_isolated_probes: bool = _knob(
        False,
        "MISERVER_NO_ISOLATED_PROBES",
        "--no-isolated-probes",
        "Ask compute devices beyond the host and time the engine's kernels in the server's own "
        "process. By default the planner runs both in children (miserver serve --probe-device, "
        "--probe-kernels), so a driver or kernel that ends its process cannot end the server "
        "and the threads a probe starts do not stay in it.",
    )
    catalog_file: Path | None = _knob(
        None,
        "MISERVER_CATALOG",
        "--catalog",
        "A mi.catalog/v1 file (spec/schemas/mi-catalog-v1.json) to offer instead of the "
        "shipped download catalog, e.g. a lab's own list on its mirror.",
    )
    download_retry_wait_s: float = _knob(
        2.0,
        "DOWNLOAD_RETRY_WAIT_S",
        None,
        "The wait before a download retries a failed line (LOC-DL-11); it doubles each time.",
    )
    download_retry_wait_max_s: float = _knob(
        60.0,
        "DOWNLOAD_RETRY_WAIT_MAX_S",
        None,
        "The longest wait between two attempts of a download (LOC-DL-11).",
    )
    data_dir: Path = _knob(
        Path(platformdirs.user_data_dir("miserver")),
        "MISERVER_DATA_DIR",
        "--data-dir",
        "Where the server keeps its state (settings.json, SQLite).",
    )
    database_url: str | None = _knob(
        None,
        "MISERVER_DATABASE_URL",
        "--database-url",
        "A PostgreSQL DSN (postgresql://user:password@host/db) to keep the server's state in, "
        "instead of SQLite in the data dir: for a cluster whose replicas span machines "
        "(docs/CLUSTER.md). Needs the `postgres` extra.",
        shown=False,
    )
    cache_dir: Path = _knob(
        Path(platformdirs.user_cache_dir("miserver")),
        "MISERVER_CACHE_DIR",
        "--cache-dir",
        "Where derived files live: GGUF models converted once to HF folders.",
    )
    saes_dir: Path | None = _knob(
        None,
        "MISERVER_SAES_DIR",
        "--saes-dir",
        "Directory of SAEs (SAELens layout, one folder each) that /api/saes lists. "
        "Default: DATA_DIR/saes.",
    )
    cluster_intensity_min: float = _knob(
        0.5,
        "CLUSTER_INTENSITY_MIN",
        None,
        'The dial\'s "min" for a profile that declares no intensity_range (OAI-DIAL-09).',
    )
    cluster_intensity_max: float = _knob(
        2.0,
        "CLUSTER_INTENSITY_MAX",
        None,
        'The dial\'s "max" and cap for a profile that declares no intensity_range '
        "(OAI-DIAL-07); within [0, 2].",
    )
    circuit_intensity_min: float = _knob(
        0.0,
        "CIRCUIT_INTENSITY_MIN",
        None,
        "The floor of a circuit's dial (OAI-CIRCUIT-06): a numeric λ below it is raised to it; "
        "within [0, 2].",
    )
    circuit_intensity_max: float = _knob(
        2.0,
        "CIRCUIT_INTENSITY_MAX",
        None,
        "The ceiling of a circuit's dial (OAI-CIRCUIT-03, open point 15); within [0, 2].",
    )
    scoring_float32_device: str = _knob(
        "auto",
        "SCORING_FLOAT32_DEVICE",
        None,
        "Where a float32 scoring copy goes: auto (the model's device), cpu, or cuda[:N].",
    )
    scoring_float32_headroom_mb: int = _knob(
        512,
        "SCORING_FLOAT32_HEADROOM_MB",
        None,
        "Memory a float32 scoring copy must leave free on its device, in MiB.",
    )
    embeddings_max_inputs: int = _knob(
        256,
        "EMBEDDINGS_MAX_INPUTS",
        None,
        "Most strings one /v1/embeddings request may hold (provisional; bounds a chat's wait).",
    )
    gguf_enable_embeddings: bool = _knob(
        True,
        "GGUF_ENABLE_EMBEDDINGS",
        None,
        "Load GGUF models able to embed (mean pooling); false refuses /v1/embeddings on them.",
    )
    queue_max_waiting: int = _knob(
        16,
        "QUEUE_MAX_WAITING",
        "--queue-max-waiting",
        "Requests that may wait for the generation slot; the next gets 503 queue_full.",
    )
    queue_retry_after: int = _knob(
        1,
        "QUEUE_RETRY_AFTER_SECONDS",
        None,
        "Retry-After seconds sent with 503 queue_full and model_busy.",
    )
    queue_heartbeat: float = _knob(
        15.0,
        "QUEUE_HEARTBEAT_SECONDS",
        None,
        "Seconds between `: waiting for a turn` comments to a queued stream.",
    )
    files_max_bytes: int = _knob(
        8 * 1024 * 1024,
        "FILES_MAX_BYTES",
        None,
        "Most bytes one file of the Files API (/v1/files: a batch's input) may hold; at most "
        "the request body cap, 8 MiB. More is 413 payload_too_large.",
    )
    scoring_cache: bool = _knob(
        False,
        "MISERVER_SCORING_CACHE",
        "--scoring-cache",
        "Let next-token scoring (logprobs with max_tokens 1) reuse a prefix the KV or the "
        "prompt cache holds: a repeated few-shot context is scored in the time of its last "
        "tokens, its log-probabilities within float rounding of a cold pass (a quantized "
        "GGUF: within llama.cpp's batch-shape noise). Off: every prompt is scored whole, "
        "bit for bit the same whatever came before it (docs/DECISIONS.md, issue 43).",
    )
    no_metrics: bool = _knob(
        False,
        "MISERVER_NO_METRICS",
        "--no-metrics",
        "Keep no Prometheus metrics: GET /metrics answers 404 and no request moves a counter "
        "(replies keep their timings; traces are --otlp-traces-endpoint's).",
    )
    otlp_traces_endpoint: str | None = _knob(
        None,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "--otlp-traces-endpoint",
        "An OTLP/HTTP traces endpoint (`http://host:4318/v1/traces`): each generation request "
        "is sent there as spans (docs/OPERATIONS.md). Unset: no spans are made.",
    )
    stream_interval: float = _knob(
        0.05,
        "STREAM_INTERVAL_SECONDS",
        "--stream-interval",
        "Seconds a stream's text waits to go out with more: a piece made within this time of "
        "the last chunk sent goes in the next one (the first at once, the last with the "
        "end); 0 sends every token's text as it is made.",
    )
    default_max_tokens: int = _knob(
        512,
        "DEFAULT_MAX_TOKENS",
        "--default-max-tokens",
        "max_tokens when a request sends none (capped by the context left after the prompt).",
    )
    json_max_depth: int = _knob(
        64,
        "JSON_MAX_DEPTH",
        "--json-max-depth",
        "Deepest nesting of arrays and objects a request body may have; deeper is refused "
        "with 400 before any other work.",
    )
    sae_activations_max_top_k: int = _knob(
        64,
        "SAE_ACTIVATIONS_MAX_TOP_K",
        None,
        "Largest `return_sae_activations.top_k` a request may ask for; more is refused with 400.",
    )
    sae_activations_max_entries: int = _knob(
        65536,
        "SAE_ACTIVATIONS_MAX_ENTRIES",
        None,
        "Most activation entries (positions x top_k, max_tokens counted in full) one request "
        "may ask for; more is refused with 400 before anything is generated.",
    )
    probe_events_max: int = _knob(
        100_000,
        "PROBE_EVENTS_MAX",
        None,
        "Most probe results GET /api/probes/events keeps; the oldest go first.",
    )
    responses_max_stored: int = _knob(
        10_000,
        "RESPONSES_MAX_STORED",
        "--responses-max-stored",
        "Most responses POST /v1/responses keeps (`store`, the default) for GET, input_items "
        "and previous_response_id; saving one more deletes the oldest.",
    )
    ignored_fields_header_max_bytes: int = _knob(
        1024,
        "IGNORED_FIELDS_HEADER_MAX_BYTES",
        None,
        'Cap on the X-miLLM-Ignored-Fields value; past it the last entry is "+N more".',
    )
    graceful_unload_timeout: float = _knob(
        30.0,
        "GRACEFUL_UNLOAD_TIMEOUT",
        None,
        "Seconds a model switch waits for the running request before halting it.",
    )
    memory_budget_mb: int = _knob(
        0,
        "MEMORY_BUDGET_MB",
        "--memory-budget-mb",
        "Memory a model may take, in MiB; 0 uses the host's available memory.",
    )
    threads: int = _knob(
        0,
        "MISERVER_THREADS",
        "--threads",
        "Threads for forward passes (torch on transformers, llama.cpp on GGUF); "
        "0 uses the physical cores the process may use (affinity, cgroup quota).",
    )
    log_level: str = _knob("info", "MISERVER_LOG_LEVEL", "--log-level", "Logging level.")

    @property
    def resolved_models_dir(self) -> Path:
        return self.models_dir if self.models_dir is not None else self.data_dir / "models"

    @property
    def resolved_saes_dir(self) -> Path:
        return self.saes_dir if self.saes_dir is not None else self.data_dir / "saes"

    @property
    def database_path(self) -> Path:
        return self.data_dir / "miserver.sqlite3"

    @property
    def database(self) -> Path | str:
        """Where the server's state lives: the PostgreSQL DSN when one is given, else the
        SQLite file in the data dir (store/database.py)."""
        return self.database_url if self.database_url is not None else self.database_path


def documented() -> list[tuple[str, str | None, str | None, str]]:
    """(name, env var, flag, help) for every setting, in declaration order."""
    return [
        (f.name, f.metadata["env"], f.metadata["flag"], f.metadata["help"])
        for f in fields(Settings)
    ]


def _boolean(raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"not a boolean: {raw!r} (use true or false)")


_PARSERS: dict[str, Callable[[str], Any]] = {
    "bool": _boolean,
    "tuple[Path, ...]": lambda raw: (Path(raw).expanduser(),),
    "tuple[str, ...]": lambda raw: (raw,),
    "int": int,
    "float": float,
    "str": str,
    "str | None": str,
    "Path": lambda raw: Path(raw).expanduser(),
    "Path | None": lambda raw: Path(raw).expanduser(),
}


def _coerce(name: str, raw: str) -> Any:
    """A setting's text (from the environment or a flag) as its declared type."""
    return _PARSERS[str(Settings.__dataclass_fields__[name].type)](raw)


def from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from the environment, defaults elsewhere."""
    env = os.environ if environ is None else environ
    values = {
        f.name: _coerce(f.name, env[f.metadata["env"]])
        for f in fields(Settings)
        if f.metadata["env"] is not None and f.metadata["env"] in env
    }
    return Settings(**values)


def _flag_action(kind: str) -> dict[str, Any]:
    """A boolean setting is a switch (`--no-api-key`); a tuple one repeats (`--allow-origin`)."""
    if kind == "bool":
        return {"action": "store_const", "const": "true"}
    if kind.startswith("tuple["):
        return {"action": "append"}
    return {}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting that has one; unset flags keep the environment's value."""
    for f in fields(Settings):
        if f.metadata["flag"]:
            env = f" (env {f.metadata['env']})" if f.metadata["env"] else ""
            parser.add_argument(
                f.metadata["flag"],
                dest=f.name,
                default=None,
                help=f"{f.metadata['help']}{env}",
                **_flag_action(str(f.type)),
            )


def _from_flag(name: str, raw: str | list[str]) -> Any:
    """A flag's value as the setting's type; a repeated flag's values as a tuple."""
    if isinstance(raw, list):
        return tuple(item for value in raw for item in _coerce(name, value))
    return _coerce(name, raw)


def from_args(
    args: argparse.Namespace, base: Settings | None = None, names: Sequence[str] | None = None
) -> Settings:
    """`base` (default: the environment) with every flag that was given."""
    settings = base if base is not None else from_env()
    given = {
        f.name: _from_flag(f.name, getattr(args, f.name))
        for f in fields(Settings)
        if f.metadata["flag"]
        and getattr(args, f.name, None) is not None
        and (names is None or f.name in names)
    }
    return replace(settings, **given)
