"""The pipeline's cores: projecting changes into key versions and routing them to indexer
nodes. Pure functions, no Spark, no network (``shardex.core.gcpause`` keeps their hot loops
cheap)."""
