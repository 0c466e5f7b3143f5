"""`rsc worker` processes against a real coordinator and Redis: join, kill -9, graceful stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import redis
import trio

from tests.httpkit import FAST, hb, serve_on
from tests.redis_servers import DurableServer, free_port

ROOT = Path(__file__).resolve().parents[2]


def start_worker(
    base_url: str,
    redis_url: str,
    prefix: str,
    ip: str | None,
    concurrency: int,
    log: Path | None = None,
    delay: float = 0.002,
    self_fence: bool = True,
    results_file: Path | None = None,
    record_order: bool = False,
    extra: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RSC_TEST_NO_SELF_FENCE": "0" if self_fence else "1",
        "RSC_TEST_DELAY": str(delay),
        "RSC_TEST_STREAM": prefix,
        "RSC_TEST_RESULTS": f"{prefix}:results",
        "RSC_TEST_CONCURRENCY": str(concurrency),
        "RSC_REDIS_URL": redis_url,
        "RSC_TEST_RESULTS_FILE": str(results_file or ""),
        "RSC_TEST_RECORD_ORDER": "1" if record_order else "0",
    }
    env.pop("POD_IP", None)
    env.pop("RSC_INSTANCE_ID", None)
    if ip is not None:  # None: as on a laptop, where member ids come from host name and pid
        env["POD_IP"] = ip
    command = [
        sys.executable,
        "-m",
        "rsc",
        "worker",
        "tests.workerapp:app",
        "--coordinator",
        base_url,
        *extra,
    ]
    if log is None:
        return subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
    with log.open("wb") as output:  # the child keeps its own descriptor
        return subprocess.Popen(command, env=env, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)


def stop_workers(workers: Sequence[subprocess.Popen[bytes]], timeout_s: float = 20) -> None:
    """SIGTERM each worker still running (they leave gracefully), then wait; kill what hangs."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def spread(client: Any, keys: Sequence[str], count: int) -> set[tuple[str, str]]:
    """XADD `count` entries round-robin over `keys`; their (shard key, entry id)."""
    return {(key, client.xadd(key, {"n": str(n)})) for n in range(count) for key in [keys[n % len(keys)]]}


def result_lines(results: Path) -> list[str]:
    """The complete lines of a results file the workers append to while the test reads it:
    a read can catch a line half written, so whatever follows the last newline is left for
    the next read (a half line parsed as a whole one loses fields or invents an entry)."""
    if not results.exists():
        return []
    text = results.read_text()
    return text[: text.rfind("\n") + 1].splitlines()


def handled_entries(lines: Iterable[str]) -> set[tuple[str, str]]:
    """(shard key, entry id) of each result line: entry ids are unique per shard key only,
    so two shards can hold the same id and an id alone would hide a lost entry."""
    return {(parts[0], parts[1]) for line in lines if len(parts := line.split()) >= 2}


async def group_view(http: httpx.AsyncClient, prefix: str) -> dict[str, Any]:
    response = await http.get(f"/v1/streams/{prefix}/groups/billing")
    return response.json() if response.status_code == 200 else {"members": []}


async def until(condition: Any, seconds: float = 20) -> None:
    with trio.fail_after(seconds):
        while not await condition():
            await trio.sleep(0.1)


async def test_workers_share_survive_a_kill_and_stop_gracefully(
    standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    settings = attrs.evolve(
        FAST, redis_url=standalone_url, heartbeat_interval_ms=200, member_lease_ttl_ms=2_000
    )
    async with serve_on(settings) as http:
        base_url = str(http.base_url)
        first = start_worker(base_url, standalone_url, prefix, "10.0.0.1", 2)
        second = start_worker(base_url, standalone_url, prefix, "10.0.0.2", 2)
        try:

            async def four_members() -> bool:
                view = await group_view(http, prefix)
                return len(view["members"]) == 4 and all(m["state"] == "STABLE" for m in view["members"])

            await until(four_members)
            ids = sorted(m["memberId"] for m in (await group_view(http, prefix))["members"])
            assert ids == [f"10.0.0.{w}/handle/{i}" for w in (1, 2) for i in (0, 1)]
            keys = [s["key"] for s in (await http.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
            published = {
                (k, sync_redis.xadd(k, {"n": str(n)})) for n in range(400) if (k := keys[n % len(keys)])
            }

            async def some_handled() -> bool:
                return sync_redis.llen(f"{prefix}:results") >= 50

            await until(some_handled)
            first.send_signal(signal.SIGKILL)  # mid-stream: its unacknowledged entries must not be lost
            first.wait()

            async def all_handled() -> bool:
                seen = handled_entries(sync_redis.lrange(f"{prefix}:results", 0, -1))
                return published <= seen

            await until(all_handled, 30)

            async def only_the_survivor() -> bool:  # the killed worker's members: fenced at lease end
                view = await group_view(http, prefix)
                return sorted(m["memberId"] for m in view["members"]) == [
                    "10.0.0.2/handle/0",
                    "10.0.0.2/handle/1",
                ]

            # (Its shards may already have been drained when it was killed, so "all handled" can
            # come before its lease ends.)
            await until(only_the_survivor, 10)

            async def all_acknowledged() -> bool:  # acks go out in batches, a moment after handling
                return all(sync_redis.xpending(k, "billing")["pending"] == 0 for k in keys)

            await until(all_acknowledged, 10)

            second.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                while second.poll() is None:
                    await trio.sleep(0.1)
            assert second.returncode == 0
            assert (await group_view(http, prefix))["members"] == []
            metrics = (await http.get("/metrics")).text
            expired = f'rsc_members_fenced_total{{group="billing",reason="LEASE_EXPIRED",stream="{prefix}"}}'
            assert f"{expired} 2.0" in metrics  # the killed worker's two members; the stopped one left
        finally:
            for process in (first, second):
                if process.poll() is None:
                    process.kill()
                    process.wait()


@pytest.mark.parametrize("self_fence", [True, False], ids=["self-fencing", "token-only"])
async def test_a_stopped_worker_cannot_touch_what_moved_and_nothing_is_lost(
    standalone_url: str, prefix: str, sync_redis: redis.Redis, tmp_path: Path, self_fence: bool
) -> None:
    """SIGSTOP past the lease, another worker takes over, SIGCONT.

    With self-fencing the woken worker drops its shards at once; without it (timing assumptions
    failed) the owner token makes Redis refuse its late reads and acknowledgements.
    """
    settings = attrs.evolve(
        FAST, redis_url=standalone_url, heartbeat_interval_ms=200, member_lease_ttl_ms=2_000
    )
    async with serve_on(settings) as http:
        base_url = str(http.base_url)
        log = tmp_path / "stopped.log"
        stopped = start_worker(
            base_url, standalone_url, prefix, "10.0.0.1", 1, log, delay=0.05, self_fence=self_fence
        )
        other: subprocess.Popen[bytes] | None = None
        try:

            async def owns_everything() -> bool:
                view = await group_view(http, prefix)
                return [len(m["assigned"]) for m in view["members"]] == [4]

            await until(owns_everything)
            keys = [s["key"] for s in (await http.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
            published = {
                (k, sync_redis.xadd(k, {"n": str(n)})) for n in range(100) if (k := keys[n % len(keys)])
            }

            async def some_handled() -> bool:
                return sync_redis.llen(f"{prefix}:results") >= 5

            await until(some_handled)
            stopped.send_signal(signal.SIGSTOP)  # entries in flight, read but not acknowledged
            other = start_worker(base_url, standalone_url, prefix, "10.0.0.2", 1)

            async def taken_over() -> bool:
                view = await group_view(http, prefix)
                return [m["memberId"] for m in view["members"]] == ["10.0.0.2/handle/0"]

            await until(taken_over)  # after the stopped worker's lease

            async def all_handled_and_acknowledged() -> bool:
                seen = handled_entries(sync_redis.lrange(f"{prefix}:results", 0, -1))
                return published <= seen and all(
                    sync_redis.xpending(k, "billing")["pending"] == 0 for k in keys
                )

            await until(all_handled_and_acknowledged, 30)
            stopped.send_signal(signal.SIGCONT)
            await until(lambda: _later(1.0))
            text = log.read_text()
            if self_fence:  # on waking, it stops everything before it can touch a shard that moved
                assert "no heartbeat succeeded within the lease; dropping every shard" in text
            else:
                # Whichever comes first on waking: Redis refusing a late read or acknowledgement
                # (the owner token names the new owner), or the coordinator's FENCED answer.
                refused = "FENCED owned by another member" in text
                assert refused or "FENCED by the coordinator (LEASE_EXPIRED)" in text
            assert all(sync_redis.xpending(k, "billing")["pending"] == 0 for k in keys)
        finally:
            for process in (stopped, other):
                if process is not None and process.poll() is None:
                    process.send_signal(signal.SIGCONT)
                    process.kill()
                    process.wait()


async def _later(seconds: float) -> bool:
    await trio.sleep(seconds)
    return True


async def test_a_worker_survives_a_redis_restart_and_a_10_s_outage_and_loses_nothing(
    tmp_path: Path, prefix: str
) -> None:
    """Redis (with an AOF) restarts under a running worker, then stays down for 10 s: the
    worker lives on, says so in a line or two instead of a traceback, and consumes everything."""
    results = tmp_path / "handled.txt"
    with DurableServer(tmp_path / "redis") as server:
        settings = attrs.evolve(
            FAST, redis_url=server.url, heartbeat_interval_ms=200, member_lease_ttl_ms=2_000
        )
        async with serve_on(settings) as http:
            log = tmp_path / "worker.log"
            worker = start_worker(
                str(http.base_url), server.url, prefix, "10.0.0.1", 2, log, results_file=results
            )
            try:

                async def reading_everything() -> bool:
                    view = await group_view(http, prefix)
                    return sum(len(m["assigned"]) for m in view["members"]) == 4

                await until(reading_everything)
                keys = [s["key"] for s in (await http.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
                published: set[tuple[str, str]] = set()

                def publish(count: int) -> None:
                    with redis.Redis.from_url(server.url, decode_responses=True) as client:
                        published.update(
                            (k, client.xadd(k, {"n": str(n)})) for n in range(count) if (k := keys[n % 4])
                        )

                def handled() -> set[tuple[str, str]]:
                    return handled_entries(result_lines(results))

                async def all_handled_and_acknowledged() -> bool:
                    if not published <= handled():
                        return False
                    with redis.Redis.from_url(server.url, decode_responses=True) as client:
                        return all(client.xpending(k, "billing")["pending"] == 0 for k in keys)

                publish(300)
                await until(lambda: _true(len(handled()) >= 50))
                server.stop(signal.SIGTERM)  # a restart, mid-stream
                server.start()
                publish(100)
                await until(all_handled_and_acknowledged, 30)

                publish(100)
                server.stop(signal.SIGKILL)  # a crash, and 10 s before it is back
                await trio.sleep(10)
                assert worker.poll() is None, log.read_text()[-3000:]
                server.start()
                publish(100)
                await until(all_handled_and_acknowledged, 40)
                assert worker.poll() is None
                await until(lambda: _true("Redis answers again" in log.read_text()), 10)
                text = log.read_text()
                assert "Traceback" not in text, text[-3000:]
                # Two outages (a restart, a crash) of everything the worker talks to: at most
                # a begin and an end line each, however many calls failed in between.
                began, ended = text.count("Redis unavailable, retrying"), text.count("Redis answers again")
                assert 1 <= began <= 2, text[-3000:]
                assert ended == began, text[-3000:]
                assert "repeated failures not logged" in text
                # It says where it connects (a missing RSC_COORDINATOR_URL used to be silent).
                assert f"coordinator {str(http.base_url).rstrip('/')}, Redis {server.url}" in text
                assert text.count("heartbeats fail, retrying") <= 2, text[-3000:]
            finally:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()


async def _true(value: bool) -> bool:
    return value


async def test_two_workers_on_one_host_without_pod_ip_are_distinct_members_and_share(
    standalone_url: str, prefix: str, tmp_path: Path
) -> None:
    """Member ids default to `<host>-<pid>/<listener>/<index>` without POD_IP: a second worker
    process on the same host joins and takes half the shards (it used to collide with the
    first one's ids and never join)."""
    settings = attrs.evolve(
        FAST, redis_url=standalone_url, heartbeat_interval_ms=200, member_lease_ttl_ms=2_000
    )
    async with serve_on(settings) as http:
        base_url = str(http.base_url)
        workers = [
            start_worker(base_url, standalone_url, prefix, None, 1, log=tmp_path / f"w{i}.log")
            for i in (1, 2)
        ]
        try:

            async def two_stable_members() -> bool:
                view = await group_view(http, prefix)
                members = view["members"]
                return len(members) == 2 and all(m["state"] == "STABLE" and m["assigned"] for m in members)

            await until(two_stable_members, 30)
            view = await group_view(http, prefix)
            ids = sorted(m["memberId"] for m in view["members"])
            pids = sorted(str(w.pid) for w in workers)
            assert [i.split("/")[0].rsplit("-", 1)[1] for i in ids] == pids
            assert sorted(len(m["assigned"]) for m in view["members"]) == [2, 2]
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            for worker in workers:
                worker.wait(timeout=20)
        logs = (tmp_path / "w1.log").read_text() + (tmp_path / "w2.log").read_text()
        assert "another incarnation" not in logs


async def test_departed_members_consumers_are_pruned_once_nothing_is_pending_under_them(
    standalone_url: str, prefix: str, tmp_path: Path
) -> None:
    """Workers restarted under new ids (new pod IPs) leave their Redis consumer names behind;
    the coordinator deletes each once nothing is pending under it. A worker killed with
    entries pending keeps its consumer until the next owner has claimed them: nothing is lost."""
    settings = attrs.evolve(
        FAST,
        redis_url=standalone_url,
        heartbeat_interval_ms=200,
        member_lease_ttl_ms=2_000,
        consumer_prune_interval_ms=300,
    )
    checker = redis.Redis.from_url(standalone_url, decode_responses=True)
    results = tmp_path / "handled.txt"
    async with serve_on(settings) as http:
        base_url = str(http.base_url)
        joined = (await http.post("/v1/heartbeat", json=hb(prefix, "bootstrap", 0))).json()
        leave = hb(prefix, "bootstrap", -1)  # the stream and group exist; nobody reads yet
        assert joined["memberEpoch"] >= 1
        await http.post("/v1/heartbeat", json=leave)
        keys = [s["key"] for s in (await http.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]

        def consumers() -> dict[str, set[str]]:
            return {k: {c["name"] for c in checker.xinfo_consumers(k, "billing")} for k in keys}

        def only(member: str) -> Any:
            async def check() -> bool:
                return all(names == {member} for names in consumers().values())

            return check

        published = spread(checker, keys, 40)
        first = start_worker(base_url, standalone_url, prefix, "10.9.0.1", 1, results_file=results)
        await until(lambda: _handled_all(results, published), 30)
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=20)
        second = start_worker(
            base_url, standalone_url, prefix, "10.9.0.2", 1, delay=0.2, results_file=results
        )
        await until(only("10.9.0.2/handle/0"), 30)  # the first one's names are gone
        published |= spread(checker, keys, 40)

        async def some_pending() -> bool:
            return await _pending(checker, keys) > 0

        await until(some_pending, 10)
        second.send_signal(signal.SIGKILL)  # entries pending under its name
        second.wait()
        await trio.sleep(3)  # its lease ends, it is fenced, and several prune rounds pass
        view = (await http.get(f"/v1/streams/{prefix}/groups/billing")).json()
        assert view["members"] == []
        assert any("10.9.0.2/handle/0" in names for names in consumers().values())  # kept: pending
        assert await _pending(checker, keys) > 0
        third = start_worker(base_url, standalone_url, prefix, "10.9.0.3", 1, results_file=results)
        try:
            await until(lambda: _handled_all(results, published), 60)
            await until(only("10.9.0.3/handle/0"), 30)
            assert await _pending(checker, keys) == 0
            view = (await http.get(f"/v1/streams/{prefix}")).json()
            assert {g["consumers"] for s in view["shards"] for g in s["groups"]} == {1}
        finally:
            third.send_signal(signal.SIGTERM)
            third.wait(timeout=20)
            checker.close()


async def _handled_all(results: Path, published: set[tuple[str, str]]) -> bool:
    return published <= handled_entries(result_lines(results))


async def _pending(checker: Any, keys: Sequence[str]) -> int:
    return sum(int(checker.xpending(k, "billing")["pending"]) for k in keys)


async def test_a_worker_serves_its_own_metrics(standalone_url: str, prefix: str, tmp_path: Path) -> None:
    settings = attrs.evolve(
        FAST, redis_url=standalone_url, heartbeat_interval_ms=200, member_lease_ttl_ms=2_000
    )
    port = free_port()
    async with serve_on(settings) as http:
        worker = start_worker(
            str(http.base_url), standalone_url, prefix, "10.8.0.1", 2, extra=["--metrics-port", str(port)]
        )
        try:

            async def two_members() -> bool:
                return await _stable(http, prefix, 2)

            await until(two_members, 30)
            keys = [s["key"] for s in (await http.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
            checker = redis.Redis.from_url(standalone_url, decode_responses=True)
            spread(checker, keys, 20)
            checker.close()

            async def scraped() -> bool:
                text = await trio.to_thread.run_sync(
                    lambda: httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                )
                handled = _series(text, "rsc_worker_handled_total", prefix)
                return sum(float(v) for v in handled) >= 20 and "rsc_worker_handler_seconds_count" in text

            await until(scraped, 20)
            checker = redis.Redis.from_url(standalone_url, decode_responses=True)
            checker.xadd(keys[0], {"poison": "1"})  # fails 5 times (4 of them retries), then dead-lettered
            checker.close()

            async def dead_lettered() -> bool:
                text = await trio.to_thread.run_sync(
                    lambda: httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                )
                return sum(float(v) for v in _series(text, "rsc_worker_dead_lettered_total", prefix)) == 1

            await until(dead_lettered, 30)
            await trio.sleep(1.5)  # a lag measurement after the last entry (reclaim_every_s 0.5)
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            owned = _series(text, "rsc_worker_owned_shards", prefix)
            assert sorted(float(v) for v in owned) == [2.0, 2.0]
            assert sum(float(v) for v in _series(text, "rsc_worker_failed_total", prefix)) == 5
            assert sum(float(v) for v in _series(text, "rsc_worker_retried_total", prefix)) == 4
            assert [float(v) for v in _series(text, "rsc_worker_stalls_total", prefix)] == [0.0, 0.0]
            lags = re.findall(r'rsc_worker_shard_lag\{[^}]*shard="(\d+)"[^}]*\} (\S+)', text)
            pending = re.findall(r'rsc_worker_shard_pending\{[^}]*shard="(\d+)"[^}]*\} (\S+)', text)
            assert sorted(int(s) for s, _ in lags) == [0, 1, 2, 3]  # each owned shard, once
            assert {float(v) for _, v in lags} == {0.0}
            assert {float(v) for _, v in pending} == {0.0}
            assert "process_cpu_seconds_total" in text
        finally:
            stop_workers([worker])


def _series(text: str, name: str, prefix: str) -> list[str]:
    """The values of metric `name` of stream `prefix` in a Prometheus exposition."""
    return re.findall(name + r'\{[^}]*stream="' + re.escape(prefix) + r'"[^}]*\} (\S+)', text)


async def _stable(http: httpx.AsyncClient, prefix: str, count: int) -> bool:
    members = (await group_view(http, prefix))["members"]
    return len(members) == count and all(m["state"] == "STABLE" and m["assigned"] for m in members)


def test_members_are_static_with_an_explicit_instance_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stable identity (RSC_INSTANCE_ID, `instance_id=`) makes members static; a pod IP or
    host-pid does not; `static=` / RSC_STATIC decide otherwise; a nonsense RSC_STATIC is refused."""
    from rsc.client.worker import static_members

    monkeypatch.delenv("RSC_INSTANCE_ID", raising=False)
    monkeypatch.delenv("RSC_STATIC", raising=False)
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    assert static_members() is False
    assert static_members(instance="w1") is True
    monkeypatch.setenv("RSC_INSTANCE_ID", "w1")
    assert static_members() is True
    assert static_members(False) is False
    monkeypatch.setenv("RSC_STATIC", "false")
    assert static_members() is False
    monkeypatch.delenv("RSC_INSTANCE_ID")
    monkeypatch.setenv("RSC_STATIC", "TRUE")
    assert static_members() is True
    monkeypatch.setenv("RSC_STATIC", "maybe")
    with pytest.raises(ValueError, match="RSC_STATIC"):
        static_members()
