"""The docs site's two additions to MkDocs (``mkdocs.yml``): pages from outside ``docs/``,
and docstrings written in reST read as Markdown.

The pages in ``docs/`` are written for the repository's web page and a checkout: they link
to ``../examples/flask_app.py`` and the README links to ``docs/concepts.md``. The site has no
files outside ``docs/``, so the hooks below add the README (as the home page), the
changelog and each example (as a page showing its source), and point every relative link
that leaves ``docs/`` at the page that now stands for its target. A link to anything else
outside ``docs/`` is left alone, and the strict build fails on it.

The docstrings use Sphinx's roles (``:class:`~keyturn.Scope```), which Markdown would show
as they are: :class:`ReSTRoles` turns them into cross-references the build checks.
"""

from __future__ import annotations

import ast
import posixpath
import re
import textwrap
from pathlib import Path
from typing import Any, Final

import griffe
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT: Final = Path(__file__).resolve().parent
DOCS: Final = ROOT / "docs"
EXAMPLES: Final = ROOT / "examples"

# A repository path outside docs/ -> the site page standing for it.
_PAGES: Final = {
    "README.md": "index.md",
    "CHANGELOG.md": "changelog.md",
    "examples": "examples/index.md",
    **{f"examples/{path.name}": f"examples/{path.stem}.md" for path in EXAMPLES.glob("*.py")},
}
# The repository file each generated page comes from (docs/ pages come from themselves).
_SOURCES: dict[str, Path] = {}

_LINK: Final = re.compile(r"\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")


def _summary(path: Path) -> str:
    """The first line of a module's docstring."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return docstring.partition("\n")[0]


def _example_page(path: Path) -> str:
    source = path.read_text(encoding="utf-8")
    return f"# `examples/{path.name}`\n\n{_summary(path)}\n\n```python\n{source}```\n"


def _examples_index() -> str:
    lines = [
        "# Examples",
        "",
        "The list-models API behind keyturn, once per framework. Each file is a",
        "`create_app(authenticator)` to copy, and serves as it is:",
        "`KEYTURN_STORE_URL=sqlite:///keyturn.sqlite3 python examples/starlette_app.py`.",
        "",
    ]
    for path in sorted(EXAMPLES.glob("*.py")):
        lines.append(f"- [`{path.name}`]({path.stem}.md): {_summary(path)}")
    return "\n".join(lines) + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the README, the changelog and the examples to the site's pages."""
    generated = {
        "index.md": (ROOT / "README.md", (ROOT / "README.md").read_text(encoding="utf-8")),
        "changelog.md": (ROOT / "CHANGELOG.md", (ROOT / "CHANGELOG.md").read_text("utf-8")),
        "examples/index.md": (EXAMPLES, _examples_index()),
    }
    for path in EXAMPLES.glob("*.py"):
        generated[f"examples/{path.stem}.md"] = (path, _example_page(path))
    for uri, (source, content) in generated.items():
        _SOURCES[uri] = source
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Point each relative link that leaves ``docs/`` at the page standing for its target."""
    uri = page.file.src_uri
    source = _SOURCES.get(uri, DOCS / uri)
    here = source if source.is_dir() else source.parent

    def relink(match: re.Match[str]) -> str:
        target = match["target"]
        if ":" in target:  # a URL
            return match[0]
        resolved = (here / target).resolve()
        if resolved.is_relative_to(DOCS):
            site_path = resolved.relative_to(DOCS).as_posix()
        elif (page_uri := _PAGES.get(resolved.relative_to(ROOT).as_posix())) is not None:
            site_path = page_uri
        else:
            return match[0]
        relative = posixpath.relpath(site_path, posixpath.dirname(uri) or ".")
        return f"]({relative}{match['anchor'] or ''})"

    # ``python no-run`` marks a block the docs tests type-check but do not run; to Markdown
    # the words after the language are no fence it knows, so the marker goes.
    return _NO_RUN.sub(r"\g<fence>", _LINK.sub(relink, markdown))


_NO_RUN: Final = re.compile(r"^(?P<fence>```python) no-run$", re.MULTILINE)


# --- Docstrings --------------------------------------------------------------------------

# :class:`~keyturn.Scope`, :func:`open_database`, :meth:`title <Console.asgi>` ...
_ROLE: Final = re.compile(
    r":(?:class|func|meth|mod|attr|data|exc|obj):`(?P<tilde>~?)"
    r"(?:(?P<title>[^`<]*?)\s*<(?P<target>[^`>]+)>|(?P<ref>[^`]+))`"
)
# A reST section title at the top of a module docstring: the page's heading names the module.
_TITLE: Final = re.compile(r"\A\s*[^\n]+\n=+\n")


def _role(match: re.Match[str]) -> str:
    """A role as a cross-reference, or as code when its target is not in the reference.

    The reference covers keyturn's public names: a private module's name or another
    package's has no page to link to.
    """
    ref = (match["target"] or match["ref"]).removesuffix("()")
    shown = match["title"] or (ref.rpartition(".")[2] if match["tilde"] else ref)
    dotted = "." in ref
    if (dotted and not ref.startswith("keyturn.")) or "._" in ref:
        return f"`{shown}`"
    return f"[`{shown}`][{ref}]"


def _language(code: str) -> str:
    """``python`` for a block that parses as Python, else ``text``."""
    try:
        ast.parse(code)
    except SyntaxError:
        return "text"
    return "python"


def _literal_blocks(text: str) -> str:
    """reST's ``::`` paragraph ending and the indented block after it, as Markdown: a colon
    (or nothing, after a space or alone) and a fenced block, highlighted if it is Python."""
    lines, out, index = text.split("\n"), [], 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.rstrip().endswith("::"):
            out.append(line)
            continue
        intro = line.rstrip()[:-2]
        if intro.strip():
            out.append(intro.rstrip() if intro.endswith(" ") else f"{intro}:")
        indent = len(line) - len(line.lstrip())
        block: list[str] = []
        while index < len(lines) and (
            not lines[index].strip() or len(lines[index]) - len(lines[index].lstrip()) > indent
        ):
            block.append(lines[index])
            index += 1
        code = textwrap.dedent("\n".join(block)).strip("\n")
        fence = " " * indent + "```"
        out += ["", f"{fence}{_language(code)}", textwrap.indent(code, " " * indent), fence, ""]
    return "\n".join(out)


_DUNDER: Final = re.compile(r"__\w+__")


class ReSTRoles(griffe.Extension):
    """Sphinx roles become autorefs cross-references, ``::`` blocks fenced code; reST titles
    go. Dunder methods (``__repr__``, ``__call__``) are left out of the reference: the
    ``public`` filter keeps them, and they say nothing a reader calls; ``__init__`` stays,
    merged into its class."""

    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        for name in [name for name in cls.members if _DUNDER.fullmatch(name)]:
            if name != "__init__":
                del cls.members[name]

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        text = _TITLE.sub("", obj.docstring.value) if obj.is_module else obj.docstring.value
        obj.docstring.value = _literal_blocks(_ROLE.sub(_role, text))
