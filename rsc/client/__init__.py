"""What applications embed.

The coordinator HTTP client, member runtime, ShardLifecycle, built-in
poller, listener decorator and producers. It depends on the wire schema
(`rsc.events.wire`, `rsc.events.codec`), never on actors.
"""
