"""README's Python examples run as written: the first block of the Python section, then the
extensions' block, which continues it (it uses the first block's q, k and v); and the
"Three ways in" blocks (pip's NumPy example, the transformers one-liner)."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(title="## Python"):
    text = README.read_text()
    section = text[text.index(title + "\n"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_python_example_runs():
    example = python_blocks()[0]
    assert len(example.strip().splitlines()) == 5
    exec(compile(example, str(README), "exec"), {})


def test_readme_extensions_example_runs():
    first, extensions = python_blocks()[:2]
    namespace = {}
    exec(compile(first, str(README), "exec"), namespace)
    exec(compile(extensions, str(README), "exec"), namespace)
    assert tuple(namespace["packed"].shape) == (17, 8, 64)
    assert tuple(namespace["decoded"].shape) == (2, 8, 1, 64)


def test_readme_pip_example_runs_on_numpy():
    pip, _ = python_blocks("## Three ways in")
    namespace = {}
    exec(compile(pip, str(README), "exec"), namespace)
    out = namespace["out"]
    assert type(out).__module__ == "numpy" and out.shape == (1, 8, 128, 64)


def test_readme_transformers_one_liner_runs_on_sdpa(monkeypatch):
    import sdpa.integrations.transformers as integration

    calls = []
    function = integration.scaled_dot_product_attention
    monkeypatch.setattr(integration, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or function(*a, **k))
    _, one_liner = python_blocks("## Three ways in")
    namespace = {}
    exec(compile(one_liner, str(README), "exec"), namespace)
    tokens = namespace["tokens"]
    new = tokens.shape[1] - 3  # 8, or fewer if the random model says its end-of-text token
    assert tokens.shape[0] == 1 and 1 <= new <= 8
    assert namespace["model"].config._attn_implementation == "exact_cpu"
    assert len(calls) == 2 * new  # two layers; the prefill and one step per further token
