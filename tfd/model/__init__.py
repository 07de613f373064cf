"""Layer math shared by the families, written for the engine: flattened rows of several lanes.

docs/architecture.md's forward pass walks a call through it.
"""

# GDN prefill chunks end at multiples of this many absolute positions (and so do prompt chunks).
GDN_CHUNK = 64
