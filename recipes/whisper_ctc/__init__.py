"""The Whisper-CTC recipe (the bundled default): features, rounds of training, LMs, evaluation and export."""
