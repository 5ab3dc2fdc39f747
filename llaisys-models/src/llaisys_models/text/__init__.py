"""Text in, text out: tokenizers, chat prompts, streamed detokenization and the model's chat() / complete()."""
