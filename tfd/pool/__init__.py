"""The memory pool: equal pages for attention rows, and lanes' states as pieces on whole pages.

docs/architecture.md's Memory section has the census and a lane's life on the pages.
"""
