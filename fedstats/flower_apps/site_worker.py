"""A long-lived ClientApp runner for a site's SuperNode (``--isolation process``).

Under Flower's default isolation the SuperNode starts ``flower-superexec``,
which starts one ``flwr-clientapp`` process per message: each one imports
fedstats, reads the site's frame and opens its ledger again (seconds per
message). With ``flower-supernode --isolation process`` Flower leaves the
running of ClientApps to a separate process; this is one. It asks the
SuperNode's Runtime API for work (``AcquireTask``), and for each task uses
Flower's own ClientApp runtime functions (``pull_task_input``,
``push_message``, ``push_task_output`` and the task heartbeat) to fetch the
message, answer it with the fedstats ClientApp loaded once (and the site's
silo kept in memory) and push the reply.

It runs only the fedstats ClientApp of the installed package, whatever app a
run names: a run of another Flower App is answered with an error reply.

Run it beside the SuperNode::

    python -m fedstats.flower_apps.site_worker --runtime-api-address 127.0.0.1:9094

SIGTERM or SIGINT stops it promptly (:data:`STOP_WITHIN` seconds at most): a poll of
the SuperNode in flight is abandoned, a task being answered is finished (its
reply pushed) unless the SuperNode is gone, no retry waits any longer, and the
worker closes its connection and exits with :data:`EXIT_STOPPED` (0). Flower's
HTTP retries would otherwise wait for a stopped SuperNode for ever, and a poll
of a SuperNode that no longer answers holds for the client's 30 s timeout.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import httpx
from flwr.app import Context, Error, Message
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
from flwr.proto.node_pb2 import Node
from flwr.proto.runtime_pb2 import AcquireTaskRequest, PullAppMessagesRequest, PullTaskInputRequest
from flwr.supercore.constant import TaskType
from flwr.supercore.fab import Fab
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import RetryInvoker, make_simple_http_retry_invoker
from flwr.supercore.run import Run
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.tls import validate_and_resolve_root_certificates
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from fedstats.flower.study_pace import (
    ACTIVE_POLL_CAP,
    IDLE_POLL_INTERVAL,
    OBJECT_PULL_BACKOFF,
    StudyPace,
)
from fedstats.flower.task_wakeup import WakeReceiver
from fedstats.flower_apps.site_app import app as site_client_app
from fedstats.flower_apps.site_app import close_services

FEDSTATS_APP_NAME = "fedstats-study"
WOKEN_POLL_CAP = 0.5
"""The longest wait between the worker's own asks while a study is active, when its SuperNode
wakes it for every task (the asks only guard against a lost wake-up)."""
EXIT_STOPPED = 0
"""The worker's exit code after SIGTERM or SIGINT (argument errors exit 2, as argparse's)."""
STOP_WITHIN = 2.0
"""Seconds within which the worker exits after SIGTERM while idle or with its SuperNode gone
(``tests/flower/test_site_worker_stop.py``)."""
log = logging.getLogger(__name__)

STOP = threading.Event()
"""Set by SIGTERM or SIGINT: ask for no more tasks, retry nothing, exit."""


class _Polling:
    """Whether the worker is between tasks (polling or waiting): a stop abandons that at once."""

    now = False


class StopRequested(BaseException):
    """Raised by the signal handler into a poll or wait, to abandon it (not an ``Exception``:
    no ``except Exception`` of the HTTP client or the retry loop swallows it)."""


def token_refused(error: BaseException) -> bool:
    """Whether ``error`` is the SuperNode refusing a task token (HTTP 401): the task it
    belonged to has ended or was taken back, and no retry can make the token valid again."""
    return (
        isinstance(error, httpx.HTTPStatusError)
        and error.response.status_code == httpx.codes.UNAUTHORIZED
    )


def stop_aware(invoker: RetryInvoker, stop: threading.Event = STOP) -> RetryInvoker:
    """Flower's HTTP retry invoker, made to give up once ``stop`` is set, and at once on a
    refused task token.

    Flower's invoker retries an unreachable SuperNode with no limit of tries or
    time and waits up to 20 s between tries; a worker asked to stop must not.
    Its waits end when ``stop`` is set, and a failure after that is not retried.

    On HTTP 401 Flower's invoker sends its own process SIGINT and sleeps 6 s: right for
    a ``flwr-clientapp`` that lives for one task, but this worker serves every task of the
    site, and SIGINT stops it. A heartbeat that reached the SuperNode just after the task's
    output (a loaded machine delays the heartbeat thread) did stop a site mid-study. Here a
    refused token fails only the call that carried it (:func:`token_refused`); the task
    fails, if it was still running, and the worker keeps serving
    (``tests/flower/test_site_worker.py``).
    """
    giveup = invoker.should_giveup

    def should_giveup(error: Exception) -> bool:
        if stop.is_set() or token_refused(error):
            return True
        return giveup is not None and giveup(error)

    invoker.should_giveup = should_giveup
    invoker.wait_function = stop.wait
    return invoker


def _client(address: str, certificates: bytes | None, token: str | None) -> RuntimeHttpClient:
    interceptors = [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp")]
    if token is not None:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=certificates is None,
        root_certificates=certificates,
        interceptors=interceptors,
        retry_invoker=stop_aware(make_simple_http_retry_invoker()),
    )


def pull_task_input(client: RuntimeHttpClient) -> tuple[Message, Context, Run, Fab]:
    """Flower's ``pull_task_input``, with ``OBJECT_PULL_BACKOFF`` between object pulls.

    The SuperNode offers a task before it holds the message's objects; Flower's
    ``pull_task_input`` then waits 1 s before its second try (``PULL_INITIAL_BACKOFF``).
    """
    response = client.PullTaskInput(PullTaskInputRequest())
    context = context_from_proto(response.context)
    run = run_from_proto(response.run)
    fab = fab_from_proto(response.fab)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("the SuperNode offered a task without a message")
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    first, cap = OBJECT_PULL_BACKOFF
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(
            client.ConfirmMessageReceived, node, context.run_id
        ),
        return_type=Message,
        initial_backoff=first,
        backoff_cap=cap,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id
    return message, context, run, fab


def run_task(address: str, certificates: bytes | None, token: str) -> None:
    """Fetch one task's message, answer it with the fedstats ClientApp, push the reply."""
    started = time.perf_counter()
    client = _client(address, certificates, token)
    heartbeat = HeartbeatSender(task_heartbeat(client))
    heartbeat.start()
    context = None
    sub_status, details = SubStatus.FAILED, "the fedstats ClientApp failed"
    try:
        message, context, run, _fab = pull_task_input(client)
        pulled = time.perf_counter()
        if run.fab_id.split("/")[-1] != FEDSTATS_APP_NAME:
            reason = f"this site runs only the fedstats study app, not {run.fab_id!r}"
            reply = Message(Error(code=ErrorCode.UNKNOWN, reason=reason), reply_to=message)
        else:
            try:
                reply = site_client_app(message=message, context=context)
                sub_status, details = SubStatus.COMPLETED, ""
            except Exception as error:
                log.exception("the fedstats ClientApp raised")
                reason = f"{type(error).__name__}: {error}"
                code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
                reply = Message(Error(code=code, reason=reason), reply_to=message)
        answered = time.perf_counter()
        push_message(client, reply, context)
        log.info(
            "task: pulled in %.3f s, answered in %.3f s, pushed in %.3f s",
            pulled - started,
            answered - pulled,
            time.perf_counter() - answered,
        )
    finally:
        # heartbeats end before the task's output is pushed, which ends its token: one sent
        # after that would be refused (HTTP 401)
        stop_heartbeat(heartbeat)
        push_task_output(client, context, sub_status, details)
        client.close()


def task_heartbeat(client: RuntimeHttpClient) -> Callable[[], bool]:
    """Flower's task heartbeat over ``client``, from its second beat, quiet once the task's
    token is refused.

    Flower's heartbeat thread beats at once, then every 17.5 to 22.5 s. The first beat is
    not sent: claiming the task made its token live for ``HEARTBEAT_DEFAULT_INTERVAL``
    (30 s) and pulling its input for twice that (Flower's task state), so a task answered
    in milliseconds, as a Newton step is, costs one HTTP call fewer, and a long one (a deep
    model's local training) is still kept alive by the beats that follow. A refused token
    (:func:`token_refused`) means the task is over: the heartbeat has nothing left to keep
    alive, so it reports success instead of raising in its thread.
    """
    send = make_task_heartbeat_fn_http(client)
    beats = 0

    def heartbeat() -> bool:
        nonlocal beats
        beats += 1
        if beats == 1:
            return True
        try:
            return send()
        except httpx.HTTPStatusError as error:
            if token_refused(error):
                log.debug("task heartbeat refused: the task has ended")
                return True
            raise

    return heartbeat


def stop_heartbeat(heartbeat: HeartbeatSender) -> None:
    """Stop ``heartbeat`` and wait for a heartbeat in flight (its thread may have ended on
    an error of its own, which Flower's ``stop`` refuses to stop)."""
    if heartbeat.is_running:
        heartbeat.stop()


def request_stop(_signal: int, _frame: FrameType | None) -> None:
    """SIGTERM/SIGINT: stop asking for tasks; abandon a poll or wait in progress."""
    STOP.set()
    if _Polling.now:
        _Polling.now = False
        raise StopRequested


def serve(
    address: str,
    certificates: bytes | None = None,
    poll_interval: float = 0.005,
    idle_interval: float | None = None,
    wake_pipe: Path | None = None,
) -> None:
    """Answer tasks from the SuperNode at ``address`` until SIGTERM or SIGINT (module docstring).

    Asks ``poll_interval`` seconds after a task served, the wait doubling up to
    ``ACTIVE_POLL_CAP``; ``ACTIVE_WINDOW`` seconds after the last task, every
    ``idle_interval`` seconds (default ``IDLE_POLL_INTERVAL``): an idle site costs a
    fraction of a percent of a core (:class:`StudyPace`). With ``wake_pipe`` the SuperNode
    wakes the worker when a task has arrived with all its objects
    (:mod:`fedstats.flower.task_wakeup`): it asks at once then, and otherwise only every
    ``WOKEN_POLL_CAP`` seconds (a task found before it is stored whole would be pulled by
    retries).
    """
    receiver = None if wake_pipe is None else WakeReceiver(wake_pipe)
    idle = IDLE_POLL_INTERVAL if idle_interval is None else idle_interval
    if receiver is None:
        pace = StudyPace(poll_interval, cap=ACTIVE_POLL_CAP, idle=idle)
    else:  # woken when a task is stored whole: asking sooner would find it half there
        pace = StudyPace(WOKEN_POLL_CAP, cap=WOKEN_POLL_CAP, idle=idle)
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    client = _client(address, certificates, None)
    log.info("asking the SuperNode at %s for tasks", address)
    try:
        while not STOP.is_set():
            _Polling.now = True
            try:
                response = client.AcquireTask(
                    AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
                )
            except Exception as error:  # noqa: BLE001 - the SuperNode may be restarting
                if not STOP.is_set():
                    log.warning("cannot reach the SuperNode at %s: %s", address, error)
                STOP.wait(1.0)
                continue
            if response.HasField("task") and response.token:
                _Polling.now = False
                try:
                    run_task(address, certificates, response.token)
                except Exception:
                    # one task's failure must not stop the site, e.g. Flower's object push
                    # session expired under load: the coordinator gets no reply (a lost
                    # round, per its policy) and the site keeps serving
                    log.exception("a task could not be completed; the site keeps serving")
                pace.active()
                continue
            if receiver is None:
                STOP.wait(pace.interval())
            elif receiver.wait(pace.interval()):
                log.debug("woken by the SuperNode: a task is waiting")
    except StopRequested:
        pass
    finally:
        _Polling.now = False
        client.close()
        if receiver is not None:
            receiver.close()
    log.info("stopped on request")


QUIET_LOGGERS = ("httpx", "httpcore")
"""Loggers that write a line per HTTP call, so one per poll of the SuperNode: kept to warnings."""


def configure_logging() -> None:
    """One INFO line per task served (pull, answer, push times); polls are not logged (the
    HTTP client's own per-request lines are kept to warnings)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log.setLevel(logging.INFO)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> None:
    """Command line:
    ``python -m fedstats.flower_apps.site_worker --runtime-api-address HOST:PORT``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's HOST:PORT")
    parser.add_argument("--root-certificates", help="CA of the SuperNode's Runtime API (TLS)")
    parser.add_argument(
        "--poll-interval", type=float, default=0.005, help="first wait after a task (s)"
    )
    parser.add_argument(
        "--idle-interval", type=float, default=None, help="seconds between asks while idle"
    )
    parser.add_argument(
        "--wake-pipe", type=Path, default=None, help="the named pipe the SuperNode wakes it by"
    )
    args = parser.parse_args(argv)
    configure_logging()
    certificates = validate_and_resolve_root_certificates(
        args.root_certificates, args.root_certificates is None
    )
    serve(
        args.runtime_api_address,
        certificates,
        args.poll_interval,
        args.idle_interval,
        args.wake_pipe,
    )
    # every answer is journaled and every charge committed before its reply left: close the
    # ledgers and the log, then exit without the interpreter's teardown of pandas, SciPy and
    # the rest (a second or more on a loaded machine), so a stop takes well under STOP_WITHIN
    close_services()
    logging.shutdown()
    os._exit(EXIT_STOPPED)


if __name__ == "__main__":
    main()
