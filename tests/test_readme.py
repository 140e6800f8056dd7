"""README.md stays true: every ```python block runs and prints the ```text block
right after it, and the quick start's commands are the ones .ci/run runs."""

import contextlib
import io
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _fenced_blocks(text):
    """(language, body, index of the opening line, index of the closing line) per block."""
    blocks, opened = [], None
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if opened is None:
            opened = (line[3:].strip(), number)
        else:
            language, start = opened
            blocks.append((language, "\n".join(lines[start + 1:number]), start, number))
            opened = None
    assert opened is None, "README.md has an unclosed ``` block"
    return blocks


def _python_examples():
    blocks = _fenced_blocks(README)
    lines = README.splitlines()
    examples = []
    for (language, code, start, end), following in zip(blocks, blocks[1:] + [None]):
        if language != "python":
            continue
        expected = None
        if following is not None and following[0] == "text":
            between = lines[end + 1:following[2]]
            if not any(line.strip() for line in between):
                expected = following[1]
        # Padded with blank lines so that a traceback names the README's own line numbers.
        examples.append(pytest.param("\n" * (start + 1) + code, expected, id=f"line{start + 1}"))
    return examples


@pytest.mark.parametrize("code, expected", _python_examples())
def test_python_block_runs_and_prints_what_the_readme_shows(code, expected):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    if expected is not None:
        assert printed.getvalue().rstrip() == expected.rstrip()


def test_quick_start_is_two_commands_that_ci_runs_verbatim():
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = _fenced_blocks(quick_start)
    assert len(blocks) == 1
    language, body, _, _ = blocks[0]
    commands = body.splitlines()
    assert language == "bash" and len(commands) == 2
    ci_commands = [line.split(" || ")[0] for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in commands:
        assert command in ci_commands, f"{command!r} is in README.md's quick start but not in .ci/run"
