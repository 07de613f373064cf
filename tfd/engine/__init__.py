"""The engine: requests become lanes on the pool, run in batched steps on one thread.

Below the server, above the prompt cache; docs/architecture.md walks a request through it.
"""
