"""The Conformer-CTC recipe: train, evaluate and export on the shared data stages."""
