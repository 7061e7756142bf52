"""The long-lived site worker (``fedstats.flower_apps.site_worker``) keeps serving when one task
fails in Flower's plumbing (e.g. ``ObjectPushError`` when a push session expired under load)."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

from fedstats.flower_apps import site_worker


class FakeRuntime:
    """A SuperNode's runtime API that hands out ``tasks`` tasks, then asks the worker to stop."""

    def __init__(self, tasks: int) -> None:
        self.tasks = tasks

    def AcquireTask(self, _request):  # Flower's name
        if self.tasks == 0:
            site_worker.STOP.set()
            return SimpleNamespace(HasField=lambda _: False, token="")
        self.tasks -= 1
        return SimpleNamespace(HasField=lambda name: name == "task", token=f"t{self.tasks}")

    def close(self) -> None:
        pass


def serve_fake(monkeypatch, runtime: FakeRuntime, run_task) -> None:
    """Serve ``runtime``'s tasks with ``run_task`` until it has none (the stop flag cleared
    before and after)."""
    monkeypatch.setattr(site_worker, "_client", lambda *a: runtime)
    monkeypatch.setattr(site_worker, "run_task", run_task)
    site_worker.STOP.clear()
    try:
        site_worker.serve("127.0.0.1:1", None, poll_interval=0.0)
    finally:
        site_worker.STOP.clear()


def test_a_task_that_fails_to_push_does_not_stop_the_worker(monkeypatch, caplog):
    ran: list[str] = []

    def run_task(_address, _certificates, token):
        ran.append(token)
        if len(ran) == 1:
            raise RuntimeError("Failed to push object: the push session may have expired")

    serve_fake(monkeypatch, FakeRuntime(tasks=3), run_task)
    assert ran == ["t2", "t1", "t0"]  # the tasks after the failed one were served
    assert "the site keeps serving" in caplog.text


def test_the_worker_logs_tasks_served_not_polls():
    """The HTTP client logs one INFO line per call, so one per poll (6,075 lines in 5.5
    minutes of an idle site): the worker keeps those to warnings, and its own task line."""
    import logging

    site_worker.configure_logging()
    for name in ("httpx", "httpcore"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
    assert site_worker.log.isEnabledFor(logging.INFO)


def test_a_stop_during_a_task_finishes_that_task_and_asks_for_no_more(monkeypatch):
    """SIGTERM while a reply is being answered (the handler runs inside ``run_task``): the
    task completes, no exception is raised into it, and the worker asks for no other task."""
    runtime = FakeRuntime(tasks=3)
    finished: list[str] = []

    def run_task(_address, _certificates, token):
        site_worker.request_stop(15, None)  # SIGTERM arrives mid-task
        finished.append(token)

    serve_fake(monkeypatch, runtime, run_task)
    assert finished == ["t2"] and runtime.tasks == 2  # one task, answered in full


def test_retries_give_up_and_waits_end_once_a_stop_is_asked():
    """Flower's HTTP retry invoker retries an unreachable SuperNode for ever, waiting up to
    20 s; made stop-aware, a failure after the stop is raised at once."""
    import threading
    import time

    import httpx
    from flwr.supercore.retry import make_simple_http_retry_invoker

    stop = threading.Event()
    invoker = site_worker.stop_aware(make_simple_http_retry_invoker(), stop)
    calls: list[float] = []

    def unreachable():
        calls.append(time.monotonic())
        if len(calls) == 2:
            threading.Timer(0.2, stop.set).start()  # the stop comes during the next wait
        raise httpx.ConnectError("Connection refused")

    started = time.monotonic()
    try:
        invoker.invoke(unreachable)
    except httpx.ConnectError:
        pass
    else:
        raise AssertionError("the invoker returned without a reply")
    assert stop.is_set() and time.monotonic() - started < 5.0, len(calls)


def refused(status: int = 401) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/runtime/send-task-heartbeat")
    response = httpx.Response(status, request=request)
    return httpx.HTTPStatusError(f"{status}", request=request, response=response)


def test_a_refused_task_token_fails_the_call_and_never_signals_the_worker():
    """Flower's HTTP retry invoker answers a 401 by sending its own process SIGINT (and
    sleeping 6 s), which stops a long-lived worker: a heartbeat that reached the SuperNode
    just after its task's output stopped a site mid-study. Made stop-aware, the invoker
    raises the 401 at once, and the worker's stop flag stays clear."""
    import signal
    import threading
    import time

    from flwr.supercore.retry import make_simple_http_retry_invoker

    stop = threading.Event()
    invoker = site_worker.stop_aware(make_simple_http_retry_invoker(), stop)
    signals: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, _frame: signals.append(number))
    started = time.monotonic()
    try:
        with pytest.raises(httpx.HTTPStatusError):
            invoker.invoke(lambda: (_ for _ in ()).throw(refused()))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert signals == [] and not stop.is_set()
    assert time.monotonic() - started < 1.0


def test_a_heartbeat_refused_after_its_task_ended_is_quiet():
    calls: list[str] = []

    class Client:
        def __init__(self, status: int) -> None:
            self.status = status

        def SendTaskHeartbeat(self, _request):  # Flower's name
            calls.append("heartbeat")
            raise refused(self.status)

    quiet, loud = site_worker.task_heartbeat(Client(401)), site_worker.task_heartbeat(Client(500))
    assert quiet() is True and loud() is True and calls == []  # the claim made the token live
    assert quiet() is True
    with pytest.raises(httpx.HTTPStatusError):  # any other refusal is Flower's to handle
        loud()
    assert calls == ["heartbeat", "heartbeat"]


def test_heartbeats_end_before_the_task_output_ends_its_token(monkeypatch):
    """The task's heartbeat thread is stopped (and a heartbeat in flight awaited) before
    the output is pushed, whether the ClientApp answered or raised."""
    events: list[str] = []

    class Heartbeat:
        def __init__(self, _fn) -> None:
            self.is_running = False

        def start(self) -> None:
            self.is_running = True
            events.append("heartbeat started")

        def stop(self) -> None:
            self.is_running = False
            events.append("heartbeat stopped")

    client = SimpleNamespace(close=lambda: events.append("closed"))
    run = SimpleNamespace(fab_id=f"fedstats/{site_worker.FEDSTATS_APP_NAME}")
    message = SimpleNamespace(metadata=SimpleNamespace())
    monkeypatch.setattr(site_worker, "_client", lambda *a: client)
    monkeypatch.setattr(site_worker, "HeartbeatSender", Heartbeat)
    monkeypatch.setattr(site_worker, "pull_task_input", lambda c: (message, "ctx", run, None))
    monkeypatch.setattr(site_worker, "push_message", lambda *a: events.append("reply pushed"))
    monkeypatch.setattr(site_worker, "push_task_output", lambda *a: events.append("output pushed"))
    monkeypatch.setattr(site_worker, "site_client_app", lambda message, context: "reply")
    site_worker.run_task("127.0.0.1:1", None, "token")
    assert events == [
        "heartbeat started",
        "reply pushed",
        "heartbeat stopped",
        "output pushed",
        "closed",
    ]

    events.clear()

    def fails(**_kwargs):
        raise RuntimeError("the ClientApp raised")

    monkeypatch.setattr(site_worker, "site_client_app", fails)
    monkeypatch.setattr(site_worker, "Message", lambda *a, **k: "error reply")
    site_worker.run_task("127.0.0.1:1", None, "token")
    assert events.index("heartbeat stopped") < events.index("output pushed")
