"""The generation engine: the scheduler's one loop, the paged KV cache, sampling, grammars and speculative decoding."""
