"""Model families: weights to layers, and what a lane of each keeps."""
