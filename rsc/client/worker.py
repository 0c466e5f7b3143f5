"""The listener API: an `App` whose listeners each run `concurrency` members with a built-in poller.

    app = App()

    @app.listener(stream="orders", group="billing", concurrency=4)
    async def handle(message: Message) -> None:
        ...

`rsc worker module:app` runs it until SIGINT/SIGTERM. Member ids are
`<instance>/<listener name>/<index>`, the instance being `RSC_INSTANCE_ID` (or
`App(instance_id=...)`, `rsc worker --instance-id`) if set, else the pod IP from
`POD_IP` (Kubernetes: one worker process per pod), else `<host name>-<pid>`, so
that several worker processes on one host are distinct members; all members of
the process heartbeat together through `POST /v1/heartbeats`. With an explicit
instance id (`RSC_INSTANCE_ID`, `instance_id=`, `--instance-id`) the members are
*static* (`static=` / `--static` / `RSC_STATIC` decide otherwise): the id is a
stable identity, so a restarted process gets its shards back and a replacement
takes over a crashed one at once (docs/consumers.md, "Rolling restarts and
static membership"). The coordinator URL and Redis URL come from the
arguments, else `RSC_COORDINATOR_URL` / `RSC_REDIS_URL`; several
coordinators (active and standby) are a list or one comma-separated string; the member
credential and the CA bundle of an `https://` coordinator from the
arguments, else `RSC_TOKEN` / `RSC_CA_BUNDLE`.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import uuid
from collections.abc import Callable, Sequence

import attrs
import trio
from prometheus_client import start_http_server

from rsc.client.batching import BatchingTransport
from rsc.client.coordinator import Coordinator, coordinator_urls
from rsc.client.errors import MemberReplaced
from rsc.client.member import Member, MemberSettings, coordinator_outage
from rsc.client.poller import Handler, Poller, PollerSettings, RedisHealth
from rsc.client.worker_metrics import WorkerMetrics
from rsc.connect import DEFAULT_REDIS_URL, open_redis, redacted
from rsc.resp import Multiplexed, open_lean

log = logging.getLogger("rsc.client.worker")
DEFAULT_COORDINATOR_URL = "http://127.0.0.1:8080"
#: The request timeout with several coordinators: a stalled one (paused, partitioned) is left
#: for the next well within a member's lease (the single-URL default is 5 s).
FAILOVER_TIMEOUT_S = 2.0
#: Connect and command timeout of the data plane's Redis calls (none of them blocks in Redis).
REDIS_TIMEOUT_S = 5.0
#: Connections of the wake-up client (one per member on a standalone Redis, one per owned
#: hash slot and member on a cluster, per node): blocked reads each hold one.
WAKEUP_CONNECTIONS = 10_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$")


@attrs.frozen
class Listener:
    name: str
    stream: str
    group: str
    concurrency: int
    handler: Handler
    poller: PollerSettings


INSTANCE_ENV = "RSC_INSTANCE_ID"


def instance_id(given: str | None = None) -> str:
    """What a member id starts with: `given`, else `RSC_INSTANCE_ID`, else `POD_IP`, else
    `<host name>-<pid>` (unique per process on a host; a restarted process is a new member)."""
    chosen = given or os.environ.get(INSTANCE_ENV) or os.environ.get("POD_IP")
    if chosen:
        return chosen
    host = re.sub(r"[^A-Za-z0-9._:-]", "-", socket.gethostname()) or "host"
    return f"{host}-{os.getpid()}"


STATIC_ENV = "RSC_STATIC"


def static_members(given: bool | None = None, instance: str | None = None) -> bool:
    """Whether members are static: `given`, else `RSC_STATIC` (true/false), else whether the
    instance id is explicit (`instance` or `RSC_INSTANCE_ID`: a stable identity; a pod IP or
    `<host>-<pid>` is not). Raises `ValueError` when `RSC_STATIC` is set to neither."""
    if given is not None:
        return given
    flag = os.environ.get(STATIC_ENV, "").strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return True
    if flag in ("0", "false", "no", "off"):
        return False
    if flag:
        raise ValueError(f"{STATIC_ENV}={flag!r}: true or false")
    return bool(instance or os.environ.get(INSTANCE_ENV))


class App:
    def __init__(
        self,
        coordinator_url: str | Sequence[str] | None = None,
        redis_url: str | None = None,
        *,
        member_settings: MemberSettings | None = None,
        token: str | None = None,
        ca_bundle: str | None = None,
        instance_id: str | None = None,
        static: bool | None = None,
    ) -> None:
        self.coordinator_url = coordinator_url
        #: The start of every member id of this process (`instance_id()`).
        self.instance_id = instance_id
        #: Static members (None: when the instance id is explicit: `static_members()`).
        self.static = static
        self.redis_url = redis_url
        #: The member credential (default: RSC_TOKEN) and CA bundle (default: RSC_CA_BUNDLE).
        self.token = token
        self.ca_bundle = ca_bundle
        self.member_settings = member_settings or MemberSettings()
        self.listeners: list[Listener] = []
        self.members: list[Member] = []
        self.pollers: list[Poller] = []
        #: The worker's own metrics (`serve_metrics`), None until asked for.
        self.metrics: WorkerMetrics | None = None
        #: Redis outages, logged once for the whole process.
        self.redis_health = RedisHealth("rsc worker")
        #: Coordinator outages, logged once for all the members of the process.
        self.coordinator_outage = coordinator_outage()
        self._stop = trio.Event()
        #: A member of this process was taken over by a newer process with its static id.
        self.replaced: MemberReplaced | None = None

    def listener(
        self,
        *,
        stream: str,
        group: str,
        concurrency: int = 1,
        name: str | None = None,
        poller: PollerSettings | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register `handler` for `stream`/`group`; `concurrency` member ids join the group.

        Raises `ValueError` when `concurrency` is below 1, or (decorating) when the listener name
        is not letters, digits, '.', '_', ':' and '-' (at most 100)."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")

        def register(handler: Handler) -> Handler:
            listener_name = name or handler.__name__.replace("_", "-")
            if not _NAME.fullmatch(listener_name):
                raise ValueError(f"listener name {listener_name!r}: letters, digits, '.', '_', ':', '-'")
            settings = poller or PollerSettings()
            self.listeners.append(Listener(listener_name, stream, group, concurrency, handler, settings))
            return handler

        return register

    def serve_metrics(self, port: int, host: str = "0.0.0.0") -> None:
        """Serve this worker's Prometheus metrics on `host:port` (`/metrics`, in a thread), from
        now on: call it before `run`, so that every member's handler is timed.

        Raises `OSError` when it cannot listen there (the port is taken, or not allowed)."""
        self.metrics = WorkerMetrics(self)
        start_http_server(port, host, registry=self.metrics.prometheus)

    def stop(self) -> None:
        """Leave gracefully: in-flight work finishes (bounded), revokes are acked, members leave."""
        self._stop.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every listener's members and pollers until `stop()`; `started` once all joined.

        Raises at start `ValueError` (`RSC_STATIC` or the coordinator URLs unusable),
        `CoordinatorUnavailable` (a CA bundle it cannot read), `rsc.connect.RedisUnreachable` or
        `RedisRefused` (Redis cannot be used: not retried; a database out of range comes inside
        an exception group).
        `MemberReplaced`, as itself, once the other members left. What ends a member or poller
        (`CoordinatorRejected`: a heartbeat refused for good, e.g. 401/403;
        `CoordinatorUnintelligible`; a lifecycle error) comes inside nested exception groups,
        the other members cancelled, not left."""
        coordinator_url = (
            self.coordinator_url or os.environ.get("RSC_COORDINATOR_URL") or DEFAULT_COORDINATOR_URL
        )
        redis_url = self.redis_url or os.environ.get("RSC_REDIS_URL") or DEFAULT_REDIS_URL
        ip = instance_id(self.instance_id)
        static = static_members(self.static, self.instance_id)
        self.member_settings = attrs.evolve(self.member_settings, static=static)
        if static and not (self.instance_id or os.environ.get(INSTANCE_ENV) or os.environ.get("POD_IP")):
            log.warning(
                "static members without an instance id (%s changes with every start): after a stop "
                "their shards wait the hold for ids that never come back; set RSC_INSTANCE_ID",
                ip,
            )
        shown = ", ".join(coordinator_urls(coordinator_url))
        kind = "static " if static else ""
        log.info("coordinator %s, Redis %s, %smember ids %s/...", shown, redacted(redis_url), kind, ip)
        async with (
            Coordinator(
                coordinator_url,
                timeout_s=_timeout_s(coordinator_url),
                token=self.token,
                ca_bundle=self.ca_bundle,
            ) as coordinator,
            # Timeouts: a hung Redis fails its commands (retried with backoff) instead of hanging them.
            open_redis(
                redis_url, connect_timeout_s=REDIS_TIMEOUT_S, command_timeout_s=REDIS_TIMEOUT_S
            ) as redis,
            # The pollers' blocking wake-up reads, on connections of their own: they never hold up
            # the commands above. Its timeout: the longest block, plus the usual one.
            open_redis(
                redis_url,
                connect_timeout_s=REDIS_TIMEOUT_S,
                command_timeout_s=self._wake_block_s() + REDIS_TIMEOUT_S,
                max_connections=WAKEUP_CONNECTIONS,
            ) as wake_client,
            # The pollers' scripts, on one lean connection they share (where there can be one).
            open_lean(redis) as lean,
            trio.open_nursery() as services,
        ):
            transport = BatchingTransport(coordinator)
            await services.start(transport.run)
            async with trio.open_nursery() as members:
                for listener in self.listeners:
                    for index in range(listener.concurrency):
                        await self._start_member(
                            members, services, transport, (redis, wake_client, lean), ip, listener, index
                        )
                task_status.started()
                await self._stop.wait()
                for member in self.members:
                    member.stop()
            services.cancel_scope.cancel()
        if self.replaced is not None:
            raise self.replaced

    def _wake_block_s(self) -> float:
        return max((listener.poller.wake_block_s for listener in self.listeners), default=0.0)

    async def _start_member(
        self,
        members: trio.Nursery,
        services: trio.Nursery,
        transport: BatchingTransport,
        clients: tuple[object, object, Multiplexed | None],
        ip: str,
        listener: Listener,
        index: int,
    ) -> None:
        member_id = f"{ip}/{listener.name}/{index}"
        incarnation = uuid.uuid4().hex
        redis, wake_client, lean = clients
        poller = Poller(
            redis,
            listener.group,
            member_id,
            incarnation,
            listener.handler,
            listener.poller,
            self.redis_health,
            wake_client,
            lean,
            stream=listener.stream,
        )
        if self.metrics is not None:
            latency = self.metrics.handler_seconds.labels(listener.stream, listener.group)
            poller.observe_handler = latency.observe
            poller.measure_lag = True
        await services.start(poller.run)
        member = Member(
            transport,
            listener.stream,
            listener.group,
            member_id,
            poller,
            incarnation=incarnation,
            settings=self.member_settings,
            outage=self.coordinator_outage,
        )
        await members.start(self._run_member, member)
        self.pollers.append(poller)
        self.members.append(member)
        log.info("member %s joins %s/%s", member_id, listener.stream, listener.group)

    async def _run_member(self, member: Member, *, task_status: trio.TaskStatus[None]) -> None:
        """Run `member`; if a newer process took its static id over, the process stops: its other
        members leave gracefully (not cancelled mid-handler), then `run` raises `MemberReplaced`."""
        try:
            await member.run(task_status=task_status)
        except MemberReplaced as exc:
            if self.replaced is None:
                self.replaced = exc
            self.stop()


def _timeout_s(coordinator_url: str | Sequence[str]) -> float:
    return FAILOVER_TIMEOUT_S if len(coordinator_urls(coordinator_url)) > 1 else 5.0
