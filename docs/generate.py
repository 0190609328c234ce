"""The docs' reference pages, generated from the code at build time (a MkDocs hook, ``mkdocs.yml``), so
that none can go stale: the configuration table from :class:`service.settings.Settings`, the HTTP API from
the app's OpenAPI schema, the alert table from ``deploy/prometheus/alerts.yml`` and the metrics from the
Prometheus registry. A page asks for one with a marker line, ``<!-- generated: NAME -->``.

``python -m docs.generate NAME`` prints one of them (``openapi.json`` prints the schema itself).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# mkdocs loads this file by path: the repository's packages are importable from a checkout without install.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"^<!-- generated: ([\w.-]+) -->$", re.MULTILINE)
# The results' figures are pages' images where they are written (results/), not copies under docs/.
FIGURES = ("results/*/*.png",)


def _cell(text: object) -> str:
    """``text`` fit for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --- configuration ----------------------------------------------------------------------------------------


def _type_name(annotation: Any) -> str:
    """``int``, ``path``, ``SecretStr | None``: the annotation without its modules."""
    name = getattr(annotation, "__name__", None) or str(annotation)
    return re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", {"Path": "path"}.get(name, name))


def _default(name: str, field: Any) -> str:
    if field.default_factory is not None:
        return "computed at start-up"
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if name.endswith("_bytes") and isinstance(value, int):
        return f"`{value}` ({_binary_size(value)})"
    return f"`{value}`"


def _binary_size(count: int) -> str:
    """``8388608`` reads ``8 MiB``: sizes are set in bytes, and read in binary units."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale and count % scale == 0:
            return f"{count // scale} {unit}"
    return f"{count} bytes"


def _bounds(field: Any) -> str:
    """The field's limits, from pydantic's constraints (``ge=1`` reads ``>= 1``)."""
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    found = []
    for constraint in field.metadata:
        for attribute, sign in signs.items():
            if (bound := getattr(constraint, attribute, None)) is not None:
                found.append(f"{sign} {bound}")
    return ", ".join(found)


def settings_table() -> str:
    """Every :class:`~service.settings.Settings` field: its variable, type, default, bounds, description."""
    from service.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    rows = [
        (
            f"`{prefix}{name.upper()}`",
            _type_name(field.annotation),
            _default(name, field),
            _bounds(field),
            field.description or "",
        )
        for name, field in Settings.model_fields.items()
    ]
    return _table(("variable", "type", "default", "bounds", "what it sets"), rows)


# --- the HTTP API -----------------------------------------------------------------------------------------


def openapi_schema() -> dict[str, Any]:
    """The service's OpenAPI schema, as ``/openapi.json`` serves it (without a model's example body)."""
    from service.app import create_app
    from service.settings import Settings

    return create_app(Settings(model_dir=ROOT / "models", log_level="warning")).openapi()


def _schema_name(content: dict[str, Any]) -> str:
    names = []
    for media_type, body in content.items():
        ref = body.get("schema", {}).get("$ref", "")
        names.append(f"{ref.rsplit('/', 1)[-1] or 'body'} (`{media_type}`)")
    return ", ".join(names)


def openapi_page() -> str:
    """Every route: its summary, description, request body and answers."""
    schema = openapi_schema()
    out = [f"Generated from dbf-serve {schema['info']['version']}'s schema ([openapi.json](openapi.json)).\n"]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            out.append(f"## `{method.upper()} {path}`\n")
            out.append(f"**{operation.get('summary', '')}.** {operation.get('description', '')}\n")
            if body := operation.get("requestBody"):
                out.append(f"Request body: {_schema_name(body.get('content', {}))}.\n")
            rows = [
                (status, answer.get("description", ""), _schema_name(answer.get("content", {})))
                for status, answer in operation["responses"].items()
            ]
            out.append(_table(("status", "meaning", "body"), rows))
    return "\n".join(out)


# --- alerts and metrics -----------------------------------------------------------------------------------


_TEMPLATE_BLOCK = re.compile(r"\{\{-?\s*with\b.*?\{\{-?\s*end\s*-?\}\}", re.DOTALL)
_TEMPLATE = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")


def _filled(template: str) -> str:
    """An annotation as a reader sees it: ``{{ $labels.model }}`` reads *model*, ``{{ $value }}`` *value*."""

    def name(match: re.Match) -> str:
        words = match.group(1).split("|")[0].strip()
        return f"*{words.removeprefix('$labels.').removeprefix('$')}*"

    return _TEMPLATE.sub(name, _TEMPLATE_BLOCK.sub("*(a queried value)*", template))


def alerts_table() -> str:
    """Every alert of ``deploy/prometheus/alerts.yml``: severity, duration, summary, what to do."""
    import yaml

    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    rows = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            annotations = rule.get("annotations", {})
            rows.append(
                (
                    f"`{rule['alert']}`",
                    rule.get("labels", {}).get("severity", ""),
                    rule.get("for", "0s"),
                    _filled(annotations.get("summary", "")),
                    _filled(annotations.get("description", "")),
                )
            )
    return _table(("alert", "severity", "for", "summary", "what it means, what to do"), rows)


def _registered() -> Iterable[Any]:
    """The service's metrics: every collector of prometheus-client's default registry once the app's
    modules are imported (a metric added anywhere in ``service`` is listed with no edit here)."""
    import prometheus_client

    import service.app  # noqa: F401  (imports every module that defines a metric)

    # The registry has no public list of its collectors; each collector's own describe() is public.
    yield from list(prometheus_client.REGISTRY._collector_to_names)


_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
}


def metrics_table() -> str:
    """Every ``dbf_`` metric the service exports: its series, type, labels and help."""
    rows = []
    for collector in _registered():
        describe = getattr(collector, "describe", None)
        for family in describe() if describe else ():
            if not family.name.startswith("dbf_"):
                continue
            series = ", ".join(f"`{family.name}{s}`" for s in _SUFFIXES.get(family.type, ("",)))
            labels = ", ".join(f"`{label}`" for label in getattr(collector, "_labelnames", ()))
            rows.append((series, family.type, labels, family.documentation))
    rows.sort()
    return _table(("series", "type", "labels", "what it counts"), rows)


GENERATED: dict[str, Callable[[], str]] = {
    "settings": settings_table,
    "openapi": openapi_page,
    "alerts": alerts_table,
    "metrics": metrics_table,
}


def expand(markdown: str) -> str:
    """``markdown`` with each marker line replaced by what it names."""
    return MARKER.sub(lambda match: GENERATED[match.group(1)]().rstrip("\n"), markdown)


# --- MkDocs hooks -----------------------------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand(markdown)


def on_files(files: Any, config: Any) -> Any:
    """The OpenAPI schema as a file of the site, and the results' figures where the pages point to them."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, "api/openapi.json", content=json.dumps(openapi_schema(), indent=2)))
    for pattern in FIGURES:
        for figure in sorted(ROOT.glob(pattern)):
            files.append(File.generated(config, str(figure.relative_to(ROOT)), abs_src_path=str(figure)))
    return files


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name == "openapi.json":
        print(json.dumps(openapi_schema(), indent=2))
    elif name in GENERATED:
        print(GENERATED[name](), end="")
    else:
        sys.exit(f"usage: python -m docs.generate {{{','.join([*GENERATED, 'openapi.json'])}}}")
