"""sdpa.patch_torch(): unmodified torch modules that call
torch.nn.functional.scaled_dot_product_attention give torch's answers (and gradients) with
their attention computed by sdpa, which the patch's counts prove; calls sdpa does not take
go to torch and are counted; leaving the patch puts torch's function back."""

import pytest
import torch
import torch.nn.functional as F

import sdpa

TORCH_SDPA = F.scaled_dot_product_attention


def assert_close_float32(actual, expected, what):
    """float32's tolerance (DESIGN.md §4): 1e-5 relative to the values' scale."""
    scale = expected.abs().max().item()
    error = (actual - expected).abs().max().item()
    assert error <= 1e-5 * scale, f"{what}: max error {error:.3g} at scale {scale:.3g}"


def encoder_layer():
    torch.manual_seed(0)
    # Training mode (dropout 0) keeps torch off its fused inference path, which does not go
    # through F.scaled_dot_product_attention.
    return torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                            batch_first=True).train()


def run_with_grad(module, x, **kwargs):
    x = x.clone().requires_grad_()
    y = module(x, **kwargs)
    # A fixed random weighting: the sum of squares of a LayerNorm's output would be a
    # constant, with gradients of rounding noise.
    (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(2))).sum().backward()
    grads = {"x": x.grad} | {name: p.grad.clone() for name, p in module.named_parameters()}
    module.zero_grad()
    return y.detach(), grads


def test_transformer_encoder_layer_runs_on_sdpa_with_torchs_answers():
    layer = encoder_layer()
    x = torch.randn(3, 17, 32)
    padding = torch.zeros(3, 17, dtype=torch.bool)
    padding[1, 12:] = True  # key padding: True = ignore, torch's polarity for this module
    causal = torch.ones(17, 17, dtype=torch.bool).triu(1)  # True = ignore, as the padding mask
    expected, expected_grads = run_with_grad(layer, x, src_mask=causal, src_key_padding_mask=padding)
    with sdpa.patch_torch() as patch:
        assert F.scaled_dot_product_attention is not TORCH_SDPA
        actual, grads = run_with_grad(layer, x, src_mask=causal, src_key_padding_mask=padding)
    assert patch.counts == {"sdpa": 1, "torch": 0}
    assert_close_float32(actual, expected, "output")
    for name in expected_grads:
        assert_close_float32(grads[name], expected_grads[name], f"grad {name}")
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_multihead_attention_cross_attention_and_dtypes():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        mha = torch.nn.MultiheadAttention(24, 3, kdim=16, vdim=8, batch_first=True, dtype=dtype)
        q, kv = torch.randn(2, 5, 24, dtype=dtype), torch.randn(2, 9, 16, dtype=dtype)
        v = torch.randn(2, 9, 8, dtype=dtype)
        expected, _ = mha(q, kv, v, need_weights=False)
        with sdpa.patch_torch() as patch:
            actual, weights = mha(q, kv, v, need_weights=False)
        assert weights is None and patch.counts == {"sdpa": 1, "torch": 0}
        assert_close_float32(actual, expected, str(dtype))


def test_patched_function_is_torchs_signature():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mask = torch.rand(6, 6) > 0.3
    mask.fill_diagonal_(True)
    with sdpa.patch_torch() as patch:
        by_position = F.scaled_dot_product_attention(q, k, v, mask, 0.0, False, scale=0.5, enable_gqa=True)
        by_keyword = F.scaled_dot_product_attention(query=q, key=k, value=v, is_causal=True, enable_gqa=True)
    assert patch.counts == {"sdpa": 2, "torch": 0}
    assert_close_float32(by_position, TORCH_SDPA(q, k, v, mask, 0.0, False, scale=0.5, enable_gqa=True), "positional")
    assert_close_float32(by_keyword, TORCH_SDPA(q, k, v, is_causal=True, enable_gqa=True), "keywords")


def test_calls_sdpa_does_not_take_go_to_torch_and_are_counted():
    q = torch.randn(1, 2, 4, 8)
    with sdpa.patch_torch() as patch:
        # Another device: meta tensors (shapes only), which torch computes and sdpa cannot.
        meta = F.scaled_dot_product_attention(q.to("meta"), q.to("meta"), q.to("meta"))
        # A call the library refuses (GQA head counts without enable_gqa): torch's own error.
        with pytest.raises(RuntimeError):
            F.scaled_dot_product_attention(q, q[:, :1].expand(1, 3, 4, 8).contiguous(), q)
        # Arguments that are not torch's signature (a keyword torch's function does not
        # have, scale given by position): torch's own TypeError.
        with pytest.raises(TypeError):
            F.scaled_dot_product_attention(q, q, q, window_size=(1, 0))
        with pytest.raises(TypeError):
            F.scaled_dot_product_attention(q, q, q, None, 0.0, False, 0.5)
        ok = F.scaled_dot_product_attention(q, q, q)
    assert meta.device.type == "meta" and tuple(meta.shape) == (1, 2, 4, 8)
    assert patch.counts == {"sdpa": 1, "torch": 4}
    assert_close_float32(ok, TORCH_SDPA(q, q, q), "supported call")


def test_a_refused_dropout_call_draws_from_torchs_generator_as_torch_alone_does():
    # sdpa refuses a scale beyond float32 (torch computes it: infinite scores); with dropout
    # it has drawn a seed first, which must not leave torch's generator one draw ahead.
    q = torch.randn(1, 2, 4, 8)
    torch.manual_seed(5)
    TORCH_SDPA(q, q, q, dropout_p=0.5, scale=1e39)
    expected = torch.rand(4)
    with sdpa.patch_torch() as patch:
        torch.manual_seed(5)
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, scale=1e39)
        after = torch.rand(4)
    assert patch.counts == {"sdpa": 0, "torch": 1}
    assert torch.equal(after, expected)


def test_leaving_the_block_restores_torch_even_on_an_exception():
    with pytest.raises(KeyError):
        with sdpa.patch_torch():
            raise KeyError("inside")
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_whole_process_patch_until_restored_and_nesting():
    outer = sdpa.patch_torch()
    try:
        assert outer.active
        q = torch.randn(1, 1, 3, 4)
        F.scaled_dot_product_attention(q, q, q)
        inner = sdpa.patch_torch()
        F.scaled_dot_product_attention(q, q, q)
        # Only the latest patch sees a call; the outer one cannot be removed under it.
        assert inner.counts == {"sdpa": 1, "torch": 0} and outer.counts == {"sdpa": 1, "torch": 0}
        with pytest.raises(RuntimeError, match="restore it first"):
            outer.restore()
        inner.restore()
        assert outer.active and not inner.active
    finally:
        outer.restore()
    assert F.scaled_dot_product_attention is TORCH_SDPA
    outer.restore()  # twice: harmless
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_transformers_sdpa_implementation_runs_on_sdpa_under_the_patch():
    """transformers' own "sdpa" attention calls torch's function by its module path, so a
    model on it runs on sdpa under the patch, with the same logits."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    ids = torch.randint(0, 97, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :2] = 0
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        with sdpa.patch_torch() as patch:
            actual = model(ids, attention_mask=mask).logits
    assert patch.counts == {"sdpa": 2, "torch": 0}
    real = mask.bool()
    assert_close_float32(actual[real], expected[real], "logits")
