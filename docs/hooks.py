"""The site's generated content (an mkdocs hook; see mkdocs.yml).

A page asks for generated content with a marker on a line of its own; the marker is replaced as the page is read:

    <!-- hubgym:train-options -->     every training option, from hubgym.train.config.describe_options
                                      (what `hubgym train --options` prints)
    <!-- hubgym:catalog -->           every env of the registry, from hubgym.envs.catalog (what `hubgym envs` lists)
    <!-- hubgym:row-contract -->      every rule a stored row is held to, from hubgym.schemas.row_contract.rules
    <!-- hubgym:api PACKAGE -->       an mkdocstrings entry for each name PACKAGE exports (its lazy `_EXPORTS`)
    <!-- hubgym:include PATH -->      a Markdown file of the repository (README.md, bench/RESULTS.md) without its title,
                                      its links pointed at the site (docs/x.md -> x.md, bench/RESULTS.md ->
                                      benchmarks.md; other files it links, such as a plot, are copied onto the site)
    <!-- hubgym:section PATH HEADING -->  the body of one section of such a file: the one whose heading starts with
                                      HEADING, up to the next heading of its level or above, with links as above

So the config reference, the catalog and the benchmark figures cannot drift from the code and the measurements.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- hubgym:([a-z-]+)(?: (.+?))? -->$", re.M)
LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")
FENCE = re.compile(r"^(```|~~~)")
SITE_PAGES = {"bench/RESULTS.md": "benchmarks.md"}  # repository files shown as a page of the site


def on_files(files, config):
    """Repository files that included pages link to (a plot in bench/, say) go onto the site at the same path."""
    for source in _included_sources(Path(config["docs_dir"])):
        for path in _linked_files(source):
            if files.get_file_from_path(path) is None:
                files.append(File.generated(config, path, abs_src_path=str(ROOT / path)))
    return files


def on_page_markdown(markdown, page, config, files):
    return MARKER.sub(lambda m: _generate(m.group(1), m.group(2), page.file.src_uri), markdown)


def _generate(kind: str, argument: str | None, page: str) -> str:
    if kind == "train-options":
        return options_table()
    if kind == "catalog":
        return catalog_tables()
    if kind == "row-contract":
        return row_contract_table()
    if kind == "api" and argument:
        return api_entries(argument)
    if kind == "include" and argument:
        return include(argument)
    if kind == "section" and argument and " " in argument:
        return section(*argument.split(" ", 1))
    raise ValueError(f"{page}: unknown marker 'hubgym:{kind} {argument or ''}'; known: train-options, catalog, "
                     "row-contract, api PACKAGE, include PATH, section PATH HEADING")


def _cell(text: str) -> str:
    """Text as one table cell: pipes escaped, and brackets, which Markdown (and autorefs) would read as links."""
    return re.sub(r"([|\[\]])", r"\\\1", text).replace("\n", " ")


def _code(text: str) -> str:
    """Text for a code span in a table cell: only its pipes escaped (a code span shows anything else as it is)."""
    return text.replace("|", "\\|")


def options_table() -> str:
    """Every option of the training config: key, default, description (the table `hubgym train --options` prints)."""
    from hubgym.train.config import describe_options

    rows = [f"| `{key}` | `{_code(default)}` | {_cell(text)} |" for key, default, text in describe_options()]
    return "\n".join(["| option | default | what it does |", "| --- | --- | --- |", *rows])


def row_contract_table() -> str:
    """Every rule of the row contract: name, column, what it says."""
    from hubgym.schemas.row_contract import rules

    rows = [f"| `{name}` | `{column}` | {_cell(says)} |" for name, column, says in rules()]
    return "\n".join(["| rule | column | what it says |", "| --- | --- | --- |", *rows])


def catalog_tables() -> str:
    """Every env of the registry (built-ins, each family, entry points), one table per source."""
    from hubgym.envs.catalog import catalog

    by_source: dict[str, list] = {}
    for entry in catalog():
        by_source.setdefault(entry.source, []).append(entry)
    out = [f"{sum(map(len, by_source.values()))} envs: "
           + ", ".join(f"{len(entries)} {source}" for source, entries in by_source.items()) + "."]
    for source, entries in by_source.items():
        out += ["", f"### {source} ({len(entries)})", "", "| env | kind | configs | description |",
                "| --- | --- | --- | --- |"]
        for e in entries:
            what = f"failed to load: {e.error}" if e.error else e.description
            configs = ", ".join(f"`{c}`" for c in e.configs)
            out.append(f"| `{e.name}` | {e.kind or '-'} | {configs or '-'} | {_cell(what)} |")
    return "\n".join(out)


def api_entries(package: str) -> str:
    """An mkdocstrings entry per exported name of `package`, grouped by the module that defines it.

    hubgym's packages export lazily (a `_EXPORTS` table read by `__getattr__`), which a static reader cannot follow:
    each name is traced here to the module that defines it."""
    exports = importlib.import_module(package)._EXPORTS
    where: dict[str, list[str]] = {}
    for name in sorted(exports, key=str.lower):
        path = _defined_at(package, name)
        where.setdefault(path.rsplit(".", 1)[0], []).append(path)
    out = []
    for module, paths in sorted(where.items()):
        out += [f"## `{module}`", ""]
        out += [f"::: {path}\n    options:\n      heading_level: 3\n" for path in paths]
    return "\n".join(out)


def _defined_at(module: str, name: str) -> str:
    """The dotted path where `name`, exported by `module`, is defined (following lazy tables and re-exports)."""
    mod = importlib.import_module(module)
    target = getattr(mod, "_EXPORTS", {}).get(name)
    if target and target != module:
        return _defined_at(target, name)
    obj = getattr(mod, name)
    home, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(home, str) and qualname == name and home.startswith("hubgym"):
        return f"{home}.{name}"
    return f"{module}.{name}"


def _included_sources(docs: Path) -> set[str]:
    return {m.group(2).split(" ")[0] for page in docs.rglob("*.md") for m in MARKER.finditer(page.read_text())
            if m.group(1) in ("include", "section")}


def include(path: str) -> str:
    """The file's Markdown for a page at the site's root: its title left out, links pointed at the site."""
    lines = (ROOT / path).read_text().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return _on_site(path, lines)


def section(path: str, heading: str) -> str:
    """The body of the section of `path` whose heading starts with `heading` (its heading left out)."""
    lines = (ROOT / path).read_text().splitlines()
    found = [i for i, line in enumerate(lines) if re.match(rf"^(#+) {re.escape(heading)}", line)]
    if len(found) != 1:
        raise ValueError(f"{path}: {len(found)} headings start with {heading!r}; name exactly one")
    level = len(lines[found[0]]) - len(lines[found[0]].lstrip("#"))
    end = next((i for i in range(found[0] + 1, len(lines))
                if re.match(rf"^#{{1,{level}}} ", lines[i]) and not _in_fence(lines, i)), len(lines))
    return _on_site(path, lines[found[0] + 1:end])


def _in_fence(lines: list[str], index: int) -> bool:
    return sum(1 for line in lines[:index] if FENCE.match(line)) % 2 == 1


def _on_site(path: str, lines: list[str]) -> str:
    out, fenced = [], False
    for line in lines:
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            line = LINK.sub(lambda m: m.group(1) + _site_link(path, m.group(2)) + m.group(3), line)
        out.append(line)
    return "\n".join(out)


def _site_link(source: str, target: str) -> str:
    if re.match(r"^[a-z]+:", target):  # a URL
        return target
    path = (Path(source).parent / target).as_posix()
    path = re.sub(r"^(\./)+", "", path)
    if path.startswith("docs/"):
        return path[len("docs/"):]
    return SITE_PAGES.get(path, path)


def _linked_files(source: str) -> list[str]:
    """Repository files (not pages) that `source` links to, as paths from the repository's root."""
    text = (ROOT / source).read_text()
    found = []
    for m in LINK.finditer(text):
        path = _site_link(source, m.group(2))
        if not path.endswith(".md") and not re.match(r"^[a-z]+:", path) and (ROOT / path).is_file():
            found.append(path)
    return found
