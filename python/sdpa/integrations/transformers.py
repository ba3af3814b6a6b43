"""Hugging Face transformers on sdpa: one line makes every attention call of a model run on
sdpa's CPU kernels, with the extras transformers' "sdpa" (torch's) cannot take.

    from sdpa.integrations.transformers import register
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=register())
    model.set_attn_implementation(register())       # or switch a loaded model

`register()` adds an attention function to `transformers.AttentionInterface` and its mask
function to `transformers.AttentionMaskInterface` under one name (without the mask
function transformers builds no mask for an unknown name, and causality is silently
lost). What models pass maps onto sdpa.scaled_dot_product_attention:

  * `scaling` → scale, `dropout` → dropout_p (sdpa's Philox dropout, seeded from torch's
    generator: the dropped positions differ from eager's), `is_causal` (top-left, as
    torch's integration);
  * grouped-query heads (`module.num_key_value_groups`) through sdpa's own GQA: K and V
    are read as they are, never repeated;
  * the 4-D mask (bool, True = attend, or float, added), broadcast over the heads;
  * `sliding_window` W (transformers: query i sees keys j with i − W < j ≤ i) → window
    (W − 1, 0), when there is no mask; a mask, when there is one, already holds the window;
  * `softcap` (Gemma 2) → softcap, `s_aux` (gpt-oss' attention sinks) → sinks;

and the output comes back in transformers' layout (B, L, H, E), with no weights.

Requires transformers 5. The name must not contain "sdpa": transformers takes any such
name for torch's SDPA and refuses it for the models that need softcap or sinks.
"""

from __future__ import annotations

import warnings

import torch
import transformers
from transformers.masking_utils import sdpa_mask

from .._attention import scaled_dot_product_attention

DEFAULT_NAME = "exact_cpu"

# Keyword arguments of other attention implementations that sdpa has no form for; a model
# passing them gets an error rather than an answer that ignores them.
_UNSUPPORTED = {
    "position_bias": "a learned position bias (T5-style); use attn_implementation='eager'",
    "cache": "transformers' paged cache (continuous batching); use attn_implementation='eager' or 'sdpa'",
}


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      sliding_window=None, softcap=None, s_aux=None, **kwargs):
    """transformers' attention-function signature: query (B, Hq, L, E), key and value
    (B, Hkv, S, E) / (B, Hkv, S, Ev), `attention_mask` (B or 1, 1 or Hq, L, S) or None.
    Returns (output (B, L, Hq, Ev), None)."""
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"{name}: sdpa's transformers integration does not take {what}")
    if kwargs.get("output_attentions", False):
        warnings.warn("sdpa's attention does not return the attention weights (output_attentions=True); "
                      "use attn_implementation='eager' for them", stacklevel=2)
    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[1] != key.shape[1] * groups:
        raise ValueError(f"query: expected {key.shape[1] * groups} heads (num_key_value_groups {groups} × the key's "
                         f"{key.shape[1]}), got {query.shape[1]}")
    # As torch's integration: the call's is_causal, else the layer's (decoders are causal).
    causal_layer = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    options = {}
    if attention_mask is None:
        # No mask: the mask function found that causality (and the window) say it all.
        # One query row is the newest token and sees every key (its window is aligned to
        # the last key, bottom-right, sdpa's default without causal); more rows are a
        # prefill whose first key is the first query (top-left; an empty static cache's
        # unwritten keys lie past every query, as in torch's integration).
        causal = bool(causal_layer and query.shape[2] > 1)
        if sliding_window is not None and causal_layer:
            # transformers' window keeps key j for query i when i − W < j: W keys, the
            # query's own included, so W − 1 keys back.
            options["window_size"] = (int(sliding_window) - 1, 0)
    else:
        # A mask holds causality, padding and the window (transformers builds it from the
        # same pattern eager attention adds): sdpa applies it as it is, nothing more.
        causal = False
    if softcap is not None:
        options["softcap"] = float(softcap)
    if s_aux is not None:
        # sdpa's sinks are float32 or float64; a half-precision model's are widened (a
        # differentiable cast: the gradient returns in the parameter's dtype).
        options["sinks"] = s_aux if s_aux.dtype in (torch.float32, torch.float64) else s_aux.float()
    output = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=float(dropout),
                                          is_causal=causal, scale=scaling, enable_gqa=True, **options)
    return output.transpose(1, 2).contiguous(), None


def _window_in_attention_call(config, local_size) -> bool:
    """Whether `local_size`, the window size a mask function is handed, is the model's
    sliding window (which its attention calls pass as `sliding_window`, the contract
    FlashAttention's integration relies on too) and not a chunk size (Llama 4's chunked
    attention, which no attention call carries)."""
    return (local_size is not None and getattr(config, "sliding_window", None) == local_size
            and getattr(config, "attention_chunk_size", None) != local_size)


def mask_function(*args, local_size=None, allow_is_causal_skip=True, config=None, **kwargs):
    """transformers' mask function for torch's SDPA (a bool mask, True = attend, or None
    when `is_causal` alone expresses it), with one change: a causal mask with a sliding
    window and no padding is None too, because the attention call applies the window."""
    if allow_is_causal_skip and _window_in_attention_call(config, local_size):
        local_size = None
    return sdpa_mask(*args, local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, config=config,
                     **kwargs)


def register(name: str | None = None) -> str:
    """Registers sdpa's attention and mask functions with transformers under `name`
    (default "exact_cpu") and returns the name, for `attn_implementation=name`. Registering
    again is harmless.

    Raises:
        TypeError: a name that is not a string.
        ValueError: a name containing "sdpa" (transformers would take it for torch's SDPA
            and refuse it for Gemma 2 and gpt-oss), or the name of one of transformers' own
            implementations.
    """
    name = DEFAULT_NAME if name is None else name
    if not isinstance(name, str):
        raise TypeError(f"name: expected a str, got {type(name).__name__}")
    if not name or "|" in name:
        raise ValueError(f"name: expected a non-empty name without '|', got {name!r}")
    if "sdpa" in name.lower():
        raise ValueError(f"name: expected a name without 'sdpa', got {name!r} (transformers treats any "
                         "attn_implementation containing 'sdpa' as torch's SDPA and refuses it for models that "
                         "need softcap or sinks, such as Gemma 2 and gpt-oss)")
    taken = transformers.AttentionInterface._global_mapping.get(name)
    if name == "eager" or (taken is not None and taken is not attention_forward):
        raise ValueError(f"name: {name!r} is one of transformers' attention implementations; choose another")
    transformers.AttentionInterface.register(name, attention_forward)
    transformers.AttentionMaskInterface.register(name, mask_function)
    return name
