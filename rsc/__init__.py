"""rsc: a coordinator for sharded Redis Streams.

The stable public API is this module's top level (`__all__`) and the import paths the docs
give; `rsc.http`, `rsc.actors` and `rsc.events` are internal and may move. The names below are
loaded on first use (a module `__getattr__`), so `import rsc` in the coordinator or the CLI loads
no client code:

    from rsc import App, Message                  # a worker
    from rsc import connect_producer              # a trio producer, from URLs, in one call
    from rsc import SyncProducer, SyncCoordinator # a producer for synchronous code
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

#: Public name -> the module that defines it (imported on first use).
_PUBLIC = {
    # workers
    "App": "rsc.client.worker",
    "Message": "rsc.client.poller",
    "PollerSettings": "rsc.client.poller",
    "MemberSettings": "rsc.client.member",
    # producers
    "Producer": "rsc.client.producer",
    "open_producer": "rsc.client.producer",
    "connect_producer": "rsc.client.producer",
    "SyncProducer": "rsc.client.sync",
    "SyncCoordinator": "rsc.client.sync",
    "connect_sync_producer": "rsc.client.sync",
    "Coordinator": "rsc.client.coordinator",
    "open_redis": "rsc.connect",
    # what a publish raises
    "RscError": "rsc.client.errors",
    "PublishFailed": "rsc.client.producer_state",
    "ShardFull": "rsc.client.producer_state",
    "RedisOutOfMemory": "rsc.client.producer_state",
    "ProducerFenced": "rsc.client.producer_state",
    "ProducerPaused": "rsc.client.producer_state",
    "NoWritableShards": "rsc.client.producer_state",
    # the Admin API client
    "AdminClient": "rsc.client.admin_api",
}

__all__ = [
    "AdminClient",
    "App",
    "Coordinator",
    "MemberSettings",
    "Message",
    "NoWritableShards",
    "PollerSettings",
    "Producer",
    "ProducerFenced",
    "ProducerPaused",
    "PublishFailed",
    "RedisOutOfMemory",
    "RscError",
    "ShardFull",
    "SyncCoordinator",
    "SyncProducer",
    "__version__",
    "connect_producer",
    "connect_sync_producer",
    "open_producer",
    "open_redis",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'rsc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers and IDEs see (never run)
    from rsc.client.admin_api import AdminClient as AdminClient
    from rsc.client.coordinator import Coordinator as Coordinator
    from rsc.client.errors import RscError as RscError
    from rsc.client.member import MemberSettings as MemberSettings
    from rsc.client.poller import Message as Message
    from rsc.client.poller import PollerSettings as PollerSettings
    from rsc.client.producer import Producer as Producer
    from rsc.client.producer import connect_producer as connect_producer
    from rsc.client.producer import open_producer as open_producer
    from rsc.client.producer_state import NoWritableShards as NoWritableShards
    from rsc.client.producer_state import ProducerFenced as ProducerFenced
    from rsc.client.producer_state import ProducerPaused as ProducerPaused
    from rsc.client.producer_state import PublishFailed as PublishFailed
    from rsc.client.producer_state import RedisOutOfMemory as RedisOutOfMemory
    from rsc.client.producer_state import ShardFull as ShardFull
    from rsc.client.sync import SyncCoordinator as SyncCoordinator
    from rsc.client.sync import SyncProducer as SyncProducer
    from rsc.client.sync import connect_sync_producer as connect_sync_producer
    from rsc.client.worker import App as App
    from rsc.connect import open_redis as open_redis
