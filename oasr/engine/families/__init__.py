"""Model families: what the engine needs from an encoder, one module per family."""
