"""Text to tokens to examples to TFRecords, and back: tokenization, data sets, features."""
