"""`collect` sends a member again after a failure that changed nothing at the server: a lost
connection, a gateway's 502, 503 or 504, the server's retry-later 503s. Over real loopback HTTP,
through a gateway in front of an in-process server that drops, resets, refuses and answers for
it; and which replies count as such a failure, from the server's own texts."""

from __future__ import annotations

import io
import json
import random
import socket
import struct
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import h11
import httpx
import pytest
import trio

from genrm_trio.collect._policy import PolicyClient
from genrm_trio.collect._resend import Backoff, error_resend, reply_resend
from genrm_trio.collect._resume import GroupPlan
from genrm_trio.collect._rows import VERIFY_FAILED, Task
from genrm_trio.collect._runner import Clients, GroupRunner, Sinks
from genrm_trio.core import messages
from genrm_trio.fakes.policy import FakePolicy, FakePolicyApp
from genrm_trio.http._spool import SpoolBudget, spool_failed
from genrm_trio.http.serving import over_limit_reply
from genrm_trio.store.redis_store import StoreContended, StoreFailed
from genrm_trio.testing.harness import Server, running_server
from genrm_trio.wire.rendering import error_body

N = 4
TASK = Task(3, 4, {"responses_create_params": {"input": "Name a prime. [[qualities=5,4,2,1]]"}})
# Short pauses: these tests count requests and read rows; the pauses' lengths are Backoff's own
# test below.
QUICK = Backoff(resends=8, first_s=0.01, max_s=0.05)
HAPROXY_503 = (
    b"<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this "
    b"request.\n</body></html>\n"
)
NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad "
    b"Gateway</h1></center>\r\n<hr><center>nginx/1.22.1</center>\r\n</body>\r\n</html>\r\n"
)


class Files:
    """The run's three files, in memory."""

    def __init__(self) -> None:
        self.output = io.BytesIO()
        self.failures = io.BytesIO()
        self.journal = io.BytesIO()

    def sinks(self) -> Sinks:
        return Sinks(self.output, self.failures, self.journal)

    @staticmethod
    def rows(sink: io.BytesIO) -> list[dict[str, Any]]:
        return [json.loads(line) for line in sink.getvalue().splitlines()]


# What the gateway does with the n-th request (from 0) it gets for a slot.
Plan = Callable[[int, int], str]


class Gateway:
    """An HTTP front on loopback, one request per connection, in front of a server reached over
    ASGI. Per request it forwards (``pass``), forwards and then closes without the reply
    (``lost``: the server has the member, the client does not know), closes without reading a
    reply (``close``), resets the connection (``reset``), or answers a status of its own."""

    def __init__(self, upstream: httpx.AsyncClient | None, plan: Plan) -> None:
        self.upstream = upstream
        self.plan = plan
        self.seen: Counter[int] = Counter()

    async def handle(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        request: h11.Request | None = None
        body = b""
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
        assert request is not None
        slot = json.loads(body)["_ng_rollout_index"]
        action = self.plan(slot, self.seen[slot])
        self.seen[slot] += 1
        if action == "reset":
            # SO_LINGER with a zero timeout: close() sends RST instead of FIN.
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            stream.socket.close()
            return
        if action == "close":
            await stream.aclose()
            return
        if action in ("pass", "lost"):
            assert self.upstream is not None
            reply = await self.upstream.post("/verify", content=body, headers=request.headers)
            if action == "lost":
                await stream.aclose()
                return
            status, content = reply.status_code, reply.content
        else:
            status = int(action)
            content = HAPROXY_503 if status == 503 else NGINX_502
        headers = [("content-length", str(len(content))), ("connection", "close")]
        data = connection.send(h11.Response(status_code=status, headers=headers))
        data += connection.send(h11.Data(data=content)) + connection.send(h11.EndOfMessage())
        await stream.send_all(data)
        await stream.aclose()


@asynccontextmanager
async def gateway_in_front(server: Server | None, plan: Plan) -> AsyncIterator[tuple[Gateway, str]]:
    gateway = Gateway(None if server is None else server.client, plan)
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        await nursery.start(trio.serve_listeners, gateway.handle, listeners)
        yield gateway, f"http://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


def runner_to(
    url: str, files: Files, backoff: Backoff, transport: httpx.AsyncBaseTransport | None = None
) -> GroupRunner:
    """A group runner whose members go to `url` over real HTTP, generated by the fake policy."""

    @asynccontextmanager
    async def connect() -> AsyncIterator[Clients]:
        policy_transport = httpx.ASGITransport(app=FakePolicyApp(FakePolicy(seed=1)))  # type: ignore[arg-type]
        async with (
            httpx.AsyncClient(transport=policy_transport, base_url="http://policy") as http,
            httpx.AsyncClient(base_url=url, transport=transport, trust_env=False) as server,
        ):
            yield Clients(PolicyClient(http, "http://policy/v1", retries=0), server)

    return GroupRunner(
        connect=connect,
        size=N,
        sinks=files.sinks(),
        verify_timeout_s=30,
        backoff=backoff,
        rng=random.Random(0),
    )


async def test_members_cut_off_at_the_gateway_are_resent_and_replayed_without_judging() -> None:
    # Every member's first request reaches the server and loses its reply; then slot 1 meets
    # two 502s, slot 2 a reset connection, slot 3 a gateway's 503 and a closed connection.
    after_loss = {0: [], 1: ["502", "502"], 2: ["reset"], 3: ["503", "close"]}

    def plan(slot: int, n: int) -> str:
        script = ["lost", *after_loss[slot]]
        return script[n] if n < len(script) else "pass"

    files = Files()
    async with (
        running_server(num_rollouts_per_prompt=N) as server,
        gateway_in_front(server, plan) as (gateway, url),
    ):
        runner = runner_to(url, files, QUICK)
        await runner.run_all([GroupPlan(TASK, "run-3", 0)], concurrency=1)
        verify_outcomes = dict(server.engine.metrics.verify_requests)
        calls = server.calls()
    rows = Files.rows(files.output)
    assert [r["_ng_rollout_index"] for r in rows] == list(range(N))
    assert files.failures.getvalue() == b""
    assert gateway.seen == {0: 2, 1: 4, 2: 3, 3: 4}
    assert runner.counts.resends == 1 + 3 + 2 + 3
    # The group was judged once, by the first deliveries; every resend was a replay.
    assert calls == N
    assert verify_outcomes == {"scored": N, "replayed": N}
    assert {r["_ng_group_id"] for r in rows} == {"run-3"}
    assert {r["_ng_group_attempt"] for r in rows} == {0}


async def test_a_gateway_that_keeps_failing_fails_the_rows_after_the_bound_with_its_reason() -> (
    None
):
    files = Files()
    async with gateway_in_front(None, lambda slot, n: "502") as (gateway, url):
        runner = runner_to(url, files, Backoff(resends=3, first_s=0.01, max_s=0.05))
        await runner.run_all([GroupPlan(TASK, "run-3", 0)], concurrency=1)
    failures = Files.rows(files.failures)
    assert [r["_ng_failure_class"] for r in failures] == [VERIFY_FAILED] * N
    assert gateway.seen == dict.fromkeys(range(N), 4)  # the first request and 3 resends each
    for row in failures:
        assert row["failure_reason"].startswith("POST /verify got no row after 3 resends in ")
        assert row["failure_reason"].endswith(
            "s; the last answered 502 from a gateway: <html> <head><title>502 Bad Gateway"
            "</title></head> <body> <center><h1>502 Bad Gateway</h1></center> <hr>"
            "<center>nginx/1.22.1</center> </body> </html>"
        )
    assert files.output.getvalue() == b""


async def test_without_resends_a_gateway_failure_is_the_rows_reason_at_once() -> None:
    files = Files()
    async with gateway_in_front(None, lambda slot, n: "503") as (gateway, url):
        runner = runner_to(url, files, Backoff(resends=0))
        await runner.run_all([GroupPlan(TASK, "run-3", 0)], concurrency=1)
    reasons = {r["failure_reason"] for r in Files.rows(files.failures)}
    assert reasons == {
        "POST /verify answered 503 from a gateway: <html><body><h1>503 Service Unavailable</h1>"
        " No server is available to handle this request. </body></html>"
    }
    assert gateway.seen == dict.fromkeys(range(N), 1)
    assert runner.counts.resends == 0


class RefusingUntil(httpx.AsyncBaseTransport):
    """Real HTTP to a loopback port that refuses connections until `refusals` have been
    refused, then starts listening (as a restarted server would)."""

    def __init__(self, refusals: int, start: Callable[[], None]) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.refusals = refusals
        self.refused = 0
        self.start = start

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self.inner.handle_async_request(request)
        except httpx.ConnectError:
            self.refused += 1
            if self.refused == self.refusals:
                self.start()
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_refused_connections_are_resent_until_the_server_listens() -> None:
    files = Files()
    bound = trio.socket.socket()
    await bound.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    port = bound.getsockname()[1]
    async with running_server(num_rollouts_per_prompt=N) as server, trio.open_nursery() as nursery:
        gateway = Gateway(server.client, lambda slot, n: "pass")

        def start() -> None:
            bound.listen(64)
            nursery.start_soon(trio.serve_listeners, gateway.handle, [trio.SocketListener(bound)])

        transport = RefusingUntil(refusals=6, start=start)
        runner = runner_to(f"http://127.0.0.1:{port}", files, QUICK, transport)
        await runner.run_all([GroupPlan(TASK, "run-3", 0)], concurrency=1)
        nursery.cancel_scope.cancel()
        calls = server.calls()
    assert [r["_ng_rollout_index"] for r in Files.rows(files.output)] == list(range(N))
    assert files.failures.getvalue() == b""
    assert transport.refused >= 6 and runner.counts.resends == transport.refused
    assert calls == N


# ---- which failures are sent again ---------------------------------------------------------

NO_HEADERS = httpx.Headers()


@pytest.mark.parametrize(
    ("status", "body"), [(502, NGINX_502), (503, HAPROXY_503), (504, b""), (503, b'{"x": 1}')]
)
def test_a_gateways_502_503_and_504_are_sent_again(status: int, body: bytes) -> None:
    resend = reply_resend(status, NO_HEADERS, body)
    assert resend is not None
    assert resend.problem.startswith(f"answered {status} from a gateway:")
    assert "\n" not in resend.problem and "\r" not in resend.problem


@pytest.mark.parametrize(
    "detail",
    [
        str(StoreFailed("redis://store:6379/0", "ConnectionRefusedError: refused")),
        str(StoreContended("redis://store:6379/0", "e:g", 32)),
        messages.SHUTTING_DOWN,
        spool_failed("cannot write to /spool: ENOSPC: No space left on device", SpoolBudget(1)),
    ],
)
def test_the_servers_503s_that_stored_nothing_are_sent_again(detail: str) -> None:
    resend = reply_resend(503, NO_HEADERS, error_body(detail))
    assert resend is not None and resend.problem == f"answered 503: {detail}"


def test_the_connection_limit_503_is_sent_again_no_sooner_than_it_asks() -> None:
    head, _, body = over_limit_reply(9000, 9352).partition(b"\r\n\r\n")
    headers = httpx.Headers([line.split(b": ", 1) for line in head.split(b"\r\n")[1:]])
    resend = reply_resend(503, headers, body)
    assert resend is not None and resend.retry_after_s == 1.0
    assert resend.problem.startswith("answered 503: server at its connection limit: 9000 client")
    backoff = Backoff()
    assert all(backoff.pause(1, random.Random(seed), 1.0) == 1.0 for seed in range(20))


@pytest.mark.parametrize(
    "detail",
    [
        messages.not_collected("group_id::g::group_attempt::0", 16, 1800.0),
        messages.superseded("g", 0, 1),
        messages.EVALUATION_CANCELLED,
        messages.conversion_failed(ValueError("bad input")),
        messages.evaluation_failed(RuntimeError("defect")),
    ],
)
def test_a_groups_failure_is_final(detail: str) -> None:
    # A resend of a failed group's member gets the same failure again (C-43).
    assert reply_resend(503, NO_HEADERS, error_body(detail)) is None


@pytest.mark.parametrize("status", [200, 400, 409, 413, 422, 500])
def test_other_statuses_are_final(status: int) -> None:
    assert reply_resend(status, NO_HEADERS, error_body("GenRM group store down")) is None


REQUEST = httpx.Request("POST", "http://server/verify")


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("[Errno 111] Connection refused", request=REQUEST),
        httpx.ReadError("[Errno 104] Connection reset by peer", request=REQUEST),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.WriteError("[Errno 32] Broken pipe", request=REQUEST),
        httpx.ConnectTimeout("timed out", request=REQUEST),
    ],
)
def test_lost_connections_are_sent_again(error: httpx.HTTPError) -> None:
    resend = error_resend(error)
    assert resend is not None
    assert resend.problem == f"failed: {type(error).__name__}: {error}"


@pytest.mark.parametrize(
    "error",
    [
        httpx.UnsupportedProtocol("Request URL has an unsupported protocol 'ftp://'."),
        httpx.LocalProtocolError("Illegal header value"),
        httpx.TooManyRedirects("Exceeded maximum allowed redirects."),
    ],
)
def test_requests_that_can_never_go_out_are_not_sent_again(error: httpx.HTTPError) -> None:
    assert error_resend(error) is None


def test_pauses_double_up_to_the_cap_and_spread_within_each_step() -> None:
    backoff = Backoff()  # the pauses collect.md documents: 0.25 s doubling to 8 s, 8 resends
    steps = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert backoff.resends == len(steps)
    rng = random.Random(7)
    for resend, step in enumerate(steps, start=1):
        pauses = [backoff.pause(resend, rng) for _ in range(200)]
        assert all(step / 2 <= p <= step for p in pauses)
        assert max(pauses) - min(pauses) > step / 4  # spread out, not in step
    # A Retry-After longer than the cap waits the cap: the bound on time holds.
    assert backoff.pause(1, rng, retry_after_s=120.0) == 8.0
