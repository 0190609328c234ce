"""Just enough of Docker's build semantics to test the Dockerfile without a Docker engine: its stages and
instructions, and which files .dockerignore lets into the build context."""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        """ENV as set by the stage (values unexpanded: ``$PATH`` stays ``$PATH``)."""
        out: dict[str, str] = {}
        for args in self.all("ENV"):
            words = shlex.split(args)
            if "=" not in words[0]:  # the legacy `ENV KEY value with spaces`
                out[words[0]] = args.split(None, 1)[1]
                continue
            out.update(word.split("=", 1) for word in words)
        return out

    def exec_form(self, keyword: str) -> list[str] | None:
        """ENTRYPOINT or CMD, exec form; a shell form fails (PID 1 would be a shell, deaf to SIGTERM)."""
        args = self.last(keyword)
        if args is None:
            return None
        command = json.loads(args)  # raises on a shell form
        assert isinstance(command, list) and all(isinstance(part, str) for part in command), args
        return command

    def healthcheck(self) -> tuple[dict[str, str], list[str]]:
        """HEALTHCHECK's options and its command (exec form)."""
        args = self.last("HEALTHCHECK")
        assert args is not None, f"stage {self.name} has no HEALTHCHECK"
        options_text, command = re.fullmatch(r"((?:--\S+\s+)*)CMD\s+(.*)", args, re.S).groups()
        options = dict(option[2:].split("=", 1) for option in options_text.split())
        return options, json.loads(command)

    def copies(self) -> list[tuple[list[str], str, dict[str, str]]]:
        """Each COPY/ADD as (sources, destination, flags such as ``from``)."""
        out = []
        for keyword, args in self.instructions:
            if keyword not in {"COPY", "ADD"}:
                continue
            words = json.loads(args) if args.lstrip().startswith("[") else shlex.split(args)
            flags = {}
            while words[0].startswith("--"):
                key, _, value = words.pop(0)[2:].partition("=")
                flags[key] = value
            out.append((words[:-1], words[-1], flags))
        return out


def logical_lines(text: str) -> list[str]:
    """Instructions one per line: continuations joined, comments and blank lines dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append((current + stripped).strip())
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    return lines


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """The global ARG defaults and the stages, FROM's ``${ARG}`` substituted."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(text):
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "ARG" and not stages:
            name, _, default = args.partition("=")
            global_args[name] = default
        elif keyword == "FROM":
            words = args.split()
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name, image))
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, args))
    return global_args, stages


def stages(path: Path) -> dict[str, Stage]:
    """The stages of the Dockerfile at ``path`` by name, in order."""
    return {stage.name: stage for stage in parse(path.read_text())[1]}


def ignore_patterns(path: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as (excludes, regex) in order; the last matching pattern decides, as in Docker."""
    out = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        out.append((not negated, re.compile(regex)))
    return out


def excluded(relative: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves ``relative`` (a path under the context, with /) out of the build context: a
    pattern matches a path or any of its parent directories."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    decision = False
    for excludes, regex in patterns:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            decision = excludes
    return decision


def context_files(root: Path, patterns: list[tuple[bool, re.Pattern[str]]]) -> list[str]:
    """Every file of the build context rooted at ``root``, relative, with /."""
    reincluded = [regex.pattern for excludes, regex in patterns if not excludes]
    out = []
    for directory, subdirectories, files in os.walk(root):
        base = Path(directory).relative_to(root).as_posix()
        base = "" if base == "." else base + "/"
        # Skip the walk into a left-out directory unless an exception could bring something inside it back.
        subdirectories[:] = [
            d
            for d in subdirectories
            if not excluded(base + d, patterns) or any(p.startswith(re.escape(base + d)) for p in reincluded)
        ]
        out += [base + f for f in files if not excluded(base + f, patterns)]
    return sorted(out)
