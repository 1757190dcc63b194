"""The projector's name for ``shardex.core.gcpause.gc_paused`` (the scan client pauses the
collector the same way around building a block's rows)."""

from shardex.core.gcpause import gc_paused

__all__ = ["gc_paused"]
