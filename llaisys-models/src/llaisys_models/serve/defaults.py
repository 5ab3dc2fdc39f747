"""Defaults of the server that ``llaisys serve``'s options show: here, as registering the command imports no
FastAPI (serve/cli.py)."""

# The reply cap of a request that sets none (max_tokens, max_completion_tokens, max_output_tokens), at most the room
# its prompt leaves in the context: longer than nearly every answer, a small reasoning model's thinking included,
# yet a model that never stops (a 135M one ran 8,155 tokens, 202 s on a CPU, to the end of its context) ends within
# about a minute there. Clients that send max_tokens get what they ask for.
DEFAULT_MAX_TOKENS = 2048
# LoRA adapters (--max-loras, --max-lora-rank): vLLM's defaults, as the model's own (lora/model.py)
DEFAULT_MAX_LORAS = 4
DEFAULT_MAX_LORA_RANK = 16
