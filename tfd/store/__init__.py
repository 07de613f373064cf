"""The disk store of learned prompt states: files, their sums, budgets and the identity they are read
under; it knows files and bytes, never a lane (the cache above it does: docs/architecture.md)."""
