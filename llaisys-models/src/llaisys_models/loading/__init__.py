"""From a path to a model on a device: model files, safetensors, GGUF, the Hub, quantization."""
