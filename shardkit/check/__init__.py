"""Checking shard sets: verify, summaries and scans, adopting shards written elsewhere."""
