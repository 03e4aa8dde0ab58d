"""The Whisper second pass: jobs, the decoding loop, its worker (thread or processes) and the
guard against the first pass. It knows jobs, not streams."""
