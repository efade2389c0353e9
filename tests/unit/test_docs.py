"""The docs a newcomer reads: docs/variables.md is what the argument specs give (scripts/docs/variables.py), every
link of README.md, docs/ and the role READMEs resolves (a file of the repository, and its heading when the link names
one), and README.md stays a short front page."""
import importlib.util
import re
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_variables", REPO / "scripts" / "docs" / "variables.py")
variables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(variables)

LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md")) + sorted(REPO.glob("roles/*/README.md"))


def test_variables_md_is_what_the_argument_specs_give():
    assert variables.main(["--check"]) == 0, "docs/variables.md is stale: run scripts/docs/variables.py"


def test_the_staleness_check_fails_when_a_spec_changes(tmp_path, capsys):
    roles = tmp_path / "roles"
    shutil.copytree(REPO / "roles", roles, ignore=shutil.ignore_patterns("*.j2", "files", "templates", "tasks"))
    spec = roles / "etcd" / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text().replace('default: "3.6.14"', 'default: "3.6.99"', 1))
    changed = variables.render(roles)
    assert changed != variables.render(REPO / "roles")
    assert "| `etcd_version` | str | `3.6.99` |" in changed
    out = tmp_path / "variables.md"
    out.write_text(variables.render(REPO / "roles"))
    old = variables.OUT
    try:
        variables.OUT = out
        out.write_text(changed)
        assert variables.main(["--check"]) == 1
        assert "docs/variables.md is stale" in capsys.readouterr().err
    finally:
        variables.OUT = old


def slug(heading):
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", lambda m: "_" if m.group(0) == "_" else "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def links(doc):
    """Every relative link target of DOC (outside code blocks): (path, anchor)."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http(s), mailto: not fetched here
        path, _, anchor = target.partition("#")
        yield path, anchor


def broken_links(docs):
    out = []
    for doc in docs:
        for path, anchor in links(doc):
            target = (doc.parent / path).resolve() if path else doc
            if not target.exists():
                out.append("%s: %s (no such file)" % (doc.relative_to(REPO), path))
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                out.append("%s: %s#%s (no such heading)" % (doc.relative_to(REPO), path, anchor))
    return out


def test_every_link_of_the_docs_resolves():
    assert broken_links(DOCS) == []


def test_a_broken_link_is_found(tmp_path):
    doc = tmp_path / "doc.md"
    (tmp_path / "there.md").write_text("# A heading\n")
    doc.write_text("[ok](there.md#a-heading) [gone](missing.md) [no heading](there.md#nope) [web](https://x.org)\n")
    global REPO
    old, REPO = REPO, tmp_path
    try:
        assert broken_links([doc]) == ["doc.md: missing.md (no such file)", "doc.md: there.md#nope (no such heading)"]
    finally:
        REPO = old


@pytest.mark.parametrize("heading, anchor", [("## The store tier fails open (built)", "the-store-tier-fails-open-built"),
                                             ("### `vllm_model`: a path", "vllm_model-a-path")])
def test_slug_is_githubs(heading, anchor):
    assert slug(heading.lstrip("#")) == anchor


def test_readme_is_a_short_front_page_with_the_picture():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "```mermaid" in readme
    order = ["```mermaid", "## Quick start", "## Tests", "## Deploying", "## Day 2", "## Documentation"]
    assert [readme.index(s) for s in order] == sorted(readme.index(s) for s in order)


def test_every_doc_says_whom_it_is_for_and_is_in_the_index():
    index = (REPO / "docs" / "README.md").read_text()
    for doc in sorted((REPO / "docs").glob("*.md")):
        lines = doc.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[2].startswith("For: "), doc.name
        if doc.name != "README.md":
            assert "(%s)" % doc.name in index, "%s is not in docs/README.md" % doc.name
