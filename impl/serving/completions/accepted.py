"""A completion request past every refusal that needs no model, and what it brings along.

`CompletionService.serve` makes one `Accepted` per request before the slot:
the request with the config's defaults applied and its unused fields taken
out, the model's entry, the defaults it saw (a request that waits in the
queue keeps them), its activation reading and its probe run. It is frozen;
what varies with the engine that serves it is a `Prepared` (prepared.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...engines.base import Engine, Hooks
from ...metrics import Watch
from ...models.registry import ModelEntry
from ...steering.live import LiveSteering
from ...steering.source import RequestSource
from ...tracing import RequestTrace
from . import steered
from .defaults import RequestDefaults
from .generation import ChoiceEnd
from .prepared import Prepared, Tally
from .probe_run import ProbeRun
from .reading import Reading
from .requests import GenerationRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class Accepted:
    request: GenerationRequest
    entry: ModelEntry
    defaults: RequestDefaults
    reading: Reading | None = None  # `return_sae_activations`, resolved (OAI-ACT)
    probes: ProbeRun | None = None  # the armed probes, while any is (REQ-000 PROBE)
    watch: Watch | None = None  # its metrics, from its arrival (GET /metrics)
    trace: RequestTrace | None = None  # its spans, made at its end (tracing.py); None: off

    def hooks(self, steering: RequestSource | None) -> Hooks:
        """One choice's hooks: the request's steering, a fresh probe monitor, a fresh
        capture of the reading's layer."""
        monitor = None if self.probes is None else self.probes.monitor()
        capture = None if self.reading is None else self.reading.capture()
        return Hooks(steering=steering, monitor=monitor, capture=capture)

    def steering(self, live: LiveSteering, engine: Engine) -> RequestSource | None:
        """What the hooks read, resolved again once the slot is held (steered.py)."""
        return steered.source(self.request.steering, live, self.entry.model_id, engine)

    def interrupted(self, prepared: Prepared, request_id: str, exc: BaseException) -> None:
        """A response that never went out whole (the client left, or the generation
        failed): its probe results recorded as `interrupted` (OAI-PROBE-09)."""
        reason = "generation_failed" if isinstance(exc, Exception) else "client_disconnected"
        if self.watch is not None:
            self.watch.aborted()
            if self.trace is not None:
                self.trace.end(self.watch, self._attributes(prepared), error=reason)
        if self.probes is not None:
            self.probes.interrupted(prepared, request_id, reason)

    def as_row(self, prepared: Prepared | None, resident: Engine | None) -> bool:
        """Whether the choices decode as rows of the resident engine's batch
        (docs/DECISIONS.md, continuous batching): prepared for it, every prompt and budget
        fitting a row, unless seeded (a seed's byte-identical promise holds only on the
        serial path, OAI-CBM-08), reading (OAI-ACT-25) or echoing (a row keeps no prompt logits)."""
        if prepared is None or prepared.engine is not resident or resident.batch is None:
            return False
        if self.request.seed is not None or self.reading is not None or self.request.echo:
            return False
        return prepared.fits(resident.batch.window)

    def ended(self, prepared: Prepared, prompt: int, end: ChoiceEnd) -> None:
        """Prompt `prompt`'s choice ended: its metrics."""
        if self.watch is not None:
            size = len(prepared.prompt_ids[prompt])
            self.watch.ended(end.finish_reason, end.completion_tokens, size)

    def report(self, prepared: Prepared, tally: Tally, end: ChoiceEnd | None) -> dict[str, Any]:
        """What a reply (and a stream's last choice chunk) reports of its run: `timings`, the
        request's (llama.cpp's keys, metrics.Watch.timings), and `millm_summary`, its last
        choice's `done` summary (LOC-CHAT-64, LOC-CHAT-71; contract 0.27.0)."""
        found: dict[str, Any] = {}
        if self.watch is not None:
            counts = (prepared.prompt_tokens, tally.completion, tally.cached)
            found["timings"] = self.watch.timings(*counts)
        if end is not None and end.summary is not None:
            found["millm_summary"] = dict(end.summary)
        return found

    def finished(self, prepared: Prepared, tally: Tally, statement: str, rung: str | None) -> None:
        """The request ended whole: its metrics (the prompt billed, where its steering came
        from, read off its X-miLLM-Steering `statement` and circuit `rung`)."""
        if self.watch is not None:
            self.watch.steered(steered.origin(self.request.steering, statement, rung))
            self.watch.finished(prepared.prompt_tokens, tally.cached)
            if self.trace is not None:
                attributes = self._attributes(prepared)
                attributes["gen_ai.usage.output_tokens"] = tally.completion
                self.trace.end(self.watch, attributes)

    def _attributes(self, prepared: Prepared) -> dict[str, Any]:
        """Its span's attributes (OpenTelemetry's gen_ai names where they exist)."""
        return {
            "gen_ai.request.model": self.entry.model_id,
            "gen_ai.usage.input_tokens": prepared.prompt_tokens,
            "miserver.endpoint": self.request.endpoint,
        }
