"""The BERT network: config, Keras 3 layers, heads, losses, optimizers, checkpoints."""
