"""The engine: requests become lanes on the pool, run in batched steps on one thread."""
