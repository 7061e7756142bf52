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
"""

from __future__ import annotations

import argparse
import logging
import signal
import time
from types import FrameType

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
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.run import Run
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.tls import validate_and_resolve_root_certificates
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from fedstats.flower_apps.site_app import app as site_client_app

FEDSTATS_APP_NAME = "fedstats-study"
OBJECT_PULL_BACKOFF = (0.005, 0.05)
"""First and largest wait (s) between tries to pull a message's objects from the SuperNode.

The SuperNode offers a task before it holds the message's objects; Flower's
``pull_task_input`` then waits 1 s before its second try (``PULL_INITIAL_BACKOFF``).
"""
log = logging.getLogger(__name__)


class _Stop:
    requested = False


def _client(address: str, certificates: bytes | None, token: str | None) -> RuntimeHttpClient:
    interceptors = [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp")]
    if token is not None:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=certificates is None,
        root_certificates=certificates,
        interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker(),
    )


def pull_task_input(client: RuntimeHttpClient) -> tuple[Message, Context, Run, Fab]:
    """Flower's ``pull_task_input``, with :data:`OBJECT_PULL_BACKOFF` between object pulls."""
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
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
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
        push_task_output(client, context, sub_status, details)
        heartbeat.stop()
        client.close()


def serve(address: str, certificates: bytes | None = None, poll_interval: float = 0.01) -> None:
    """Answer tasks from the SuperNode at ``address`` until SIGTERM or SIGINT."""

    def request_stop(_signal: int, _frame: FrameType | None) -> None:
        _Stop.requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    client = _client(address, certificates, None)
    try:
        while not _Stop.requested:
            try:
                response = client.AcquireTask(
                    AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
                )
            except Exception as error:  # noqa: BLE001 - the SuperNode may be restarting
                log.warning("cannot reach the SuperNode at %s: %s", address, error)
                time.sleep(1.0)
                continue
            if response.HasField("task") and response.token:
                try:
                    run_task(address, certificates, response.token)
                except Exception:
                    # one task's failure must not stop the site, e.g. Flower's object push
                    # session expired under load: the coordinator gets no reply (a lost
                    # round, per its policy) and the site keeps serving
                    log.exception("a task could not be completed; the site keeps serving")
                continue
            time.sleep(poll_interval)
    finally:
        client.close()


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
    parser.add_argument("--poll-interval", type=float, default=0.01, help="seconds between asks")
    args = parser.parse_args(argv)
    configure_logging()
    certificates = validate_and_resolve_root_certificates(
        args.root_certificates, args.root_certificates is None
    )
    serve(args.runtime_api_address, certificates, args.poll_interval)


if __name__ == "__main__":
    main()
