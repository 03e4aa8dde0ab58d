"""One batched paged encoder call: the model runner, each stream's resources (slots, pool
blocks, decoder state), padding to captured widths, staging, CUDA graphs, failure isolation
and memory sizing."""
