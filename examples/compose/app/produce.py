"""The producer of the compose example: one keyed order a second, forever."""

import itertools
import os
import time

import redis

from rsc.client.sync import SyncCoordinator, SyncProducer

coordinator = SyncCoordinator(os.environ["RSC_COORDINATOR_URL"])
client = redis.Redis.from_url(os.environ["RSC_REDIS_URL"], decode_responses=True)
with SyncProducer(coordinator, client, "orders", "compose-producer") as producer:
    for n in itertools.count():
        producer.publish({"order": str(n)}, key=f"customer-{n % 10}")
        time.sleep(1)
