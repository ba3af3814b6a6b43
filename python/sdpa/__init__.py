"""sdpa: exact scaled dot-product attention, softmax(Q Kᵀ · scale + mask) V.

    import sdpa
    out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=False)  # torch's
    out, weights = sdpa.attention(q, k, v, m, causal="bottom_right", return_weights=True)
    out = sdpa.attention(q, k, v, window_size=(128, 0), alibi_slopes=slopes, softcap=30.0)
    out = sdpa.varlen_attention(q_packed, k_packed, v_packed, cu_seqlens_q, cu_seqlens_k)
    out = sdpa.paged_attention(q, k_pages, v_pages, block_table, seq_lens, causal="bottom_right")
    k8, k_scale = sdpa.quantize_kv(k); v8, v_scale = sdpa.quantize_kv(v)  # int8 K/V, a scale per token
    out = sdpa.attention(q, k8, v8, key_scale=k_scale, value_scale=v_scale)
    with sdpa.patch_torch():  # torch.nn.functional.scaled_dot_product_attention's CPU calls on sdpa
        y = torch_module(x)

The functions take torch tensors or NumPy arrays and return the same kind, reading the inputs in
place through DLPack whatever their strides. The semantics are PyTorch's; the few places
where sdpa differs are in docs/semantics.md ("Python").
"""

from . import _core
from ._attention import attention, scaled_dot_product_attention
from ._quantize import quantize_kv
from ._sequences import paged_attention, varlen_attention
from ._patch import patch_torch
from .nn import KVCache, MultiheadAttention

__version__ = _core.version()


def runtime_info() -> dict:
    """What the C++ library found on this machine: version, CPU features, kernel, threads."""
    return _core.runtime_info()


__all__ = ["attention", "scaled_dot_product_attention", "varlen_attention", "paged_attention", "quantize_kv",
           "MultiheadAttention",
           "KVCache", "patch_torch", "runtime_info", "__version__"]
