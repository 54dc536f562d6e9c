"""The docs' Python blocks against the real package (tools/doc_python.py): the pages hold, and
each kind of mistake a page could make is caught (a keyword renamed, a signature out of date, an
error message changed, a block that does not compile)."""

from __future__ import annotations

from tools.doc_python import blocks, mistakes
from tools.prose import PAGES

API = next(p for p in PAGES if p.name == "python-api.md")


def test_every_python_block_of_the_docs_holds():
    assert mistakes() == []


def test_the_checks_see_the_pages_blocks():
    kinds = [b.kind for page in PAGES for b in blocks(page)]
    assert kinds.count("code") >= 15 and kinds.count("session") >= 1
    assert kinds.count("signature") >= 3  # run, resume, compare's three overloads


def _page(tmp_path, text: str):
    page = tmp_path / "page.md"
    page.write_text(text)
    return (page,)


def test_a_keyword_the_function_does_not_take_is_named(tmp_path):
    page = _page(
        tmp_path,
        "```python\nrec = dualtrain.audit.torch_recorder('out', model=m, schedular=s)\n"
        "dualtrain.run('c.yaml', 'torch', trian={'epochs': 1})\n```\n",
    )
    found = mistakes(page)
    assert len(found) == 2, found
    assert "torch_recorder takes no keyword schedular=" in found[0]
    assert "dualtrain.run takes no keyword trian=" in found[1]  # not a spec section either
    assert mistakes(_page(tmp_path, "```python\ndualtrain.run('c', train={})\n```\n")) == []


def test_a_signature_out_of_date_is_named(tmp_path):
    text = API.read_text()
    start = text.index("dualtrain.resume(run_dir, *,")
    stale = text[:start] + text[start:].replace("world_size=None, ", "", 1)
    found = mistakes(_page(tmp_path, stale))
    assert len(found) == 1 and "not documented: ['world_size']" in found[0], found


def test_a_changed_error_message_is_named(tmp_path):
    text = API.read_text().replace("must be > 0. Received: -1.0", "must be positive", 1)
    found = mistakes(_page(tmp_path, text))
    assert len(found) == 1 and "optimizer.lr must be > 0. Received: -1.0" in found[0], found


def test_a_block_that_does_not_compile_is_named(tmp_path):
    found = mistakes(_page(tmp_path, "```python\nrec = dualtrain.audit.torch_recorder(\n```\n"))
    assert len(found) == 1 and "does not compile" in found[0], found
