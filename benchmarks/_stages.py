"""Where a batch's time goes, stage by stage (``latency.py --stages``).

Imported by ``_traced.py`` when ``ASKWRIGHT_BENCH_STAGES`` names a file: it
wraps the steps of the answers' path (nothing of what they do changes) and
writes one JSON line per batch that held events, each stage a
``perf_counter`` time:

  arrived   appservice mode: the transaction's request came in (the stages
            of a sync, up to ``asked``, are bot mode's)
  headers   the sync's response headers are in (nio starts reading the body)
  parsed    the body read and parsed: into the bridge's ``SyncBatch``, or
            with encryption into nio's ``SyncResponse``
  received  nio's own handling of it done (``receive_response``)
  synced    ``sync_batch`` returned (the time ``_traced.py`` notes)
  handle    ``SyncLoop._handle`` started on the batch (appservice mode:
            ``TransactionServer._process``, the transactions' lock held)
  feeding   appservice mode: ``TransactionServer._feed`` (screening, with encryption)
  preparing ``Pipeline.prepare`` started (files fetched from here)
  prepared  ``Pipeline.prepare`` done (files fetched)
  job       the batch's job started on the store's thread
  judged    judging done (the batch's store transaction ends, ``flush`` starts)
  update    answers.json's update started (``AnswersFile.update``)
  writing   the new bytes made, the temp file about to be written
  tempsynced the temp file written and fsynced
  replaced  answers.json renamed into place (what the bench's watcher sees)
  committed the transport's commit ran (the sync token)
  ahead     bot mode: the event loop asks for the next long poll
            (``_ask_ahead`` called; the store's thread meanwhile makes the COMMIT)
  asked     ... and has asked for it
  jobdone   the job returned
  handled   ``_handle`` returned on the event loop

Each batch's line also lists its waits for the database (``waits``:
milliseconds and the statements sent together, in order; on SQLite each
statement alone), so a stage's time can be told apart into the store's
and the rest.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

from nio import AsyncClient, SyncResponse

_out = open(os.environ["ASKWRIGHT_BENCH_STAGES"], "a", buffering=1)
_by_token: dict[str, dict[str, float]] = {}  # a sync response's stages, by its next_batch
_batch: dict[str, Any] = {}  # the batch being handled
_last = {"handled": 0.0}  # when the batch before was handled


# ASKWRIGHT_BENCH_STAGES_PROFILE=PREFIX: cProfile (wall clock) over each
# batch's job on the store's thread, and over the sync loop asking ahead,
# written to PREFIX-job.prof and PREFIX-ahead.prof at exit.
_PROFILE = os.environ.get("ASKWRIGHT_BENCH_STAGES_PROFILE", "")
_profiles: dict[str, Any] = {}


def _profile(name: str) -> Any:
    if not _PROFILE:
        return None
    if name not in _profiles:
        import atexit
        import cProfile

        _profiles[name] = cProfile.Profile(time.perf_counter)
        atexit.register(lambda: _profiles[name].dump_stats(f"{_PROFILE}-{name}.prof"))
    return _profiles[name]


def _mark(name: str) -> None:
    if _batch:
        _batch["stages"].setdefault(name, time.perf_counter())


_JOB = {"on": False}
_LOOP_WORK: dict[str, list[float]] = {}  # ASKWRIGHT_BENCH_LOOP_WORK: what the loop ran during batch jobs


def _watch_loop(path: str) -> None:
    """What the event loop runs while a batch's job is on the store's thread
    (the two share the interpreter lock): each callback's time, by name."""
    import asyncio.events
    import atexit

    run = asyncio.events.Handle._run

    def traced_run(self: Any) -> None:
        if not _JOB["on"]:
            return run(self)
        start = time.perf_counter()
        try:
            return run(self)
        finally:
            callback = getattr(self._callback, "__self__", None)
            coro = getattr(callback, "get_coro", lambda: None)()
            name = getattr(coro, "__qualname__", None) or repr(self._callback)[:80]
            _LOOP_WORK.setdefault(name, []).append((time.perf_counter() - start) * 1000)

    asyncio.events.Handle._run = traced_run  # type: ignore[method-assign]

    def dump() -> None:
        with open(path, "w") as out:
            for name, times in sorted(_LOOP_WORK.items(), key=lambda kv: -sum(kv[1])):
                out.write(f"{sum(times):9.1f} ms {len(times):6d} calls  {name}\n")
    atexit.register(dump)


def _trace_waits() -> None:
    """Each round trip a batch's job makes to PostgreSQL: its time and what went out."""
    from bridge.service.storage import pgdialect

    def record(texts: list[str], start: float) -> None:
        if _JOB["on"] and _batch:
            _batch.setdefault("waits", []).append([round((time.perf_counter() - start) * 1000, 3),
                                                   [" ".join(t.split())[:70] for t in texts]])

    run, pipelined = pgdialect.PgConnection._run, pgdialect.PgConnection._pipelined

    def traced_run(self: Any, text: str, params: Any, **kwargs: Any) -> Any:
        if self._deferred:  # sent by _pipelined, traced there
            return run(self, text, params, **kwargs)
        start = time.perf_counter()
        try:
            return run(self, text, params, **kwargs)
        finally:
            record([text], start)

    def traced_pipelined(self: Any, statements: Any) -> Any:
        start = time.perf_counter()
        try:
            return pipelined(self, statements)
        finally:
            record([s[0] for s in statements], start)

    pgdialect.PgConnection._run = traced_run  # type: ignore[method-assign]
    pgdialect.PgConnection._pipelined = traced_pipelined  # type: ignore[method-assign]

    # On SQLite, each statement of a batch's job alone, with its milliseconds
    # (``waits`` has the same shape on both; PostgreSQL's are traced above).
    from bridge.service.storage.storethread import _Gated

    def one_statement(call: Any) -> Any:
        def traced(self: Any, sql: str, params: Any = ()) -> Any:
            start = time.perf_counter()
            try:
                return call(self, sql, params)
            finally:
                if not hasattr(self._db, "reads"):
                    record([sql], start)
        return traced

    reads = _Gated.reads

    def traced_reads(self: Any, statements: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return reads(self, statements, **kwargs)
        finally:
            if not hasattr(self._db, "reads"):
                record([s[0] for s in statements] + (["COMMIT"] if kwargs.get("commit") else []), start)

    _Gated.execute = one_statement(_Gated.execute)  # type: ignore[method-assign]
    _Gated.defer = one_statement(_Gated.defer)  # type: ignore[method-assign]
    _Gated.reads = traced_reads  # type: ignore[method-assign]


def _trace_gc() -> None:
    """Each garbage collection while a batch is handled: its generation and milliseconds."""
    import gc

    started: dict[str, float] = {}

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started["at"] = time.perf_counter()
        elif _batch and "at" in started:
            took = (time.perf_counter() - started.pop("at")) * 1000
            if took > 1:
                _batch.setdefault("gc", []).append([info.get("generation"), round(took, 2)])

    gc.callbacks.append(callback)


def _trace_transactions() -> None:
    """Appservice mode: a transaction's batch, from its request's arrival
    (``arrived``) and its turn to be handled (``handle``, after any
    transaction before it) to ``handled``, with the same stages between."""
    from bridge.service.transport.appservice import TransactionServer

    arrivals: dict[str, float] = {}
    transaction, process = TransactionServer.transaction, TransactionServer._process

    async def traced_transaction(self: TransactionServer, request: Any) -> Any:
        arrivals[request.match_info.get("txn_id", "")] = time.perf_counter()
        try:
            return await transaction(self, request)
        finally:
            arrivals.pop(request.match_info.get("txn_id", ""), None)

    async def traced_process(self: TransactionServer, txn_id: str, events: list[Any], *args: Any) -> Any:
        if not events:
            return await process(self, txn_id, events, *args)
        _batch.clear()
        _batch.update(ids=[e.get("event_id") for e in events if isinstance(e, dict)], txn=txn_id,
                      stages={"arrived": arrivals.get(txn_id, time.perf_counter())}, before=_last["handled"])
        _mark("handle")
        try:
            return await process(self, txn_id, events, *args)
        finally:
            _mark("handled")
            _last["handled"] = _batch["stages"]["handled"]
            _out.write(json.dumps(_batch) + "\n")
            _batch.clear()

    feed = TransactionServer._feed

    async def traced_feed(self: Any, *args: Any, **kwargs: Any) -> Any:
        _mark("feeding")
        return await feed(self, *args, **kwargs)

    TransactionServer._feed = traced_feed  # type: ignore[method-assign]
    TransactionServer.transaction = traced_transaction  # type: ignore[method-assign]
    TransactionServer._process = traced_process  # type: ignore[method-assign]


def install() -> None:
    if os.environ.get("ASKWRIGHT_BENCH_LOOP_WORK"):
        _watch_loop(os.environ["ASKWRIGHT_BENCH_LOOP_WORK"])
    from bridge.answers import file as answers_file
    from bridge.service.answering.pipeline import Pipeline
    from bridge.service.storage.storethread import StoreThread
    from bridge.service.transport import bot
    from bridge.service.transport.bot import SyncLoop
    from bridge.service.transport.syncbatch import SyncBatch

    create = AsyncClient.create_matrix_response

    async def create_matrix_response(self: AsyncClient, response_class: type, *args: Any, **kwargs: Any) -> Any:
        headers = time.perf_counter()
        response = await create(self, response_class, *args, **kwargs)
        if isinstance(response, (SyncResponse, SyncBatch)):
            response._stages = {"headers": headers, "parsed": time.perf_counter()}
        return response

    AsyncClient.create_matrix_response = create_matrix_response  # type: ignore[method-assign]

    receive = AsyncClient.receive_response

    async def receive_response(self: AsyncClient, response: Any) -> None:
        await receive(self, response)
        stages = getattr(response, "_stages", None)
        if stages is not None:
            stages["received"] = time.perf_counter()
            _by_token[response.next_batch] = stages
            while len(_by_token) > 50:
                _by_token.pop(next(iter(_by_token)))

    AsyncClient.receive_response = receive_response  # type: ignore[method-assign]

    sync = bot.sync_batch

    async def traced_sync(*args: Any, **kwargs: Any) -> Any:
        response = await sync(*args, **kwargs)
        stages = _by_token.get(getattr(response, "next_batch", None) or "")
        if stages is not None:
            stages["synced"] = time.perf_counter()
        return response

    bot.sync_batch = traced_sync  # type: ignore[assignment]

    ask_ahead = SyncLoop._ask_ahead

    async def traced_ask_ahead(self: SyncLoop, since: str, *args: Any) -> Any:
        ours = _batch.get("token") == since  # asked from the batch being handled
        if ours:
            _mark("ahead")
        profile = _profile("ahead")
        if profile is not None:
            profile.enable()
        try:
            return await ask_ahead(self, since, *args)
        finally:
            if profile is not None:
                profile.disable()
            if ours:
                _mark("asked")

    SyncLoop._ask_ahead = traced_ask_ahead  # type: ignore[method-assign]

    handle = SyncLoop._handle

    async def traced_handle(self: SyncLoop, events: list[dict[str, Any]], token: str | None = None,
                            then: Any = None, **more: Any) -> None:
        if not events or token is None:
            return await handle(self, events, token, then, **more)
        _batch.clear()
        _batch.update(ids=[e.get("event_id") for e in events], stages=dict(_by_token.get(token, {})),
                      before=_last["handled"], token=token)
        _mark("handle")
        try:
            await handle(self, events, token, then, **more)
        finally:
            _mark("handled")
            _last["handled"] = _batch["stages"]["handled"]
            _out.write(json.dumps(_batch) + "\n")
            _batch.clear()

    SyncLoop._handle = traced_handle  # type: ignore[method-assign]
    _trace_transactions()

    prepare = Pipeline.prepare

    async def traced_prepare(self: Pipeline, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        _mark("preparing")
        judged = await prepare(self, events)
        _mark("prepared")
        return judged

    Pipeline.prepare = traced_prepare  # type: ignore[method-assign]

    job = StoreThread._job

    def traced_job(self: StoreThread, fn: Any, *args: Any, **kwargs: Any) -> Any:
        batch = getattr(fn, "__name__", "") == "process"
        if batch:
            _JOB["on"] = True
            _mark("job")
            commit = kwargs.get("commit")
            if commit is not None:
                def marked_commit() -> None:
                    commit()
                    _mark("committed")
                kwargs["commit"] = marked_commit
        profile = _profile("job") if batch else None
        if profile is not None:
            profile.enable()
        try:
            return job(self, fn, *args, **kwargs)
        finally:
            if profile is not None:
                profile.disable()
            if batch:
                _JOB["on"] = False
                _mark("jobdone")

    StoreThread._job = traced_job  # type: ignore[method-assign]
    _trace_waits()
    _trace_gc()

    flush = Pipeline.flush

    @functools.wraps(flush)
    def traced_flush(self: Pipeline, *args: Any, **kwargs: Any) -> int:
        _mark("judged")
        return flush(self, *args, **kwargs)

    Pipeline.flush = traced_flush  # type: ignore[method-assign]

    update = answers_file.AnswersFile.update

    def traced_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        _mark("update")
        return update(self, *args, **kwargs)

    answers_file.AnswersFile.update = traced_update  # type: ignore[method-assign]

    atomic = answers_file.replace_whole

    def traced_atomic(path: Any, data: bytes) -> None:
        _mark("writing")
        atomic(path, data)

    answers_file.replace_whole = traced_atomic  # type: ignore[assignment]

    fsync = os.fsync

    def traced_fsync(fd: int) -> None:
        fsync(fd)
        if "writing" in _batch.get("stages", {}):
            _mark("tempsynced")

    answers_file.os.fsync = traced_fsync  # type: ignore[attr-defined]

    replace = os.replace

    def traced_replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        replace(src, dst, *args, **kwargs)
        if str(dst).endswith("answers.json"):
            _mark("replaced")

    answers_file.os.replace = traced_replace  # type: ignore[attr-defined]
