"""The pure coordination core: no I/O, no clock, no trio.

Read in this order: `model` (values), `commands` and `events` (what is asked
and what happened), `assignor` (the sticky balanced target), `group` (the
group aggregate: heartbeats, epochs, revoke-before-assign), `liveness` (the
lease table kept beside each aggregate), `stream` (the layout and
resharding), `wire` (the heartbeat request and response), `respond` (how the
coordinator renders an answer), `longpoll` (when it holds one), `member`
(the member's side of the protocol: one sans-IO machine every member drives),
`codec` (JSON).
"""
