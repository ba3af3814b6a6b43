"""README's Python example runs as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs():
    text = README.read_text()
    section = text[text.index("## Python"):]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(example.strip().splitlines()) == 5
    exec(compile(example, str(README), "exec"), {})
