"""Render docs/BENCHMARKS.md (and docs/BENCHMARKS-memory.md) from the latest record of each benchmark.

Usage, from the repository root::

    python benchmarks/render.py            # write the pages
    python benchmarks/render.py --check    # exit 1, with one line, when a page differs from its rendering

A page is its template (``benchmarks/BENCHMARKS.template.md``, ``benchmarks/BENCHMARKS-memory.template.md``:
the prose that says what each section measures and how to read it, no number written by hand) with its
marks filled from the records in ``benchmarks/results/<benchmark>/<date>.json`` (the latest date of each
benchmark; the format is docs/benchmark-records.md). The marks:

``{{run:B}}``           the run's command, date, machine, versions, load and a link to its record
``{{date:B}}``          the run's date
``{{commands:B}}``      the command (or commands) that made the record, as a code block
``{{record:B}}``        a link to the record
``{{table:B.T}}``       the record's table ``T``, as the run printed it
``{{value:B.K.K2}}``    a number of the record (``numbers``, a dotted path)
``{{text:B.K}}``        a sentence the run wrote from its numbers (``text``)
``{{findings:B}}``      what the run shows, in words (``findings``), as bullets

Nothing here imports torch or pipeplan: a page renders from the JSON alone.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path

__all__ = ["PAGES", "latest_records", "render_page", "render_all", "check", "main"]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
PAGES = (
    (ROOT / "benchmarks" / "BENCHMARKS.template.md", "BENCHMARKS.md"),
    (ROOT / "benchmarks" / "BENCHMARKS-memory.template.md", "BENCHMARKS-memory.md"),
)
"""(template, page name in docs/)."""

_RECORD_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}[^/]*\.json$")
_MARK = re.compile(r"\{\{(\w+):([^{}]+)\}\}")


class RenderError(Exception):
    """A mark names a record, table or number that the records do not have."""


def latest_records(results: Path = RESULTS) -> dict[str, tuple[Path, dict]]:
    """Each benchmark's latest record (by its file name, ``<date>[...].json``): ``{benchmark: (path, record)}``."""
    out: dict[str, tuple[Path, dict]] = {}
    for folder in sorted(p for p in results.iterdir() if p.is_dir() and not p.name.startswith(".")):
        names = sorted(p for p in folder.iterdir() if _RECORD_NAME.match(p.name))
        if names:
            record = json.loads(names[-1].read_text(encoding="utf-8"))
            if record.get("format") != "pipeplan.benchmark-record":
                raise RenderError(f"{names[-1]}: not a benchmark record (format {record.get('format')!r})")
            out[folder.name] = (names[-1], record)
    return out


def _fmt(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value)
    return str(value)


def _table(table: dict) -> str:
    columns = table["columns"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in table["rows"]]
    return "\n".join(lines)


def _link(path: Path) -> str:
    """A record as the page links it: its place in the repository, relative to docs/."""
    rel = f"benchmarks/results/{path.parent.name}/{path.name}"
    return f"[{rel}](../{rel})"


def _machine(record: dict) -> str:
    m = record.get("machine") or {}
    parts = [m.get("cpu")]
    if m.get("cores"):
        parts.append(f"{m['cores']} cores")
    if m.get("memory_gib"):
        parts.append(f"{m['memory_gib']} GiB")
    if m.get("gpu"):
        parts.append(m["gpu"])
    return ", ".join(str(p) for p in parts if p) or "machine not recorded"


def _versions(record: dict) -> str:
    v = record.get("versions") or {}
    parts = []
    for key, name in (("torch", "torch"), ("python", "Python"), ("transformers", "transformers")):
        if v.get(key):
            parts.append(f"{name} {v[key]}")
    if v.get("pipeplan"):
        parts.append(f"pipeplan {v['pipeplan']}")
    return ", ".join(parts) or "versions not recorded"


def _load(record: dict) -> str:
    load = record.get("load") or {}
    before, after, conditions = load.get("before"), load.get("after"), load.get("conditions")
    if before is None and after is None:
        text = "load not recorded"
    else:
        text = f"load {_fmt(before) if before is not None else 'not recorded'} before, "
        text += f"{_fmt(after) if after is not None else 'not recorded'} after (1-minute average)"
    return f"{text}; {conditions}" if conditions else text


def _when(record: dict) -> str:
    started, finished = record.get("started"), record.get("finished")
    if started and finished and len(started) > 10:
        return f"{started[:10]} {started[11:16]}-{finished[11:16]} UTC"
    return record["date"]


def _fill(name: str, arg: str, records: dict) -> str:
    benchmark, _, rest = arg.partition(".")
    if benchmark not in records:
        raise RenderError(f"{{{{{name}:{arg}}}}}: no record of benchmark {benchmark!r} in benchmarks/results/")
    path, record = records[benchmark]
    if name == "run":
        line = (
            f"run of {_when(record)}; {_machine(record)}; {_versions(record)}; {_load(record)}. Record: {_link(path)}."
        )
        command = record["command"].rstrip()
        if "\n" in command:
            return f"```bash\n{command}\n```\n\nThe {line}"
        return f"`{command}`: {line}"
    if name == "date":
        return record["date"]
    if name == "record":
        return _link(path)
    if name == "commands":
        return "```bash\n" + record["command"].rstrip() + "\n```"
    if name == "findings":
        found = record.get("findings") or []
        return "\n".join(f"- {f}" for f in found) if found else "- (nothing written about this run yet)"
    if name == "table":
        tables = record.get("tables") or {}
        if rest not in tables:
            raise RenderError(f"{{{{{name}:{arg}}}}}: {path.name} of {benchmark} has no table {rest!r}")
        return _table(tables[rest])
    if name == "text":
        texts = record.get("text") or {}
        if rest not in texts:
            raise RenderError(f"{{{{{name}:{arg}}}}}: {path.name} of {benchmark} has no text {rest!r}")
        return texts[rest]
    if name == "value":
        value: object = record.get("numbers") or {}
        for key in rest.split("."):
            if not isinstance(value, dict) or key not in value:
                raise RenderError(f"{{{{{name}:{arg}}}}}: {path.name} of {benchmark} has no number {rest!r}")
            value = value[key]
        return _fmt(value)
    raise RenderError(
        f"{{{{{name}:{arg}}}}}: unknown mark {name!r} (run, date, record, commands, findings, table, text, value)"
    )


def render_page(template: str, records: dict) -> str:
    """The template with every mark filled from ``records`` (``latest_records``)."""
    return _MARK.sub(lambda m: _fill(m.group(1), m.group(2).strip(), records), template)


def render_all(results: Path = RESULTS, docs: Path = DOCS) -> dict[Path, str]:
    """Every page's rendering: ``{page path: text}``."""
    records = latest_records(results)
    return {docs / page: render_page(t.read_text(encoding="utf-8"), records) for t, page in PAGES}


def check(results: Path = RESULTS, docs: Path = DOCS) -> list[str]:
    """One line for each page that differs from its rendering (empty: all agree)."""
    problems = []
    for path, text in render_all(results, docs).items():
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            old, new = current.splitlines(), text.splitlines()
            changed = [
                op for op in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes() if op[0] != "equal"
            ]
            lines = sum(max(i2 - i1, j2 - j1) for _, i1, i2, j1, j2 in changed)
            problems.append(
                f"{path.name} differs from its rendering: {lines} line(s) in {len(changed)} place(s), "
                f"first at line {changed[0][1] + 1 if changed else 1}; run python benchmarks/render.py"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a page differs from its rendering")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the records (default benchmarks/results)")
    parser.add_argument("--docs", type=Path, default=DOCS, help="where the pages are (default docs)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check(args.results, args.docs)
            for line in problems:
                print(line, file=sys.stderr)
            return 1 if problems else 0
        for path, text in render_all(args.results, args.docs).items():
            path.write_text(text, encoding="utf-8")
            print(f"rendered {path} ({len(text.splitlines())} lines)")
    except (RenderError, OSError, ValueError, KeyError) as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
