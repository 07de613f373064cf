"""tfd: a serving daemon for hybrid linear-attention language models."""

__version__ = "0.1.0"
