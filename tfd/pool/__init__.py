"""The memory pool: equal pages for attention rows, and lanes' states as pieces on whole pages."""
