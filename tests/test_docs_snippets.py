"""Every code block of README.md and docs/*.md runs as written, offline, so a snippet cannot drift from the code.

- A ```python block runs in one namespace per file, in the file's order (the README's quickstart loads the
  model the later blocks use); a block of ``>>>`` lines runs as a doctest in that namespace.
- A ```bash block runs its ``captum-cw`` commands (in-process, in a scratch folder); the other commands of a
  block (installs, launchers, the test suite itself) are not run, and a block with none of them is skipped.
- A block marked by an HTML comment on the line before it, invisible once rendered, is skipped with its reason:
  ``<!-- snippet: network -->`` (needs the hub), ``<!-- snippet: gpu -->`` (runs where CUDA is available),
  ``<!-- snippet: long -->`` (a long run: see benchmarks/), ``<!-- snippet: regenerated -->`` (a report of kept
  runs that rewrites its page: tests/test_docs_regenerate.py runs it on copies).
"""

from __future__ import annotations

import doctest
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKS = {
    "network": "needs the network (a hub id or an online install)",
    "gpu": "needs a CUDA device",
    "long": "long run: see benchmarks/",
    "worked-example": "run by tests/test_extending.py, in a scratch metric registry",
    "regenerated": "run by tests/test_docs_regenerate.py, on copies of the page and its kept runs",
}
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!-- snippet: (\S+) -->$")
NOT_RUN = ("pip install", "bash .ci/install", "python3 -m pytest", "accelerate launch")  # installs and launchers


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    mark: str | None  # the snippet mark on the line before the fence

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    r"""The fenced ``python`` and ``bash`` blocks of a Markdown file, in order, with their marks."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, start, language = [], None, ""
    for number, line in enumerate(lines):
        fence = FENCE.match(line)
        if not fence:
            continue
        if start is None:
            start, language = number, fence[1]
            continue
        if language in ("python", "bash"):
            before = MARK.match(lines[start - 1].strip()) if start else None
            found.append(Block(path, start + 1, language, "\n".join(lines[start + 1:number]) + "\n",
                               before[1] if before else None))
        start = None
    return found


BLOCKS = [block for path in FILES for block in blocks(path)]


def blocks_of(text: str, tmp_path: Path) -> list[tuple[str, str | None, str]]:
    path = tmp_path / "x.md"
    path.write_text(text)
    return [(block.language, block.mark, block.code) for block in blocks(path)]


def test_every_block_is_found_with_its_mark(tmp_path):
    text = ("# t\n```python\nx = 1\n```\n```\nnot code\n```\n<!-- snippet: gpu -->\n```bash\necho\n```\n"
            "```text\nno\n```\n")
    assert blocks_of(text, tmp_path) == [("python", None, "x = 1\n"), ("bash", "gpu", "echo\n")]
    assert {block.path.name for block in BLOCKS} >= {"README.md", "INSEQ.md", "SINKS.md"}
    assert sum(block.language == "python" for block in BLOCKS if block.path.name == "README.md") >= 6
    unknown = [f"{block.name}: {block.mark}" for block in BLOCKS if block.mark and block.mark not in MARKS]
    assert not unknown, f"marks must be one of {sorted(MARKS)}: {unknown}"


def skip_reason(block: Block) -> str | None:
    if block.mark == "gpu":
        return None if torch.cuda.is_available() else MARKS["gpu"]
    return MARKS.get(block.mark) if block.mark else None


@dataclass
class FileRun:
    r"""The namespace a file's Python blocks share, and how far they have run."""

    folder: Path
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "__snippet__"})
    done: int = 0
    failed: str | None = None


RUNS: dict[Path, FileRun] = {}


def run_python(block: Block, namespace: dict[str, Any]) -> None:
    if any(line.lstrip().startswith(">>>") for line in block.code.splitlines()):
        test = doctest.DocTestParser().get_doctest(block.code, namespace, block.name, str(block.path), block.line)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        runner.run(test, clear_globs=False)
        assert not runner.failures, f"{block.name}: {runner.failures} doctest example(s) failed"
        return
    exec(compile(block.code, block.name, "exec"), namespace)


def captum_cw_commands(code: str) -> list[list[str]]:
    r"""The ``captum-cw`` commands of a bash block as argument lists (continued lines joined, comments cut,
    ``&&`` chains split); every other command is left out."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            argv, words = (words[:words.index("&&")], words[words.index("&&") + 1:]) if "&&" in words else (words, [])
            if argv[0] == "captum-cw":
                commands.append(argv[1:])
            elif not " ".join(argv).startswith(NOT_RUN):
                raise AssertionError(f"a command that is neither captum-cw nor an install or launcher: {argv}")
    return commands


def test_commands_are_read_as_a_shell_reads_them():
    code = ('bash .ci/install && captum-cw attribute "The capital" --out h.png   # a comment\n'
            'captum-cw attribute "x" --layers -1 \\\n    --csv s.csv\npip install -e .\n')
    assert captum_cw_commands(code) == [["attribute", "The capital", "--out", "h.png"],
                                        ["attribute", "x", "--layers", "-1", "--csv", "s.csv"]]


LOADED: dict[tuple, Any] = {}


def loaded_once(name: str, **options: Any) -> Any:
    r"""``load_model``, once per model and options for all the commands (they only read the model)."""
    from captum_cw.models import load_model

    key = (name, *sorted(options.items(), key=str))
    if key not in LOADED:
        LOADED[key] = load_model(name, **options)
    return LOADED[key]


@pytest.mark.slow  # loads SmolLM2 and runs the README's examples on it (2-3 minutes on 2 shared cores)
@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_the_block_runs_as_written(block, tmp_path_factory, monkeypatch):
    from captum_cw import architectures

    if reason := skip_reason(block):
        pytest.skip(reason)
    monkeypatch.setattr(architectures, "_ARCHITECTURES", dict(architectures._ARCHITECTURES))  # registrations undone
    monkeypatch.setenv("TQDM_DISABLE", "1")
    if block.language == "bash":
        commands = captum_cw_commands(block.code)
        if not commands:
            pytest.skip("installs or launchers only: no captum-cw command to run")
        from captum_cw import cli

        monkeypatch.setattr(cli, "load_model", loaded_once)
        monkeypatch.chdir(tmp_path_factory.mktemp("bash"))
        for argv in commands:
            assert cli.main(argv) == 0, argv
        return
    run = RUNS.setdefault(block.path, FileRun(tmp_path_factory.mktemp(block.path.stem)))
    monkeypatch.chdir(run.folder)  # what a block writes (view.html...) stays out of the checkout
    mine = [b for b in BLOCKS if b.path == block.path and b.language == "python"]
    for earlier in mine[run.done: mine.index(block) + 1]:
        if run.failed:
            pytest.fail(f"{run.failed} failed, and {block.name} builds on it")
        if skip_reason(earlier) is None:
            try:
                run_python(earlier, run.namespace)
            except BaseException:
                run.failed = earlier.name
                raise
        run.done += 1
