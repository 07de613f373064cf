"""Training the embedded demo model (``tfd train-demo``): its corpus, a differentiable forward of the
qwen3_5 family, and the loop that writes a checkpoint directory like ``tfd.demo.build_demo``'s."""
