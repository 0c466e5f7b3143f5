"""Data-plane side effects the actors perform after persisting events, one concern a module.

Every operation is idempotent, so that a crash between a journal write and its effect is
repaired by running the effect again on recovery:

* shard keys exist (created empty, never touching an existing stream), sealed when DRAINING;
* each group's consumer group exists on each readable shard key;
* each shard's owner token for a group equals the member the shard is installed to, and is
  absent when no one holds it.

`port.Effects` is the port the actors hold, composed of one protocol per concern
(`catalog`, `shard_keys`, `owners`, `dead_letters`, `inspection`); `redis_effects.RedisEffects`
does it on Redis, `memory_effects.MemoryEffects` is the fake of the time-driven actor tests.
The Lua scripts are in `rsc/lua/coordinator/`.
"""
