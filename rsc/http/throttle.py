"""Failed admin authentication, limited per remote address (time is an input).

An address may fail `max_failures` times in a fixed window of `window_s`;
after that every admin request from it is answered 429 with `Retry-After`
until the window ends, and those refusals are not audited one by one: the
audit gets one aggregated record per address and window (`blocked` counts
them). The table is bounded (`max_addresses`, the oldest windows go first),
so a flood of addresses cannot grow memory without end.
"""

from __future__ import annotations

import functools
import ipaddress
import math
from collections import OrderedDict

import attrs


@attrs.define
class Window:
    started: float
    failures: int = 0
    blocked: int = 0


@attrs.frozen
class Blocked:
    """An address over its limit: its window so far, and when it may try again."""

    address: str
    started: float
    failures: int
    blocked: int
    window_s: float


@functools.lru_cache(maxsize=4096)  # asked on every heartbeat; parsing an address is not free
def client_key(address: str | None) -> str:
    """Whom a failure counts against: an IPv4 address, an IPv6 /64 (one host usually holds a
    whole /64, so single addresses would be free to rotate), or `local` for Unix sockets."""
    if not address or address == "<local>":  # a Unix socket (Quart's name for its peer)
        return "local"
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class FailureThrottle:
    def __init__(self, max_failures: int = 10, window_s: float = 60.0, max_addresses: int = 10_000) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_addresses = max_addresses
        self.windows: OrderedDict[str, Window] = OrderedDict()
        self._ended: list[Blocked] = []

    def retry_after(self, address: str, now: float) -> float | None:
        """Seconds until `address` may try again, or None when it may now. Counts the refusal."""
        window = self._current(address, now)
        if window is None or window.failures < self.max_failures:
            return None
        window.blocked += 1
        return max(1.0, math.ceil(window.started + self.window_s - now))

    def failed(self, address: str, now: float) -> None:
        """Count one failed authentication from `address`."""
        window = self._current(address, now)
        if window is None:
            window = Window(now)
            self.windows[address] = window
            while len(self.windows) > self.max_addresses:
                self._end(*self.windows.popitem(last=False))
        window.failures += 1

    def expired(self, now: float) -> list[Blocked]:
        """Forget the windows that ended; return those that blocked something (to audit once each)."""
        for address, window in list(self.windows.items()):
            if now - window.started >= self.window_s:
                del self.windows[address]
                self._end(address, window)
        out, self._ended = self._ended, []
        return out

    def _current(self, address: str, now: float) -> Window | None:
        window = self.windows.get(address)
        if window is not None and now - window.started >= self.window_s:
            del self.windows[address]
            self._end(address, window)
            return None
        return window

    def _end(self, address: str, window: Window) -> None:
        if window.blocked:
            self._ended.append(
                Blocked(address, window.started, window.failures, window.blocked, self.window_s)
            )
