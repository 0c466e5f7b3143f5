"""The pure coordination core: no I/O, no clock, no trio.

Read in this order: `model` (values), `commands` and `events` (what is asked
and what happened), `assignor` (the sticky balanced target), `group` (the
group aggregate: heartbeats, epochs, revoke-before-assign), `stream` (the
layout and resharding), `wire` (the heartbeat response), `codec` (JSON).
"""
