"""OpenTelemetry traces from publish to handler, with the SDK's in-memory exporter: a message
published inside a span is handled in a `process` span of the same trace (its parent the
`send` span), with the messaging attributes, through a redelivery and a dead-lettering; the
handler never sees the trace fields; a rebalance is a coordinator span. Without the API
nothing of OpenTelemetry is imported."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import attrs
import httpx
import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rsc import connect_producer, tracing
from rsc.client.member import MemberSettings
from rsc.client.poller import Message, PollerSettings
from rsc.client.worker import App
from tests.httpkit import FAST, serve_on

AUTH = ("admin", "pw")
EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> Iterator[None]:
    """One SDK provider for the process (OpenTelemetry sets it once), exporting to memory;
    tracing is turned off again for the other tests of the process."""
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        sdk = TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(sdk)
    tracing.enable(True)
    yield
    tracing.enable(False)
    EXPORTER.clear()


@pytest.fixture
async def http(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url, admin_password="pw")) as client:
        yield client


async def test_publish_to_handler_in_one_trace_through_a_retry_and_a_dead_letter(
    http: httpx.AsyncClient, standalone_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    EXPORTER.clear()
    monkeypatch.setattr(tracing, "HEARTBEAT_SAMPLE", 1)  # every heartbeat a span (100: one in 100)
    base = str(http.base_url)
    assert (await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)).is_success
    assert (await http.put(f"/v1/admin/streams/{prefix}/groups/g", json={}, auth=AUTH)).is_success
    seen: list[dict[str, str]] = []
    app = App(base, standalone_url, member_settings=MemberSettings(heartbeat_interval_ms=100))
    settings = PollerSettings(retry_after_ms=50, max_deliveries=2)

    @app.listener(stream=prefix, group="g", concurrency=1, name="g", poller=settings)
    async def handle(message: Message) -> None:
        seen.append(dict(message.fields))
        if message.fields["n"] == "bad":
            raise ValueError("poison")

    tracer = trace.get_tracer("test")
    async with trio.open_nursery() as nursery:
        await nursery.start(app.run)
        async with connect_producer(prefix, coordinator_url=base, redis_url=standalone_url) as producer:
            with tracer.start_as_current_span("request") as request:
                good = await producer.publish({"n": "good"}, "k1")
                await producer.publish({"n": "bad"}, "k2")
        with trio.fail_after(20):
            while not any(s.name == f"settle {prefix}" for s in EXPORTER.get_finished_spans()):
                await trio.sleep(0.05)
        app.stop()
    check_spans(EXPORTER.get_finished_spans(), request, prefix, good, seen)


def check_spans(spans: Any, request: Any, prefix: str, good: str, seen: list[dict[str, str]]) -> None:
    trace_id = request.get_span_context().trace_id
    sends = [s for s in spans if s.name == f"send {prefix}"]
    assert len(sends) == 2
    assert all(
        s.context.trace_id == trace_id and s.parent.span_id == request.get_span_context().span_id
        for s in sends
    )
    assert sends[0].attributes["messaging.system"] == "rsc"
    assert sends[0].attributes["messaging.message.id"] == good
    processes = [s for s in spans if s.name == f"process {prefix}"]
    assert len(processes) == 3  # good once, bad twice (a retry), then dead-lettered
    for span in processes:
        assert span.context.trace_id == trace_id
        assert span.parent.span_id in {s.context.span_id for s in sends}
        assert span.kind is trace.SpanKind.CONSUMER
        attributes = span.attributes
        assert attributes["messaging.consumer.group.name"] == "g"
        assert attributes["messaging.destination.name"] == prefix
        assert attributes["messaging.destination.partition.id"] in {"0", "1"}
    good_span = next(s for s in processes if s.attributes["messaging.message.id"] == good)
    assert good_span.status.is_ok
    failed = sorted(
        (s for s in processes if s.attributes["messaging.message.id"] != good),
        key=lambda s: s.attributes["messaging.rsc.message.delivery_count"],
    )
    assert [s.attributes["messaging.rsc.message.delivery_count"] for s in failed] == [1, 2]
    assert all(s.status.status_code is trace.StatusCode.ERROR for s in failed)
    settle = next(s for s in spans if s.name == f"settle {prefix}")
    assert settle.attributes["messaging.rsc.settle"] == "dead_letter"
    assert settle.context.trace_id == trace_id
    assert all(not any(k.startswith("rsc:") for k in fields) for fields in seen)  # stripped
    assert any(s.name == "heartbeats" and s.attributes["rsc.heartbeats"] >= 1 for s in spans)
    rebalances = [s for s in spans if s.name == f"rebalance {prefix}"]
    assert rebalances
    assert rebalances[0].attributes["messaging.consumer.group.name"] == "g"
    assert "rsc.group_epoch" in rebalances[0].attributes


def test_without_the_api_nothing_of_opentelemetry_is_imported() -> None:
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"  # as if the extra were not installed
        "import rsc.client.producer, rsc.client.sync, rsc.client.worker\n"
        "from rsc import tracing\n"
        "assert tracing.api() is None\n"
        "with tracing.send_span('s', 1) as carried: assert carried == {}\n"
        "assert tracing.split({'a': '1'}) == ({'a': '1'}, {})\n"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "ok", done.stderr


def test_turned_off_by_the_setting() -> None:
    code = "import os; os.environ['RSC_OTEL'] = '0'\nfrom rsc import tracing\nprint(tracing.api() is None)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "True", done.stderr
