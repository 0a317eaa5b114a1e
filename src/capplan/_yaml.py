"""Loading YAML/JSON files into pydantic models with one-line, file-naming errors."""

from __future__ import annotations

import codecs
import difflib
import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from capplan.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]  # (PyYAML ships no types)
    """PyYAML's safe loader, refusing a key given twice in one mapping: YAML says keys are
    unique, but PyYAML keeps the last silently, so a second `workloads:` would drop the
    first's. Keys a merge (`<<: *anchor`) brings in may still be overridden, as YAML allows."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                first = seen[key].start_mark.line + 1
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"key {key!r} given twice (lines {first} and "
                    f"{key_node.start_mark.line + 1}); keep one", key_node.start_mark)
            seen[key] = key_node
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


class _DuplicateKey(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (json keeps the last, silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} given twice in one object; keep one")
        out[key] = value
    return out


def _not_utf8(byte: int, offset: int, line: int) -> str:
    return (f"not UTF-8 text (byte 0x{byte:02x} at offset {offset}, line {line}); save the "
            "file as UTF-8")


def read_utf8(path: Path) -> str:
    """The text of `path`, which must be UTF-8: other bytes are a ConfigError saying where the
    first one is. An OSError passes through for the caller to word."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(_not_utf8(data[e.start], e.start, line), file=str(path)) from e


def utf8_problem(path: Path) -> str | None:
    """Where the first byte of `path` that is not UTF-8 is, as read_utf8 words it, or None if
    there is none (or the file cannot be read). Streamed, for traces of any size; for error
    paths, when polars' own message ("invalid utf-8 sequence") names no place."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, lines = 0, 0
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as e:
                    # e.object is the chunk after the (newline-free) bytes of a character the
                    # decoder held back from the chunk before
                    held = len(e.object) - len(chunk)
                    line = lines + e.object.count(b"\n", 0, e.start) + 1
                    return _not_utf8(e.object[e.start], offset - held + e.start, line)
                offset += len(chunk)
                lines += chunk.count(b"\n")
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return (f"not UTF-8 text (it ends inside a character, offset {offset}); save the file "
                "as UTF-8")
    except OSError:
        return None
    return None


def utf8_problem_behind(seen: object, path: Path) -> str | None:
    """utf8_problem(path) where `seen` (a reader's error, or the column names it read) shows
    bad UTF-8: polars says only "invalid utf-8 sequence", or reads a header lossily."""
    text = str(seen)
    return utf8_problem(path) if "utf-8" in text.lower() or "\ufffd" in text else None


def yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's error as one line: the problem, where it is and, when it began elsewhere,
    what was being parsed there (str(e) spreads these over lines, the first the least telling)."""
    problem, mark = getattr(e, "problem", None), getattr(e, "problem_mark", None)
    if problem is None or mark is None:
        return str(e).splitlines()[0]
    text = f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    context, start = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and start is not None and start.line != mark.line:
        text += f", {context} that began at line {start.line + 1}, column {start.column + 1}"
    return text


def read_mapping(path: Path) -> dict[str, Any]:
    """Read a YAML or JSON file holding one mapping."""
    try:
        text = read_utf8(path)
    except OSError as e:
        raise ConfigError(f"cannot read file ({e.strerror}); check the path", file=str(path)) from e
    if not text.strip("\ufeff \t\r\n"):
        raise ConfigError("the file is empty; check the path, and that the file was saved",
                          file=str(path))
    try:
        if path.suffix == ".json":
            data = json.loads(text, object_pairs_hook=_unique_pairs)
        else:
            data = yaml.load(text, _UniqueKeyLoader)  # a SafeLoader
    except yaml.YAMLError as e:
        raise ConfigError(f"not valid YAML: {yaml_problem(e)}", file=str(path)) from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})",
                          file=str(path)) from e
    except _DuplicateKey as e:
        raise ConfigError(f"not valid JSON: {e}", file=str(path)) from e
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", file=str(path))
    return data


SHOULD_BE = "Input should be "
"""How pydantic begins a message that lists the values a field takes."""


def validation_message(err: ValidationError) -> tuple[str, str]:
    """The most telling error of a pydantic ValidationError as (dotted field, what to fix).
    An unknown key comes first (a typo also makes the intended key look missing), with the
    missing key it most resembles as the suggestion."""
    errors = err.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    e = unknown[0] if unknown else errors[0]
    loc = _field(e["loc"])
    if e["type"] == "extra_forbidden":
        key = str(e["loc"][-1])
        missing = [str(m["loc"][-1]) for m in errors
                   if m["type"] == "missing" and m["loc"][:-1] == e["loc"][:-1]]
        close = difflib.get_close_matches(key, missing, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return loc, f"unknown key {key!r}{hint}; remove it or fix its spelling"
    if e["type"] == "missing":
        return loc, "required key is missing"
    msg = e["msg"].removeprefix("Value error, ")
    # a value a union refuses: each member says what it takes (Precision | "auto": the
    # enum's values, then 'auto'); one line says them all
    takes = [m["msg"] for m in errors if _field(m["loc"]) == loc]
    if len(takes) > 1 and all(t.startswith(SHOULD_BE) for t in takes):
        msg = SHOULD_BE + " or ".join(dict.fromkeys(t.removeprefix(SHOULD_BE) for t in takes))
    return loc, msg


def _field(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the YAML's dotted field: without the validator and
    union-member tags pydantic puts in it (`function-after[...]`, `str-enum[Precision]`,
    `literal['auto']`), which name no key of the file."""
    return ".".join(str(p) for p in loc
                    if not (isinstance(p, str) and (p.startswith("function-") or "[" in p)))


def load_model(cls: type[M], data: dict[str, Any], *, file: str) -> M:
    """Validate `data` as `cls`, turning the first error into a ConfigError naming the field."""
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        field, msg = validation_message(err)
        raise ConfigError(msg, file=file, field=field) from err
