"""A multi-token-prediction module for a tiny DeepSeek-V3 checkpoint (transformers writes none: its DeepSeek-V3
ignores the module's layer), laid out as DeepSeek-V3's release holds it: layer ``num_hidden_layers`` with a whole
decoder layer, ``enorm``, ``hnorm``, ``eh_proj`` and its own ``embed_tokens`` and ``shared_head`` (norm, head); and
a float64 torch reference of what the module computes (vLLM's DeepSeekMultiTokenPredictorLayer)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file


def add_mtp_module(directory: Path, seed: int = 0) -> None:
    """Give the checkpoint in ``directory`` a random MTP module: its decoder layer a perturbed copy of the last
    layer (a sparse one), its norms and projection drawn, its embedding and head copies of the model's."""
    raw = json.loads((directory / "config.json").read_text())
    layers, hidden = raw["num_hidden_layers"], raw["hidden_size"]
    tensors = load_file(directory / "model.safetensors")
    rng = np.random.default_rng(seed)
    last, mtp = f"model.layers.{layers - 1}.", f"model.layers.{layers}."
    dtype = tensors["model.embed_tokens.weight"].dtype
    for name, value in list(tensors.items()):
        if name.startswith(last):
            noise = rng.normal(0.0, 0.05, value.shape) if "norm" not in name and "bias" not in name else 0.0
            tensors[mtp + name[len(last):]] = (value.astype(np.float64) + noise).astype(value.dtype)
    tensors[mtp + "enorm.weight"] = rng.uniform(0.5, 1.5, hidden).astype(dtype)
    tensors[mtp + "hnorm.weight"] = rng.uniform(0.5, 1.5, hidden).astype(dtype)
    tensors[mtp + "eh_proj.weight"] = rng.normal(0.0, 0.1, (hidden, 2 * hidden)).astype(dtype)
    tensors[mtp + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].copy()
    tensors[mtp + "shared_head.norm.weight"] = rng.uniform(0.5, 1.5, hidden).astype(dtype)
    tensors[mtp + "shared_head.head.weight"] = tensors["lm_head.weight"].copy()
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    raw["num_nextn_predict_layers"] = 1
    (directory / "config.json").write_text(json.dumps(raw, indent=2))


def mtp_reference_guess(hf, directory: Path, tokens: list[int]) -> int:
    """The module's guess after ``tokens`` (t_0 .. t_{N-1}), computed with HF's own decoder layer in float64:
    x_p = eh_proj([enorm(embed(t_p)), hnorm(h_{p-1})]) (h: HF's hidden states before the final norm; zero before
    position 0), the module's layer over positions 0 .. N-1, argmax of shared_head(x_{N-1})."""
    import copy

    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm

    config = copy.deepcopy(hf.config)
    config._experts_implementation = "eager"  # (the grouped kernel has no float64)
    layers = config.num_hidden_layers
    tensors = {k: torch.from_numpy(v.astype(np.float64)) for k, v in load_file(directory / "model.safetensors").items()
               if k.startswith(f"model.layers.{layers}.")}
    prefix = f"model.layers.{layers}."
    layer = DeepseekV3DecoderLayer(config, layer_idx=layers).double().eval()
    state = {k[len(prefix):]: v for k, v in tensors.items()
             if k[len(prefix):].split(".")[0] not in ("enorm", "hnorm", "eh_proj", "embed_tokens", "shared_head")}
    experts = range(config.n_routed_experts)  # (HF's layer stacks them: gate_up_proj [E, 2I, H], down_proj [E, H, I])
    state["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([state.pop(f"mlp.experts.{e}.gate_proj.weight"),
                                                                 state.pop(f"mlp.experts.{e}.up_proj.weight")])
                                                      for e in experts])
    state["mlp.experts.down_proj"] = torch.stack([state.pop(f"mlp.experts.{e}.down_proj.weight") for e in experts])
    layer.load_state_dict(state, strict=True)

    def norm(name: str) -> DeepseekV3RMSNorm:
        n = DeepseekV3RMSNorm(config.hidden_size, config.rms_norm_eps).double()
        n.weight.data = tensors[prefix + name]
        return n

    captured = {}

    def keep(module, inputs, output):  # the last layer's output: the residual stream before the final norm
        captured["h"] = output[0] if isinstance(output, tuple) else output

    hook = hf.model.layers[-1].register_forward_hook(keep)
    with torch.no_grad():
        ids = torch.tensor([tokens])
        hf(ids)
        hook.remove()
        h = captured["h"][0].double()  # [N, hidden]: before the final norm
        previous = torch.cat([torch.zeros(1, config.hidden_size, dtype=torch.float64), h[:-1]])
        e = norm("enorm.weight")(tensors[prefix + "embed_tokens.weight"][ids[0]])
        x = torch.cat([e, norm("hnorm.weight")(previous)], dim=-1) @ tensors[prefix + "eh_proj.weight"].T
        positions = torch.arange(len(tokens))[None]
        cos, sin = hf.model.rotary_emb(x[None], positions)
        mask = torch.full((len(tokens), len(tokens)), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        out = layer(x[None], attention_mask=mask, position_ids=positions,
                    position_embeddings=(cos.double(), sin.double()))
        out = out[0] if isinstance(out, tuple) else out
        last = norm("shared_head.norm.weight")(out[0, -1])
        return int((last @ tensors[prefix + "shared_head.head.weight"].T).argmax())
