"""`tfd bench`: speed of a model on this device against its memory roofline."""
