"""The bench's defaults that its flags and its workloads share (no imports: ``tfd -h`` stays light)."""

STEP_TOKENS = 32768  # rows a step, as the daemon's TF_STEP_TOKENS=auto on a GPU of 70 GiB or more
