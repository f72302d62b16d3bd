"""Strategy, input pipeline, training loop, checkpoints, metrics and summaries."""
