"""The docs site's build hook (mkdocs.yml ``hooks``): the repository files the docs link to
(``../examples/slurm/dualtrain.sbatch``, ``../configs/digits_cnn.yaml``) are added to the site
under ``repo/``, and each link is pointed there, so the site has no broken link and the docs stay
readable on GitHub, where those relative links already work."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
#: a Markdown link to a file outside docs/: ``](../path)`` or ``](../path#anchor)``
OUTSIDE = re.compile(r"\]\(\.\./([^)#\s]+)")
#: where those files go in the site
SITE_DIR = "repo"


def linked(docs: Path) -> set[str]:
    """The repository paths the docs link to outside docs/."""
    return {m.group(1) for md in docs.glob("*.md") for m in OUTSIDE.finditer(md.read_text())}


def on_files(files: Files, config: Any) -> Files:
    docs = Path(config["docs_dir"])
    for path in sorted(linked(docs)):
        if not (ROOT / path).is_file():
            continue  # left as it is: the strict build names the broken link
        files.append(File.generated(config, f"{SITE_DIR}/{path}", abs_src_path=str(ROOT / path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return OUTSIDE.sub(lambda m: f"]({SITE_DIR}/{m.group(1)}", markdown)
