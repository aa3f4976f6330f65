"""The Batch API's runner: one task that runs the kept batches' lines, oldest batch first.

Each line is posted to its route in process (http/inprocess.py) in the
background (serving/scheduler.py: behind every interactive request, a row kept
free for one), as many at once as the resident engine has rows, so the lines
fill the continuous batch. A line's result is kept the moment its answer is
whole; a line is run again only when it has none, so a restart after a
`kill -9` resumes with no line run twice and none lost. An answer of
`503 preempted`, `model_busy` or `queue_full` is asked again, not kept: at once
when the line's row was taken back for an interactive request (preempted),
after `retry_s` when a model was switching or the queue full.

A batch being cancelled, or past its completion window, starts no more lines;
the running ones finish and are kept. Then it is finalized: every line not run
gets an error line (`batch_cancelled`, `batch_expired`), and the output and
error files are written under ids the batch fixes and kept with its terminal
status in one transaction, so a crash while finalizing finalizes again, the
same.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress

from ...store.batches import BatchRecord, BatchStore, LineRecord
from ...store.files import FileStore, StoredFile
from ..scheduler import in_background
from . import lines
from .lines import Answer
from .objects import expires_at

log = logging.getLogger("miserver.batches")

Ask = Callable[[str, bytes], Awaitable[Answer]]  # (path, JSON body) -> the route's answer
RETRIED = frozenset({"model_busy", "queue_full", "preempted"})
AHEAD = 2  # lines in flight per row: a row that frees finds the next one prepared, waiting
UNRUN = {
    "cancelled": ("batch_cancelled", "The batch was cancelled before this line ran."),
    "expired": ("batch_expired", "The batch's completion window ended before this line ran."),
}


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        files: FileStore,
        ask: Ask,
        rows: Callable[[], int],
        announce: Callable[[str], None],
        *,
        retry_s: float = 1.0,
    ) -> None:
        self._store = store
        self._files = files
        self._ask = ask
        self._rows = rows  # how many lines to have running at once
        self._announce = announce  # a batch's object changed (events)
        self._retry_s = retry_s
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run from now on (the server's start): kept batches first, where they stopped."""
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="batch runner")

    def wake(self) -> None:
        """A batch was made or cancelled."""
        if self._wake is not None:
            self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            batch = self._store.next_active()
            if batch is None:
                await self._wake.wait()
                self._wake.clear()
                continue
            try:
                await self._run(batch)
            except Exception as exc:  # a fault of ours: the batch fails, the runner goes on
                log.exception("batch %s failed", batch.id)
                error = {"code": "server_error", "message": f"The batch failed: {exc!r}."}
                self._store.fail(batch.id, int(time.time()), [error])
                self._announce(batch.id)

    async def _run(self, batch: BatchRecord) -> None:
        if batch.status == "in_progress":
            await self._lines(batch)
        self._finalize(self._store.get(batch.id))

    def _stopped(self, batch: BatchRecord) -> bool:
        """Whether the batch starts no more lines: cancelled, or past its window."""
        if time.time() >= expires_at(batch):
            return True
        return self._store.get(batch.id).status == "cancelling"

    async def _lines(self, batch: BatchRecord) -> None:
        pending = deque(self._store.pending(batch.id))
        running: set[asyncio.Task[None]] = set()
        announced = 0.0
        while pending or running:
            if self._stopped(batch):
                pending.clear()
            while pending and len(running) < AHEAD * max(1, self._rows()):
                line = pending.popleft()
                running.add(asyncio.create_task(self._line(batch, line)))
            if not running:
                break
            try:
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                for task in running:
                    task.cancel()
                raise
            for task in done:
                task.result()
            if time.monotonic() - announced >= 0.5:  # progress, twice a second at most
                announced = time.monotonic()
                self._announce(batch.id)

    async def _line(self, batch: BatchRecord, line: LineRecord) -> None:
        assert line.request is not None
        while True:
            with in_background():
                answer = await self._ask(batch.endpoint, line.request.encode("utf-8"))
            code = _code(answer) if answer.status == 503 else None
            if code not in RETRIED:
                break
            if code != "preempted":  # a model switching, a full queue: not at once
                await asyncio.sleep(self._retry_s)
            if self._stopped(batch):
                return  # not run: finalizing writes its line
        ended = lines.answered(line.custom_id, answer)
        self._store.record(
            batch.id, line.line, ended.result, failed=ended.failed, tokens=ended.tokens
        )

    def _finalize(self, batch: BatchRecord) -> None:
        now = int(time.time())
        if batch.status == "cancelling":
            final = "cancelled"
        elif now >= expires_at(batch):
            final = "expired"
        else:
            final = "completed"
        if batch.status == "in_progress":
            batch = self._store.move(batch.id, "finalizing", "finalizing_at", now)
            self._announce(batch.id)
        if final in UNRUN:
            code, message = UNRUN[final]
            self._store.close(
                batch.id,
                [
                    (ln.line, lines.unrun(ln.custom_id, ln.line, code, message))
                    for ln in self._store.pending(batch.id)
                ],
            )
        output, errors = self._files_of(batch)
        self._store.finish(batch.id, final, int(time.time()), output, errors)
        log.info("batch %s %s", batch.id, final)
        self._announce(batch.id)

    def _files_of(self, batch: BatchRecord) -> tuple[StoredFile | None, StoredFile | None]:
        """The output and error files (None where no line goes), on disk under ids the
        batch fixes: written again, the same, when finalizing runs again."""
        kept = self._store.lines(batch.id)
        made: list[StoredFile | None] = []
        for kind, failed in (("output", False), ("error", True)):
            chosen = [ln.result for ln in kept if ln.result is not None and ln.failed == failed]
            if not chosen:
                made.append(None)
                continue
            digest = hashlib.sha256(f"{batch.id}:{kind}".encode()).hexdigest()[:24]
            content = ("\n".join(chosen) + "\n").encode("utf-8")
            name = f"{batch.id}_{kind}.jsonl"
            made.append(self._files.written(f"file-{digest}", name, "batch_output", content))
        return made[0], made[1]


def _code(answer: Answer) -> str | None:
    try:
        error = json.loads(answer.body).get("error") or {}
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None
