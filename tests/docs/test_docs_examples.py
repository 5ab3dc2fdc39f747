"""Every fenced code block of the docs runs here, or says why not: README.md, docs/**/*.md and the packages'
READMEs, so no example goes stale.

How a block is treated (markers are HTML comments right above it: tests/helpers/doc_blocks.py):

- ``<!-- not run: REASON -->``: not run (a GPU, a download, minutes of CPU, sample output); the reason is required.
- ``<!-- run by PATH -->``: another test runs it; PATH must exist and hold the block's commands (or name the doc).
- ``python``: run in a child process (cwd: an empty folder); a block that names http://127.0.0.1:8000 gets a
  ``llaisys serve`` of the demo model there.
- ``bash`` / ``sh``: each command in turn. ``llaisys ...`` runs (``bench`` with one repetition, ``bench serve``
  with 4 short requests; ``--chat`` reads one line); ``llaisys serve ...`` starts in the background on a free
  port until /health answers, the block's later commands (``curl`` with ``--fail-with-body``) talk to it, then
  it is stopped and must exit 0; ``pip install`` / ``pip wheel`` are not run: the folders they name must be
  packages of this repository; ``python -c`` runs. Anything else fails: mark it.
- ``json``: must parse. Any other language must be marked.
- ``<!-- slow -->``: only with the slow tests. ``<!-- expect: TEXT -->``: the output contains TEXT.

Placeholders ``path/to/model`` (a HF directory), ``path/to/model.gguf`` and ``path/to/draft-model`` stand for tiny
random models made here. Indented code blocks are refused: nothing could mark them.
"""

from __future__ import annotations

import re

import pytest

from helpers.doc_blocks import ROOT, blocks, doc_files
from helpers.doc_runner import DocChecker, shell_commands

FILES = [path for path in doc_files() if path.is_file()]
BLOCKS = [block for path in FILES for block in blocks(path)[0]]


def _param(block):
    return pytest.param(block, id=block.where, marks=[pytest.mark.slow] if block.slow else [])


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    checker = DocChecker(tmp_path_factory.mktemp("docs"))
    yield checker
    checker.close()


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_block(checker, block):
    checker.check(block)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_indented_code_blocks(path):
    """An indented code block cannot carry a language or stand under a marker: the docs use fenced ones."""
    indented = blocks(path)[1]
    assert not indented, f"{path.relative_to(ROOT)}: indented code blocks at lines {indented}: fence them (```bash)"


def test_the_readme_s_test_command_is_what_ci_runs():
    """.ci/run runs the README's test command: the README's block marked `run by .ci/run` holds exactly the
    commands of .ci/run, in order."""
    readme = [b for b in blocks(ROOT / "README.md")[0] if b.run_by == ".ci/run"]
    assert len(readme) == 1, "README.md has no block (or several) marked <!-- run by .ci/run -->"
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert [" ".join(c) for c in shell_commands(readme[0].text)] == [" ".join(c) for c in shell_commands("\n".join(ci))]


# -- the test of the test: a doc with a broken command fails ----------------------------------------------

FAKE_DOC = """# A fake guide

```bash
llaisys devices
```

<!-- expect: 46 -->
```bash
llaisys generate --prompt "12+34="
```

```bash
llaisys generate --no-such-flag
```

```python
import llaisys_models
raise SystemExit(llaisys_models.load("path/to/nowhere") and 0)
```

```text
some output
```

<!-- not run: sample output -->
```text
some output
```

<!-- not run: -->
```bash
true
```

<!-- run by tests/no_such_test.py -->
```bash
llaisys devices
```

```bash
pip install ./llaisys-core ./no-such-package
```

```bash
rm -rf /tmp/something
```

<!-- expect: 47 -->
```bash
llaisys generate --prompt "12+34="
```

```bash
llaisys serve --model no/such/model
curl http://127.0.0.1:8000/health
```

    llaisys generate --prompt "indented"
"""


def test_the_checker_fails_a_doc_whose_command_errors(checker, tmp_path):
    doc = tmp_path / "fake.md"
    doc.write_text(FAKE_DOC)
    found, indented = blocks(doc)
    outcomes = []
    for block in found:
        try:
            checker.check(block)
            outcomes.append("ok")
        except AssertionError as e:
            outcomes.append(str(e))
    assert outcomes[:2] == ["ok", "ok"], outcomes  # llaisys devices; the demo adds
    assert "`llaisys generate --no-such-flag` exited with status 2" in outcomes[2]
    assert "ModelLoadError" in outcomes[3] or "exited with status 1" in outcomes[3]
    assert "no rule runs a block of this language" in outcomes[4]
    assert outcomes[5] == "ok"  # marked not run, with a reason
    assert "must say why" in outcomes[6]
    assert "no such file" in outcomes[7]
    assert "paths the repository does not have: ['./no-such-package']" in outcomes[8]
    assert "no rule runs `rm -rf /tmp/something`" in outcomes[9]
    assert "does not contain '47'" in outcomes[10]
    assert "`llaisys serve --model no/such/model --port 0` exited before it answered /health" in outcomes[11]
    assert len(outcomes) == 12 and len(indented) == 1


# -- links --------------------------------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path) -> set[str]:
    """The anchors GitHub makes of a markdown file's headings: lower case, punctuation but - and _ dropped,
    spaces as hyphens; a repeated heading gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        heading = re.match(r"#{1,6} (.*)", line)
        if heading and not in_fence:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "")
            slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            out.add(slug if count == 0 else f"{slug}-{count}")
    return out


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_point_at_what_exists(path):
    """Every relative link of the docs names a file (or folder) of the repository and, after #, one of its headings."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{path.relative_to(ROOT)}: broken links: {broken}"
