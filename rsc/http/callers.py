"""A request's caller as the limits see it: whose per-caller rate limits it spends
(`caller_key`) and which quotas it has (`QuotaTable`).

A caller is its credential; an anonymous caller is its address (`rsc.http.throttle.client_key`:
an IPv4 address or an IPv6 /64). The rate limits themselves are `rsc.http.ratelimit`'s, the
quotas `rsc.config.Settings.quota_for`'s.
"""

from __future__ import annotations

from rsc.config import Settings
from rsc.events import auth, quotas
from rsc.http import exchange
from rsc.http.throttle import client_key


def caller_key(caller: auth.Credential | None) -> str:
    """Whose per-caller limits the current request uses: its credential's, else its address's.

    Raises nothing (outside a request, `LookupError`)."""
    if caller is not None:
        return f"credential:{caller.name}"
    return f"address:{client_key(exchange.current().remote_addr)}"


class QuotaTable:
    """Each caller's quotas, worked out once (they are asked for on every heartbeat)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.anonymous = settings.quota_for(None)
        self.by_name = {c.name: settings.quota_for(c) for c in settings.credentials}

    def __call__(self, caller: auth.Credential | None) -> quotas.Quota:
        """The quotas of `caller` (None: anonymous). Raises nothing."""
        if caller is None:
            return self.anonymous
        found = self.by_name.get(caller.name) if caller is not auth.ADMIN else None
        return found if found is not None else self.settings.quota_for(caller)
