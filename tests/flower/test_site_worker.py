"""The long-lived site worker (``fedstats.flower_apps.site_worker``) keeps serving when one task
fails in Flower's plumbing (e.g. ``ObjectPushError`` when a push session expired under load)."""

from __future__ import annotations

from types import SimpleNamespace

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


def test_a_task_that_fails_to_push_does_not_stop_the_worker(monkeypatch, caplog):
    ran: list[str] = []

    def run_task(_address, _certificates, token):
        ran.append(token)
        if len(ran) == 1:
            raise RuntimeError("Failed to push object: the push session may have expired")

    monkeypatch.setattr(site_worker, "_client", lambda *a: FakeRuntime(tasks=3))
    monkeypatch.setattr(site_worker, "run_task", run_task)
    site_worker.STOP.clear()
    try:
        site_worker.serve("127.0.0.1:1", None, poll_interval=0.0)
    finally:
        site_worker.STOP.clear()
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
