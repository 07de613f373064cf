"""`tfd bench`: speed of a model on this device against its memory roofline, through the engine's own
stepper or a served daemon's HTTP API. Top layer (docs/architecture.md).
"""
