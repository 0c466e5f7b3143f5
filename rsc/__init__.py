"""rsc: a coordinator for sharded Redis Streams."""

__version__ = "0.2.0"
