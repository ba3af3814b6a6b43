"""The seeds' own tests (seeds/000, 001, 004), run on sdpa. Each is the seed's code, changed
only where it called the seed's own attention function; seed 001's masks are written in
PyTorch's polarity (True = attend), the one reason its own test failed against PyTorch."""

import torch
import torch.nn.functional as F

import sdpa


def test_seed_000_basic_functionality():
    """Seed 000's test_basic_functionality; `attention_layer(query, key, value)` (its module
    with dropout=0.0) becomes sdpa.attention(..., return_weights=True)."""
    # Setup
    batch_size, seq_len, d_k = 2, 4, 8

    # Create test inputs
    query = torch.randn(batch_size, seq_len, d_k)
    key = torch.randn(batch_size, seq_len, d_k)
    value = torch.randn(batch_size, seq_len, d_k)

    # Forward pass
    output, attention_weights = sdpa.attention(query, key, value, return_weights=True)

    # Test output shapes
    assert output.shape == (batch_size, seq_len, d_k), f"Expected output shape {(batch_size, seq_len, d_k)}, got {output.shape}"
    assert attention_weights.shape == (batch_size, seq_len, seq_len), f"Expected attention shape {(batch_size, seq_len, seq_len)}, got {attention_weights.shape}"

    # Test attention weights properties
    # 1. All weights should be non-negative
    assert torch.all(attention_weights >= 0), "Attention weights should be non-negative"

    # 2. Each row should sum to 1 (probability distribution)
    row_sums = torch.sum(attention_weights, dim=-1)
    assert torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-6), "Attention weights should sum to 1 along last dimension"


def test_seed_001_against_pytorch():
    """Seed 001's three comparisons with F.scaled_dot_product_attention (no mask, causal,
    padding), with its tolerance. The seed built its masks as 1 = ignore: the causal one as
    triu(ones, 1) — handed to PyTorch that is a float mask *added* to the scores — and the
    padding one as [0, 0, 1]. Written in PyTorch's polarity, all three pass."""
    torch.manual_seed(42)

    batch_size, seq_len, dim = 1, 3, 3
    q = torch.randn(batch_size, seq_len, dim)
    k = torch.randn(batch_size, seq_len, dim)
    v = torch.randn(batch_size, seq_len, dim)

    # Test without mask
    output_custom, weights_custom = sdpa.attention(q, k, v, return_weights=True)
    output_pytorch = F.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(output_custom, output_pytorch, atol=1e-08, rtol=1e-05), "Outputs do not match!"

    # Test with causal mask (True = attend: the lower triangle)
    mask = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool)).unsqueeze(0)
    output_custom, weights_custom = sdpa.attention(q, k, v, mask, return_weights=True)
    output_pytorch = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(output_custom, output_pytorch, atol=1e-08, rtol=1e-05), "Masked outputs do not match!"
    assert torch.equal(weights_custom.triu(1), torch.zeros_like(weights_custom)), "no weight on future tokens"

    # Test with padding mask (True = attend: the last token is padding)
    padding_mask = torch.tensor([[[1, 1, 0]]], dtype=torch.bool)
    output_custom, weights_custom = sdpa.attention(q, k, v, padding_mask, return_weights=True)
    output_pytorch = F.scaled_dot_product_attention(q, k, v, attn_mask=padding_mask)
    assert torch.allclose(output_custom, output_pytorch, atol=1e-08, rtol=1e-05), "Padding masked outputs do not match!"
    assert (weights_custom[..., 2] == 0).all()


def test_seed_001_as_the_seed_wrote_it_disagrees_with_pytorch():
    """Why the seed's own test failed: its causal mask triu(ones, 1), given to PyTorch, is a
    float mask of 0s and 1s added to the scores, not a causal mask. sdpa, like PyTorch, adds
    it (so it matches PyTorch and differs from causal attention)."""
    torch.manual_seed(42)
    q, k, v = torch.randn(1, 3, 3), torch.randn(1, 3, 3), torch.randn(1, 3, 3)
    seed_mask = torch.triu(torch.ones(3, 3), diagonal=1).unsqueeze(0)
    ours = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=seed_mask)
    assert torch.allclose(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=seed_mask), atol=1e-6)
    causal = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(ours, causal, atol=1e-3)


def test_seed_004_verification():
    """Seed 004's verification block: (batch, n, d_k) queries against (batch, m, ·) keys and
    values with m != n and d_v != d_k."""
    torch.manual_seed(42)

    # Verify implementation against PyTorch's built-in
    batch, n, m, d_k, d_v = 2, 4, 6, 8, 16

    Q = torch.randn(batch, n, d_k)
    K = torch.randn(batch, m, d_k)
    V = torch.randn(batch, m, d_v)

    # Your implementation
    our_output, our_weights = sdpa.attention(Q, K, V, return_weights=True)

    # PyTorch reference (F.scaled_dot_product_attention)
    ref_output = F.scaled_dot_product_attention(Q, K, V)

    # Sanity checks
    assert our_output.shape == (batch, n, d_v), f"Expected ({batch}, {n}, {d_v}), got {our_output.shape}"
    assert our_weights.shape == (batch, n, m), f"Expected ({batch}, {n}, {m}), got {our_weights.shape}"
    assert torch.allclose(our_weights.sum(dim=-1), torch.ones(batch, n), atol=1e-6), "Weights don't sum to 1"
    assert torch.allclose(our_output, ref_output, atol=1e-5), "Output doesn't match PyTorch reference"
