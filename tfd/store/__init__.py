"""Learned conversations: kept prompt states written to disk and read back, across restarts."""
