"""The producer of the compose example: one keyed order a second, forever."""

import itertools
import time

from rsc import connect_sync_producer

# the coordinator and Redis from RSC_COORDINATOR_URL and RSC_REDIS_URL
with connect_sync_producer("orders", "compose-producer") as producer:
    for n in itertools.count():
        producer.publish({"order": str(n)}, key=f"customer-{n % 10}")
        time.sleep(1)
