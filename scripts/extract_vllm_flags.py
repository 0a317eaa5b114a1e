"""Extract every option string `vllm serve` accepts from a vLLM wheel's source, without torch.

vLLM's own parser cannot be built without torch, so this reads the Python source straight
from the wheel with `ast` and replays what the parser would register:

- `vllm/entrypoints/cli/serve.py`: `serve` builds its parser with `make_arg_parser`;
- `vllm/entrypoints/openai/cli_args.py`: `make_arg_parser` adds a few literal flags, then
  `FrontendArgs.add_cli_args` (one `--kebab-case` flag per field of FrontendArgs and its base)
  and `AsyncEngineArgs.add_cli_args`;
- `vllm/engine/arg_utils.py`: `EngineArgs.add_cli_args` adds `--flag` with
  `**get_kwargs(ConfigClass)["field"]`, and `AsyncEngineArgs.add_cli_args` adds a few more.

Each flag's kind follows `_compute_kwargs` in arg_utils.py from the config field's annotation
(read from `vllm/config/*.py`): a config dataclass or a dict is JSON; a bool becomes
`argparse.BooleanOptionalAction`, which also registers `--no-<flag>`; a Literal gives choices.

Usage: python scripts/extract_vllm_flags.py [--wheel vllm-0.26.0-*.whl] [--out FILE]
Where vllm and torch do import: `--check-with-vllm [--commands ARGV.json]` builds vLLM's real
parser and reports where it and the inventory differ.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import glob
import hashlib
import json
import re
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_WHEEL = "/tmp/vsrc/vllm-0.26.0-*.whl"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests/data/vllm-0.26.0-serve-flags.json"
ARG_UTILS = "vllm/engine/arg_utils.py"
CLI_ARGS = "vllm/entrypoints/openai/cli_args.py"
SERVE = "vllm/entrypoints/cli/serve.py"
QUANT = "vllm/model_executor/layers/quantization/__init__.py"


class ExtractError(Exception):
    """The source no longer has the shape this script reads; the message says where."""


@dataclass
class Module:
    """One parsed source file: its classes and its module-level type aliases at run time."""

    path: str
    tree: ast.Module
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    aliases: dict[str, ast.expr] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)  # name -> dotted module (vllm only)

    @classmethod
    def parse(cls, path: str, text: str) -> Module:
        m = cls(path, ast.parse(text, filename=path))
        m._scan(m.tree.body)
        return m

    def _scan(self, body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    self.aliases[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if node.value is not None:  # `X: TypeAlias = ...`
                    self.aliases[node.target.id] = node.value
            elif isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                self._scan(node.orelse)  # at run time TYPE_CHECKING is False
            elif (isinstance(node, ast.ImportFrom) and node.module
                  and node.module.startswith("vllm")):
                for a in node.names:
                    self.imports[a.asname or a.name] = node.module


class Wheel:
    """Source files read from the wheel itself, so the sha256 covers everything read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = zipfile.ZipFile(path)
        self.read: list[str] = []
        self._modules: dict[str, Module] = {}

    def module(self, name: str) -> Module:
        if name not in self._modules:
            try:
                text = self.zip.read(name).decode()
            except KeyError as e:
                raise ExtractError(f"{name} is not in {self.path.name}") from e
            self.read.append(name)
            self._modules[name] = Module.parse(name, text)
        return self._modules[name]

    def version(self) -> str:
        for name in self.zip.namelist():
            if name.endswith(".dist-info/METADATA"):
                meta = self.zip.read(name).decode()
                found = re.search(r"^Version: (\S+)$", meta, re.M)
                if found:
                    return found.group(1)
        raise ExtractError(f"no dist-info METADATA with a Version in {self.path.name}")

    def config_modules(self) -> list[Module]:
        names = sorted(
            n for n in self.zip.namelist()
            if n.startswith("vllm/config/") and n.endswith(".py") and n.count("/") == 2
        )
        return [self.module(n) for n in names]


# -- field annotations -> argparse kind (vllm/engine/arg_utils.py: _compute_kwargs) ---------


@dataclass
class Hints:
    """The set of types an annotation allows, as `_compute_kwargs` sees them."""

    names: set[str] = field(default_factory=set)  # builtins: bool int float str None dict ...
    literals: list[Any] = field(default_factory=list)
    dataclasses: set[str] = field(default_factory=set)
    other: set[str] = field(default_factory=set)


class Resolver:
    """Turns a config field's annotation into argparse kwargs' kind and choices."""

    BUILTINS = frozenset({"bool", "int", "float", "str", "dict", "list", "tuple", "set"})
    CONTAINERS = frozenset({"dict", "list", "tuple", "set", "Mapping", "Sequence"})

    def __init__(self, wheel: Wheel) -> None:
        self.wheel = wheel
        self.modules = wheel.config_modules()
        self.config_classes = {name for m in self.modules for name in m.classes}

    def imported(self, dotted: str, name: str) -> tuple[Module, ast.expr] | None:
        """A type alias imported from another vllm module, if it is one."""
        base = dotted.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if path in self.wheel.zip.namelist():
                m = self.wheel.module(path)
                return (m, m.aliases[name]) if name in m.aliases else None
        return None

    def find_class(self, name: str) -> tuple[Module, ast.ClassDef]:
        for m in self.modules:
            if name in m.classes:
                return m, m.classes[name]
        raise ExtractError(f"config class {name} not found under vllm/config/")

    def field_annotation(self, cls_name: str, field_name: str) -> tuple[Module, ast.expr]:
        module, cls = self.find_class(cls_name)
        for node in cls.body:
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and node.target.id == field_name):
                return module, node.annotation
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in self.config_classes:
                try:
                    return self.field_annotation(base.id, field_name)
                except ExtractError:
                    pass
        raise ExtractError(f"{cls_name}.{field_name} not found under vllm/config/")

    def fields(self, module: Module, cls_name: str) -> list[tuple[str, ast.expr]]:
        """A class's annotated fields, bases first (dataclass order)."""
        cls = module.classes[cls_name]
        out: list[tuple[str, ast.expr]] = []
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in module.classes:
                out += self.fields(module, base.id)
        for node in cls.body:
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and not ast.unparse(node.annotation).startswith(("ClassVar", "InitVar"))):
                out.append((node.target.id, node.annotation))
        return out

    def hints(self, node: ast.expr, module: Module, into: Hints | None = None) -> Hints:
        h = into or Hints()
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            self.hints(node.left, module, h)
            self.hints(node.right, module, h)
        elif isinstance(node, ast.Constant):
            if node.value is None:
                h.names.add("None")
            elif isinstance(node.value, str):  # a forward reference
                self.hints(ast.parse(node.value, mode="eval").body, module, h)
        elif isinstance(node, ast.Subscript):
            head = ast.unparse(node.value).rsplit(".", 1)[-1]
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if head == "Literal":
                for a in args:
                    if isinstance(a, ast.Constant):
                        h.literals.append(a.value)
                    else:  # a nested Literal alias
                        self.hints(a, module, h)
            elif head in ("Optional", "Union"):
                for a in args:
                    self.hints(a, module, h)
                if head == "Optional":
                    h.names.add("None")
            elif head == "Annotated":
                self.hints(args[0], module, h)
            elif head in self.CONTAINERS:
                h.names.add({"Mapping": "dict", "Sequence": "list"}.get(head, head))
            else:
                h.other.add(head)
        elif isinstance(node, ast.Name | ast.Attribute):
            name = ast.unparse(node).rsplit(".", 1)[-1]
            if name in self.BUILTINS:
                h.names.add(name)
            elif name in module.aliases:
                self.hints(module.aliases[name], module, h)
            elif name in module.imports and (found := self.imported(module.imports[name], name)):
                self.hints(found[1], found[0], h)
            elif name in self.config_classes:
                h.dataclasses.add(name)
            elif name == "Any":
                h.other.add(name)
            else:
                h.other.add(name)
        else:
            h.other.add(ast.unparse(node))
        return h

    @staticmethod
    def kind(h: Hints) -> tuple[str, list[Any] | None]:
        """The branch `_compute_kwargs` takes, in its order: (kind, choices)."""
        if h.dataclasses:
            return "json", None
        if h.names == {"bool", "str", "None"} and not (h.literals or h.other):
            return "bool_or_str", None
        if "bool" in h.names:
            return "bool", None
        if h.literals and "str" in h.names:
            return "str", None  # literal_to_kwargs: with str allowed, a metavar, not choices
        if h.literals:  # literal_to_kwargs sorts; optional_type also accepts "None"
            return "choice", sorted(h.literals, key=str) + (["None"] if "None" in h.names else [])
        if h.names & {"tuple", "list", "set"}:
            return "list", None
        if "int" in h.names:
            return "int", None
        if "float" in h.names:
            return "float", None
        if "dict" in h.names:
            return ("json_or_str" if ("str" in h.names or h.other) else "json"), None
        return "str", None

    def field_kind(self, cls_name: str, field_name: str) -> tuple[str, list[Any] | None]:
        module, ann = self.field_annotation(cls_name, field_name)
        return self.kind(self.hints(ann, module))


# -- add_argument calls ---------------------------------------------------------------------


@dataclass
class Flag:
    options: list[str]
    dest: str
    kind: str
    group: str
    source: str
    choices: list[Any] | None = None


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise ExtractError(f"{cls}.{name} not found")


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ExtractError(f"function {name} not found")


def _kwargs_ref(node: ast.expr) -> tuple[str, str] | None:
    """`X_kwargs["field"]` -> (X_kwargs, field)."""
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
        return node.value.id, node.slice.value
    return None


def _kebab(name: str) -> str:
    return "--" + name.replace("_", "-")


def _dest(options: list[str]) -> str:
    long = next((o for o in options if o.startswith("--")), options[0])
    return long.lstrip("-").replace("-", "_")


def add_argument_calls(fn: ast.FunctionDef, path: str, resolver: Resolver) -> list[Flag]:
    """Every `*.add_argument(...)` in `fn`, with kinds from the config class it unpacks."""
    kwargs_of: dict[str, str] = {}  # `model_kwargs = get_kwargs(ModelConfig)`
    alias_of: dict[str, tuple[str, str]] = {}  # `x = kernel_kwargs["moe_backend"]`
    groups: dict[str, str] = {}  # `model_group = parser.add_argument_group(title=...)`
    flags: list[Flag] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if not isinstance(target, ast.Name):
                continue
            if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                    and value.func.id == "get_kwargs" and isinstance(value.args[0], ast.Name)):
                kwargs_of[target.id] = value.args[0].id
            elif (ref := _kwargs_ref(value)) is not None:
                alias_of[target.id] = ref
            elif (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                  and value.func.attr == "add_argument_group"):
                title = next((k.value for k in value.keywords if k.arg == "title"), None)
                if isinstance(title, ast.Constant):
                    groups[target.id] = str(title.value)
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        options = [a.value for a in node.args
                   if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not options or not options[0].startswith("-"):
            continue  # a positional (model_tag)
        owner = ast.unparse(node.func.value)
        kind, choices, cls_field = "str", None, None
        explicit: dict[str, ast.expr] = {}
        for kw in node.keywords:
            if kw.arg is not None:
                explicit[kw.arg] = kw.value
                continue
            val = kw.value  # `**x_kwargs["f"]`, `**alias` or `**{**x_kwargs["f"], ...}`
            refs = [val]
            if isinstance(val, ast.Dict):
                refs = [v for k, v in zip(val.keys, val.values, strict=True) if k is None]
                for k, v in zip(val.keys, val.values, strict=True):
                    if isinstance(k, ast.Constant) and isinstance(k.value, str):
                        explicit[k.value] = v
            for r in refs:
                ref = _kwargs_ref(r)
                if ref is None and isinstance(r, ast.Name) and r.id in alias_of:
                    ref = alias_of[r.id]
                if ref is not None and ref[0] in kwargs_of:
                    cls_field = (kwargs_of[ref[0]], ref[1])
        if cls_field is not None:
            kind, choices = resolver.field_kind(*cls_field)
        action = explicit.get("action")
        if action is not None:
            a = ast.unparse(action)
            if a.endswith("BooleanOptionalAction"):
                kind = "bool"
            elif a in ("'store_true'", "'store_false'"):
                kind = "store_true" if "true" in a else "store_false"
        typ = explicit.get("type")
        if typ is not None and "json.loads" in ast.unparse(typ):
            kind = "json"
        if isinstance(explicit.get("choices"), ast.List):
            choices = [c.value for c in explicit["choices"].elts  # type: ignore[attr-defined]
                       if isinstance(c, ast.Constant)]
            kind = "choice"
        source = f"{path}:{node.lineno}"
        if cls_field is not None:
            source += f" ({cls_field[0]}.{cls_field[1]})"
        flags.append(Flag(options, _dest(options), kind, groups.get(owner, "(top level)"),
                          source, choices))
    return flags


def frontend_flags(module: Module, resolver: Resolver) -> list[Flag]:
    """`FrontendArgs.add_cli_args`: `--{key.replace('_', '-')}` for each field."""
    body = ast.unparse(_method(module.tree, "BaseFrontendArgs", "add_cli_args"))
    if "f\"--{key.replace('_', '-')}\"" not in body and "--{key.replace" not in body:
        raise ExtractError(f"{module.path}: BaseFrontendArgs.add_cli_args changed shape")
    out = []
    for name, ann in resolver.fields(module, "FrontendArgs"):
        kind, choices = resolver.kind(resolver.hints(ann, module))
        if name in ("allowed_origins", "allowed_methods", "allowed_headers",
                    "default_chat_template_kwargs"):
            kind = "json"  # _customize_cli_kwargs: type = json.loads
        out.append(Flag([_kebab(name)], name, kind, "Frontend",
                        f"{module.path}: FrontendArgs.{name}", choices))
    return out


def extract(wheel_path: Path) -> dict[str, Any]:
    wheel = Wheel(wheel_path)
    version = wheel.version()
    serve = wheel.module(SERVE)
    if "make_arg_parser(serve_parser)" not in ast.unparse(serve.tree):
        raise ExtractError(f"{SERVE}: serve no longer builds its parser with make_arg_parser")
    resolver = Resolver(wheel)
    cli = wheel.module(CLI_ARGS)
    make = _function(cli.tree, "make_arg_parser")
    calls = ast.unparse(make)
    for needed in ("FrontendArgs.add_cli_args", "AsyncEngineArgs.add_cli_args"):
        if needed not in calls:
            raise ExtractError(f"{CLI_ARGS}: make_arg_parser no longer calls {needed}")
    engine = wheel.module(ARG_UTILS)
    flags = add_argument_calls(make, CLI_ARGS, resolver)
    flags += frontend_flags(cli, resolver)
    flags += add_argument_calls(_method(engine.tree, "EngineArgs", "add_cli_args"),
                                ARG_UTILS, resolver)
    flags += add_argument_calls(_method(engine.tree, "AsyncEngineArgs", "add_cli_args"),
                                ARG_UTILS, resolver)

    inventory: dict[str, dict[str, Any]] = {}
    for f in flags:
        entry: dict[str, Any] = {"dest": f.dest, "kind": f.kind, "group": f.group,
                                 "source": f.source}
        if f.choices is not None:
            entry["choices"] = f.choices
        for opt in f.options:
            if opt in inventory:
                raise ExtractError(f"{opt} registered twice ({inventory[opt]['source']}, "
                                   f"{f.source}); argparse would refuse this")
            inventory[opt] = {**entry, "aliases": [o for o in f.options if o != opt]}
        if f.kind == "bool":  # argparse.BooleanOptionalAction adds --no-<long option>
            for opt in f.options:
                if opt.startswith("--"):
                    inventory["--no-" + opt[2:]] = {
                        "dest": f.dest, "kind": "bool_negation", "group": f.group,
                        "source": f.source, "aliases": [],
                    }

    quant = wheel.module(QUANT)
    methods = quant.aliases.get("QuantizationMethods")
    if methods is None:
        raise ExtractError(f"{QUANT}: QuantizationMethods not found")
    qh = resolver.hints(methods, quant)
    if "--quantization" in inventory:
        inventory["--quantization"]["known_values"] = qh.literals
        inventory["--quantization"]["known_values_source"] = f"{QUANT}: QuantizationMethods"

    sha = hashlib.sha256(wheel_path.read_bytes()).hexdigest()
    return {
        "provenance": {
            "vllm_version": version,
            "wheel": wheel_path.name,
            "wheel_sha256": sha,
            "extracted_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "script": "scripts/extract_vllm_flags.py",
            "command": "python scripts/extract_vllm_flags.py --wheel " + wheel_path.name,
            "sources": sorted(wheel.read),
            "method": (
                "ast over the wheel's source: make_arg_parser, FrontendArgs fields, "
                "EngineArgs/AsyncEngineArgs.add_cli_args; kinds per arg_utils._compute_kwargs; "
                "BooleanOptionalAction adds --no-<flag>. vLLM's parser itself is not run "
                "(building it imports torch)."
            ),
            "not_covered": (
                "options added at run time by plugins (load_general_plugins) or by "
                "current_platform.pre_register_and_update; FlexibleArgumentParser also accepts "
                "--snake_case spellings and --config.key dotted JSON keys"
            ),
        },
        "flags": dict(sorted(inventory.items())),
    }


def vllm_serve_parser() -> argparse.ArgumentParser:
    """vLLM's own `vllm serve` parser (needs vllm and torch importable). On a machine with no
    accelerator the platform is forced to CPU, which registers no options of its own."""
    import vllm.platforms as platforms

    if not platforms.current_platform.device_type:
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser: argparse.ArgumentParser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    return parser


def compare_with_parser(parser: argparse.ArgumentParser, flags: dict[str, Any]) -> list[str]:
    """Where the inventory and a real parser disagree: option strings, booleans, choices."""
    diffs = []
    real: dict[str, argparse.Action] = {
        o: a for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")
    }
    diffs += [f"only in parser: {o}" for o in sorted(set(real) - set(flags))]
    diffs += [f"only in inventory: {o}" for o in sorted(set(flags) - set(real))]
    for o, a in sorted(real.items()):
        f = flags.get(o)
        if f is None:
            continue
        is_bool = isinstance(a, argparse.BooleanOptionalAction)
        if is_bool != (f["kind"] in ("bool", "bool_negation")):
            diffs.append(f"{o}: parser {type(a).__name__}, inventory {f['kind']}")
        if f["kind"] == "choice" and {str(c) for c in a.choices or ()} != {
                str(c) for c in f["choices"]}:
            diffs.append(f"{o}: choices differ")
    return diffs


def check_with_vllm(inventory_path: Path, commands_path: Path | None) -> dict[str, Any]:
    """Build vLLM's real parser, compare it with the inventory and parse each command
    (`vllm serve MODEL ...`) from a JSON list of argv lists."""
    import vllm

    parser = vllm_serve_parser()
    report: dict[str, Any] = {
        "vllm_version": vllm.__version__,
        "checked_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "differences": compare_with_parser(parser, json.loads(inventory_path.read_text())["flags"]),
        "commands": [],
    }
    for argv in json.loads(commands_path.read_text()) if commands_path else []:
        entry: dict[str, Any] = {"argv": argv}
        try:
            entry["parsed"] = vars(parser.parse_args(argv[2:]))
            entry["ok"] = True
        except BaseException as e:  # argparse exits on errors
            entry["ok"] = False
            entry["error"] = f"{type(e).__name__}: {e}"
        report["commands"].append(entry)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", default=DEFAULT_WHEEL, help="path or glob of the vLLM wheel")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check-with-vllm", action="store_true",
                    help="instead: compare --out's inventory with vLLM's real parser "
                         "(needs vllm and torch importable) and print a JSON report")
    ap.add_argument("--commands", type=Path, default=None,
                    help="with --check-with-vllm: JSON list of argv lists to parse")
    args = ap.parse_args(argv)
    if args.check_with_vllm:
        report = check_with_vllm(args.out, args.commands)
        print(json.dumps(report, indent=1, default=repr))
        ok = not report["differences"] and all(c["ok"] for c in report["commands"])
        return 0 if ok else 1
    found = sorted(glob.glob(args.wheel))
    if len(found) != 1:
        print(f"error: --wheel {args.wheel} matches {len(found)} files; need exactly one",
              file=sys.stderr)
        return 2
    try:
        doc = extract(Path(found[0]))
    except ExtractError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    print(f"{len(doc['flags'])} option strings from vLLM {doc['provenance']['vllm_version']} "
          f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
