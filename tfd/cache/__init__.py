"""The prompt cache: prompt states kept in memory and learned on disk, and where a lane resumes.

Between the engine and the store: it knows prompts (their prefixes), the pool's pages and the
store's files, never a lane or a step. docs/architecture.md has the walk of a state through it.
"""
