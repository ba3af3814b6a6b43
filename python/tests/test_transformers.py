"""sdpa.integrations.transformers: small random models built from transformers' own config
classes (no weights downloaded) give eager attention's answers when their attention runs on
sdpa: the logits, greedy generation with the KV cache, and one training step's gradients
(float32). A spy on the sdpa function the integration calls proves sdpa ran, and with
which options (the sliding window, softcap and sinks reach sdpa's options rather than a
mask)."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import sdpa  # noqa: E402
import sdpa.integrations.transformers as integration  # noqa: E402

NAME = integration.register()

# (B, T) token ids with left padding in the second row, as a batched generate pads.
BATCH, PROMPT, PADDING, NEW_TOKENS = 2, 11, 3, 6
VOCAB = 97
WINDOW = 4  # shorter than the prompt: the window changes the answer

SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
             eos_token_id=None)

CAUSAL_MODELS = {
    # GQA: 4 query heads on 2 key/value heads.
    "llama": lambda: transformers.LlamaConfig(**SMALL),
    "mistral": lambda: transformers.MistralConfig(**SMALL, sliding_window=WINDOW),
    # Softcapping on every layer; sliding-window and full layers alternate.
    "gemma2": lambda: transformers.Gemma2Config(**SMALL, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                                                attn_logit_softcapping=2.0, final_logit_softcapping=None),
    # Attention sinks on every layer (made large enough to matter in twins()); sliding and
    # full layers alternate; a small mixture of experts.
    "gpt_oss": lambda: transformers.GptOssConfig(**{**SMALL, "intermediate_size": 32}, head_dim=16,
                                                 sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2),
}


class Spy:
    """Stands in for the sdpa function the integration calls and records each call's
    options; the real function computes every answer."""

    def __init__(self):
        self.calls = []
        self.function = integration.scaled_dot_product_attention

    def __call__(self, *args, **kwargs):
        self.calls.append({"mask": kwargs.get("attn_mask"), "is_causal": kwargs.get("is_causal"),
                           "window_size": kwargs.get("window_size"), "softcap": kwargs.get("softcap"),
                           "sinks": kwargs.get("sinks")})
        return self.function(*args, **kwargs)


@pytest.fixture
def spy(monkeypatch):
    recorder = Spy()
    monkeypatch.setattr(integration, "scaled_dot_product_attention", recorder)
    return recorder


def twins(config, auto=transformers.AutoModelForCausalLM):
    """The same random model twice: on eager attention and on sdpa."""
    eager = auto.from_config(copy.deepcopy(config), attn_implementation="eager")
    with torch.no_grad():
        for name, parameter in eager.named_parameters():
            if name.endswith(".sinks"):  # gpt-oss initialises them near 0, where they change little
                parameter.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(3))
    ours = auto.from_config(copy.deepcopy(config), attn_implementation=NAME)
    ours.load_state_dict(eager.state_dict())
    assert ours.config._attn_implementation == NAME
    return eager.eval(), ours.eval()


def prompt(padded=True, length=PROMPT):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (BATCH, length), generator=generator)
    mask = torch.ones(BATCH, length, dtype=torch.long)
    if padded:
        ids[1, :PADDING] = 0
        mask[1, :PADDING] = 0
    return ids, mask


def assert_close_float32(actual, expected, what, scale=None):
    """float32's tolerance (DESIGN.md §4): 1e-5 relative to the values' scale."""
    scale = expected.abs().max().item() if scale is None else scale
    error = (actual - expected).abs().max().item()
    assert error <= 1e-5 * scale, f"{what}: max error {error:.3g} at scale {scale:.3g}"


def assert_gradients_close(actual, expected, what):
    """Each parameter's gradient within float32's tolerance of its own scale; one that is
    zero in exact arithmetic (the key bias: a softmax ignores a shift of its row) is
    rounding noise, measured against a thousandth of the model's largest gradient."""
    assert expected.keys() == actual.keys()
    largest = max(g.abs().max().item() for g in expected.values())
    for name, g in expected.items():
        assert_close_float32(actual[name], g, f"{what} grad {name}", scale=max(g.abs().max().item(), 1e-3 * largest))


def causal_lm_labels(ids, mask):
    """The labels of a causal LM whose padding predicts nothing: a pad position's
    prediction (of the next token, the first real one after left padding) is ignored too,
    because its attention row is fully masked: eager spreads it evenly over every key,
    sdpa (as torch's SDPA) gives it 0."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:][mask[:, :-1] == 0] = -100
    return labels


def layers(model):
    return model.config.num_hidden_layers


@pytest.mark.parametrize("padded", [True, False], ids=["left_padding", "no_padding"])
@pytest.mark.parametrize("model", sorted(CAUSAL_MODELS))
def test_logits_equal_eager(model, padded, spy):
    eager, ours = twins(CAUSAL_MODELS[model]())
    ids, mask = prompt(padded)
    with torch.no_grad():
        expected = eager(ids, attention_mask=mask).logits
        actual = ours(ids, attention_mask=mask).logits
    assert len(spy.calls) == layers(ours)
    # Padding positions are no tokens: eager spreads them over every key, sdpa gives them 0.
    real = mask.bool()
    assert_close_float32(actual[real], expected[real], f"{model} logits")


@pytest.mark.parametrize("model", ["llama", "gemma2", "gpt_oss"])
def test_bfloat16_logits_within_bfloat16s_tolerance(model, spy):
    """bfloat16 weights and activations (sdpa's bfloat16 kernel), by DESIGN.md §4's rule:
    at most twice as far from the float32 model as eager attention in bfloat16 is."""
    eager, ours = twins(CAUSAL_MODELS[model]())
    ids, mask = prompt()
    with torch.no_grad():
        reference = eager(ids, attention_mask=mask).logits
        naive = eager.to(torch.bfloat16)(ids, attention_mask=mask).logits.float()
        actual = ours.to(torch.bfloat16)(ids, attention_mask=mask).logits
    assert actual.dtype == torch.bfloat16 and len(spy.calls) == layers(ours)
    real = mask.bool()
    naive_error = (naive - reference)[real].abs().max().item()
    error = (actual.float() - reference)[real].abs().max().item()
    assert error <= 2 * naive_error + 1e-5, f"{model}: bfloat16 error {error:.3g}, eager's {naive_error:.3g}"


def test_custom_4d_masks_float_and_bool(spy):
    """A model handed a prepared 4-D mask uses it as it is: a float one (a bias, the
    float32 minimum where masked, as eager's masks) is added by both; a bool one (True =
    attend) is sdpa's polarity, the same pattern as that float one's finite entries."""
    eager, ours = twins(CAUSAL_MODELS["llama"]())
    ids, _ = prompt(padded=False)
    generator = torch.Generator().manual_seed(4)
    keep = torch.ones(PROMPT, PROMPT, dtype=torch.bool).tril() & (torch.rand(PROMPT, PROMPT, generator=generator) > 0.3)
    keep.fill_diagonal_(True)
    keep = keep.expand(BATCH, 1, PROMPT, PROMPT)
    bias = torch.randn(BATCH, 1, PROMPT, PROMPT, generator=generator)
    additive = torch.where(keep, bias, torch.finfo(torch.float32).min)
    with torch.no_grad():
        expected = eager(ids, attention_mask=additive).logits
        actual = ours(ids, attention_mask=additive).logits
        assert_close_float32(actual, expected, "float 4-D mask")
        expected = eager(ids, attention_mask=torch.where(keep, 0.0, torch.finfo(torch.float32).min)).logits
        actual = ours(ids, attention_mask=keep).logits
        assert_close_float32(actual, expected, "bool 4-D mask")
    assert len(spy.calls) == 2 * layers(ours)
    assert spy.calls[0]["mask"].dtype == torch.float32 and spy.calls[-1]["mask"].dtype == torch.bool


def test_sliding_window_reaches_sdpa_as_a_window(spy):
    """Without padding the window is no mask but sdpa's window option, W − 1 keys back
    (transformers' window of W keys holds the query's own): one off and the logits above
    differ. The sequence is longer than the window, so the window matters."""
    eager, ours = twins(CAUSAL_MODELS["mistral"]())
    ids, mask = prompt(padded=False)
    with torch.no_grad():
        ours(ids, attention_mask=mask)
    assert spy.calls and all(c["mask"] is None and c["is_causal"] for c in spy.calls)
    assert all(c["window_size"] == (WINDOW - 1, 0) for c in spy.calls)


def test_softcap_reaches_sdpa(spy):
    eager, ours = twins(CAUSAL_MODELS["gemma2"]())
    ids, mask = prompt(padded=False)
    with torch.no_grad():
        ours(ids, attention_mask=mask)
    assert [c["softcap"] for c in spy.calls] == [2.0] * layers(ours)
    # Gemma 2 alternates sliding (first) and full layers.
    assert [c["window_size"] for c in spy.calls] == [(WINDOW - 1, 0), None]


def test_sinks_reach_sdpa_and_get_their_gradient(spy):
    """gpt-oss' s_aux is sdpa's sinks, the layer's own parameter: the training step above
    compares its gradient with eager's."""
    eager, ours = twins(CAUSAL_MODELS["gpt_oss"]())
    ids, mask = prompt(padded=False)
    ours(ids, attention_mask=mask).logits.sum().backward()
    sinks = [layer.self_attn.sinks for layer in ours.model.layers]
    assert len(spy.calls) == len(sinks) and all(c["sinks"] is s for c, s in zip(spy.calls, sinks))
    assert all(s.grad is not None and s.grad.abs().max() > 0 for s in sinks)
    assert [c["window_size"] for c in spy.calls] == [(WINDOW - 1, 0), None]


@pytest.mark.parametrize("model", sorted(CAUSAL_MODELS))
def test_greedy_generation_with_kv_cache_equals_eager(model, spy):
    eager, ours = twins(CAUSAL_MODELS[model]())
    ids, mask = prompt(padded=True)
    settings = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True)
    expected = eager.generate(ids, **settings)
    actual = ours.generate(ids, **settings)
    assert torch.equal(actual, expected)
    # The prefill and one call per further token, each through every layer.
    assert len(spy.calls) == layers(ours) * NEW_TOKENS
    # The decoding steps (one query row each) ran on the cache, not on the whole sequence.
    assert sum(c["mask"] is None or c["mask"].shape[-2] == 1 for c in spy.calls) >= layers(ours) * (NEW_TOKENS - 1)


@pytest.mark.parametrize("model", sorted(CAUSAL_MODELS))
def test_training_step_gradients_equal_eager(model, spy):
    eager, ours = twins(CAUSAL_MODELS[model]())
    ids, mask = prompt(padded=True)
    labels = causal_lm_labels(ids, mask)
    grads = []
    for m in (eager, ours):
        m.train()
        loss = m(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        grads.append({name: p.grad for name, p in m.named_parameters() if p.grad is not None})
    assert len(spy.calls) == layers(ours)
    expected, actual = grads
    assert any("q_proj" in name for name in expected)
    assert_gradients_close(actual, expected, model)


def bert_config():
    return transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=96, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0, pad_token_id=0)


def test_bert_with_padding_equals_eager(spy):
    """An encoder: no causality, right padding as a tokenizer pads a batch."""
    eager, ours = twins(bert_config(), auto=transformers.AutoModelForMaskedLM)
    ids, mask = prompt(padded=False)
    ids[1, -PADDING:] = 0
    mask[1, -PADDING:] = 0
    with torch.no_grad():
        expected = eager(ids, attention_mask=mask).logits
        actual = ours(ids, attention_mask=mask).logits
    assert len(spy.calls) == layers(ours)
    assert all(not c["is_causal"] and c["mask"] is not None for c in spy.calls)
    real = mask.bool()
    assert_close_float32(actual[real], expected[real], "bert logits")


def test_bert_training_step_gradients_equal_eager(spy):
    eager, ours = twins(bert_config(), auto=transformers.AutoModelForMaskedLM)
    ids, mask = prompt(padded=False)
    ids[1, -PADDING:] = 0
    mask[1, -PADDING:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    grads = []
    for m in (eager, ours):
        m.train()
        m(ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append({name: p.grad for name, p in m.named_parameters() if p.grad is not None})
    assert len(spy.calls) == layers(ours)
    expected, actual = grads
    assert any("query" in name for name in expected)
    assert_gradients_close(actual, expected, "bert")


def test_register_returns_a_name_transformers_accepts_for_softcap_models():
    assert "sdpa" not in NAME
    assert transformers.AttentionInterface._global_mapping[NAME] is integration.attention_forward
    assert transformers.AttentionMaskInterface._global_mapping[NAME] is integration.mask_function
    assert integration.register() == NAME  # again: harmless
    assert integration.register("exact_test_name") == "exact_test_name"
    model = transformers.AutoModelForCausalLM.from_config(CAUSAL_MODELS["gemma2"](), attn_implementation=NAME)
    assert model.config._attn_implementation == NAME


def test_set_attn_implementation_switches_a_loaded_model(spy):
    eager, _ = twins(CAUSAL_MODELS["llama"]())
    ids, mask = prompt()
    with torch.no_grad():
        expected = eager(ids, attention_mask=mask).logits
        eager.set_attn_implementation(NAME)
        actual = eager(ids, attention_mask=mask).logits
    assert len(spy.calls) == layers(eager)
    assert_close_float32(actual[mask.bool()], expected[mask.bool()], "logits after set_attn_implementation")


@pytest.mark.parametrize("name, error", [
    ("my_sdpa", ValueError), ("SDPA", ValueError), ("eager", ValueError), ("flash_attention_2", ValueError),
    ("", ValueError), ("paged|exact", ValueError), (3, TypeError),
])
def test_register_refuses_names(name, error):
    with pytest.raises(error, match="name"):
        integration.register(name)


def test_unsupported_arguments_are_refused():
    q = torch.randn(1, 2, 3, 8)
    module = torch.nn.Module()
    with pytest.raises(NotImplementedError, match="position_bias"):
        integration.attention_forward(module, q, q, q, None, position_bias=torch.zeros(1, 2, 3, 3))
    with pytest.raises(ValueError, match="query: expected 4 heads"):
        module.num_key_value_groups = 2
        integration.attention_forward(module, q, q, q, None)


def test_importing_sdpa_does_not_import_transformers():
    """The integration is opt-in: `import sdpa` stays free of transformers (checked in a
    fresh interpreter, since this one has imported it)."""
    import subprocess
    import sys

    code = "import sys, sdpa; assert 'transformers' not in sys.modules and 'sdpa.integrations' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert sdpa.__name__ == "sdpa"
