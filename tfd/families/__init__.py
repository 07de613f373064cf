"""Model families: weights to layers, and what a lane of each keeps. Above the model's layer math,
below the cache (docs/architecture.md)."""
