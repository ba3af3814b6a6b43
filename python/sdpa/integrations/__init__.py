"""sdpa inside other frameworks. Each submodule imports its framework, so importing
`sdpa` (or this package) never does:

    from sdpa.integrations import transformers   # Hugging Face transformers' AttentionInterface
"""
