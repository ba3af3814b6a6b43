"""README's Python examples run as written: the first block of the Python section, then the
extensions' block, which continues it (it uses the first block's q, k and v)."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks():
    text = README.read_text()
    section = text[text.index("## Python"):]
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
