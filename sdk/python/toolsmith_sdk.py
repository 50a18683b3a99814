"""Write a Toolsmith tool as one Python function over typed input and output.

    from dataclasses import dataclass, field
    from toolsmith_sdk import ToolError, tool

    @dataclass
    class Input:
        text: str = field(metadata={"description": "The text to analyse."})

    @dataclass
    class Output:
        words: int = field(metadata={"description": "Number of words in `text`."})

    @tool(name="word_count", description="Counts the words in a text.",
          examples=[(Input(text="a b c"), Output(words=3))])
    def run(input: Input) -> Output:
        if not input.text.strip():
            raise ToolError("empty_text", "text has no words")
        return Output(words=len(input.text.split()))

`@tool` derives the manifest (name, version, description, examples) and both JSON Schemas
(draft 2020-12) from the type hints of `run`, exactly as `toolsmith_sdk::tool!` does for Rust.
`toolsmith plugin build DIR` compiles the project with componentize-py against
schemas/wit/tool.wit into a component the host treats like any Rust plugin.

Type hints the schemas are derived from: str, int, float, bool, None, list[T], dict[str, T],
Optional[T] (and `T | None`), Literal[...] of str/int/bool, Enum subclasses with str or int values,
nested dataclasses and TypedDicts (recursion allowed), and Any. Anything else is refused when the
module is imported, naming the class and field.

Descriptions come from `field(metadata={"description": ...})`, else from an `Attributes:` section
of the class docstring (`name: text`); the class docstring's first paragraph describes the object.
Other JSON Schema keywords in `metadata` (minimum, maximum, minLength, pattern, ...) are copied into
the field's schema. Required fields are those without a default; unknown properties are refused
(additionalProperties false).

This module is pure Python (3.10+), so a project's tests run on the host's python3 without wasm:
`python3 -m unittest` in the project runs every example through `run` and checks both sides against
the derived schemas with a small validator for the subset of JSON Schema this module emits (the host
re-checks everything with a full validator).
"""

import dataclasses
import enum
import inspect
import json
import re
import sys
import types
import typing

__all__ = [
    "Level",
    "SchemaError",
    "Tool",
    "ToolError",
    "call_tool",
    "check_examples",
    "http_get",
    "http_request",
    "secret",
    "log",
    "registered",
    "tool",
    "validate",
]

__version__ = "0.1.0"

DIALECT = "https://json-schema.org/draft/2020-12/schema"
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
NAME_MAX_LEN = 64
SEMVER = re.compile(r"^\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?$")

# Keywords a field's metadata may carry into its schema. Only these: a typo such as "minimun"
# would otherwise pass silently and constrain nothing.
SCHEMA_KEYWORDS = frozenset({
    "title", "description", "examples", "deprecated", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minLength", "maxLength", "pattern",
    "minItems", "maxItems", "uniqueItems",
    "minProperties", "maxProperties",
})


class ToolError(Exception):
    """A failure the tool reports to its caller: a snake_case `code` and a `message` saying what
    went wrong and, where possible, how to fix the call. The host passes both on unchanged (the
    WIT's `tool-error`), exactly like the Rust SDK's `ToolError`."""

    def __init__(self, code, message):
        super().__init__("%s: %s" % (code, message))
        self.code = str(code)
        self.message = str(message)


class SchemaError(TypeError):
    """A tool declaration the SDK cannot turn into a manifest: an unsupported type hint, a bad name,
    a duplicate tool. Raised when the module is imported, so `plugin build` and the tests report it
    before anything runs."""


class Level(enum.Enum):
    """How serious a `log` line is (the WIT's `level`)."""

    TRACE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4


# --- the host, when running inside a component ---------------------------------------------------

# Set by the component's entry module (written by `toolsmith plugin build`); None natively.
_host = None


_capabilities = None


def _bind_host(host, types_module, err, capabilities=None):
    """Connects `log`, `call_tool`, `http_request` and `secret` to the WIT imports (called by the
    generated entry module)."""
    global _host, _capabilities
    _host = (host, types_module, err)
    _capabilities = capabilities


class HttpResponse:
    """A response: `status`, `headers` (dict, names lower case), `body` (bytes), `text`, `json()`."""

    def __init__(self, status, headers, body):
        self.status = status
        self.headers = {k.lower(): v for k, v in headers}
        self.body = bytes(body)

    @property
    def text(self):
        return self.body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.body)


def _capability(what):
    if _host is None or _capabilities is None:
        raise ToolError("not_in_host", "cannot %s: it goes through a Toolsmith host" % what)
    return _capabilities, _host[2]


def http_request(method, url, headers=None, body=b""):
    """Makes one HTTP request through the host, to a host an operator granted this tool (declare it
    with `capabilities={"http": [{"host": "api.example.com"}]}` in `@tool`). A refusal raises
    ToolError("permission_denied", ...); let it propagate and the call fails as permission_denied."""
    caps, err = _capability("fetch %s" % url)
    if isinstance(body, str):
        body = body.encode("utf-8")
    request = caps.HttpRequest(method=method, url=url, headers=list((headers or {}).items()), body=bytes(body))
    try:
        out = caps.http(request)
    except err as e:
        raise ToolError(e.value.code, e.value.message) from None
    return HttpResponse(out.status, out.headers, out.body)


def http_get(url, headers=None):
    """`GET url` through the host (see `http_request`)."""
    return http_request("GET", url, headers)


def secret(name):
    """A secret an operator granted this tool; the host scrubs its value from the call's result."""
    caps, err = _capability("read secret `%s`" % name)
    try:
        return caps.secret(name)
    except err as e:
        raise ToolError(e.value.code, e.value.message) from None


def log(level, message):
    """Records a log line against the current call. Outside the host it prints to stderr."""
    if not isinstance(level, Level):
        level = Level[str(level).upper()]
    if _host is None:
        print("[%s] %s" % (level.name.lower(), message), file=sys.stderr)
        return
    host = _host[0]
    host.log(host.Level(level.value), str(message))


def call_tool(name, args):
    """Calls another tool through the host with JSON-able arguments and returns its decoded result.
    The host validates both and runs the callee in its own sandbox under this call's remaining
    deadline. A failed callee raises ToolError whose `code` is the failure kind (`invalid_args`,
    `timeout`, `not_found`, ...) and whose `message` is the host's structured error as JSON.
    Outside the host it raises ToolError("not_in_host", ...), which the example test skips."""
    if _host is None:
        raise ToolError("not_in_host", "cannot call `%s`: call_tool needs a Toolsmith host" % name)
    host, _types, err = _host
    try:
        out = host.call_tool(name, json.dumps(_to_json(args)))
    except err as e:
        raise ToolError(e.value.code, e.value.message) from None
    try:
        return json.loads(out)
    except ValueError as e:
        raise ToolError("invalid_output", "`%s` returned invalid JSON: %s" % (name, e)) from None


# --- schema derivation ---------------------------------------------------------------------------

_NONE = type(None)


def _where(obj):
    """`file:line` of a class or function, for error messages; as much of it as is known."""
    try:
        file = inspect.getsourcefile(obj) or inspect.getfile(obj)
    except (TypeError, OSError):
        module = sys.modules.get(getattr(obj, "__module__", ""), None)
        file = getattr(module, "__file__", None) or "<unknown>"
    try:
        line = inspect.getsourcelines(obj)[1]
        return "%s:%d" % (_short(file), line)
    except (TypeError, OSError):
        return _short(file)


def _short(path):
    # Paths relative to the project read better than absolute ones. componentize-py mounts each
    # directory of its path at /0, /1, ... while it builds; `plugin build` puts the project first.
    import os

    m = re.match(r"^/\d+/(.*)$", path)
    if m:
        return m.group(1)
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _is_typeddict(tp):
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _is_record(tp):
    return (isinstance(tp, type) and dataclasses.is_dataclass(tp)) or _is_typeddict(tp)


def _docstring_parts(cls):
    """(description, {field: description}) from a class docstring with an optional Google-style
    `Attributes:` (or `Fields:`) section."""
    doc = cls.__dict__.get("__doc__")
    if not doc or (dataclasses.is_dataclass(cls) and doc.startswith(cls.__name__ + "(")):
        # dataclass() invents "Name(field: type, ...)" when there is no docstring.
        return None, {}
    doc = inspect.cleandoc(doc)
    fields = {}
    head = []
    section = False
    current = None
    for line in doc.splitlines():
        stripped = line.strip()
        if re.match(r"^(Attributes|Fields|Args|Parameters):\s*$", stripped):
            section = True
            continue
        if section:
            m = re.match(r"^(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", stripped)
            if m and not line.startswith("        "):
                current = m.group(1)
                fields[current] = m.group(3).strip()
            elif stripped and current:
                fields[current] = (fields[current] + " " + stripped).strip()
            elif not stripped:
                current = None
        else:
            head.append(line)
    text = "\n".join(head).strip().split("\n\n")[0].strip()
    return (" ".join(text.split()) or None), fields


class _Deriver:
    """Turns type hints into JSON Schema. Records become inline objects; a record reached again
    while its own schema is being built (a recursive type) becomes a `$ref` into `$defs`."""

    def __init__(self):
        self.stack = []
        self.defs = {}
        self.def_names = {}

    def root(self, tp, what):
        schema = self.record(tp, what)
        pending = [cls for cls in self.def_names if self.def_names[cls] not in self.defs]
        while pending:
            for cls in pending:
                self.stack.append(cls)
                self.defs[self.def_names[cls]] = self.record_body(cls)
                self.stack.pop()
            pending = [cls for cls in self.def_names if self.def_names[cls] not in self.defs]
        out = {"$schema": DIALECT}
        out.update(schema)
        if self.defs:
            out["$defs"] = self.defs
        return out

    def record(self, cls, what):
        if not _is_record(cls):
            raise SchemaError("%s: %s must be a dataclass or TypedDict, not %s"
                              % (what, "the argument" if "input" in what else "the result", _name(cls)))
        if cls in self.stack:
            name = self.def_names.setdefault(cls, self._def_name(cls))
            return {"$ref": "#/$defs/" + name}
        self.stack.append(cls)
        try:
            return self.record_body(cls)
        finally:
            self.stack.pop()

    def _def_name(self, cls):
        name = cls.__name__
        taken = set(self.def_names.values())
        n = 2
        while name in taken:
            name = "%s%d" % (cls.__name__, n)
            n += 1
        return name

    def record_body(self, cls):
        description, doc_fields = _docstring_parts(cls)
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except Exception as e:  # NameError for a forward reference that does not resolve, etc.
            raise SchemaError("%s: cannot read the type hints of %s: %s" % (_where(cls), cls.__name__, e)) from None
        properties = {}
        required = []
        if dataclasses.is_dataclass(cls):
            entries = []
            for f in dataclasses.fields(cls):
                if not f.init:
                    continue
                has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
                default = f.default if f.default is not dataclasses.MISSING else (
                    f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
                entries.append((f.name, hints.get(f.name, f.type), has_default, default, dict(f.metadata)))
        else:
            entries = [(k, hints[k], k not in cls.__required_keys__, dataclasses.MISSING, {}) for k in hints]
        for name, hint, has_default, default, metadata in entries:
            what = "%s: %s.%s" % (_where(cls), cls.__name__, name)
            schema = self.hint(hint, what)
            if has_default and default is not dataclasses.MISSING:
                try:
                    schema["default"] = _to_json(default)
                except SchemaError:
                    pass  # a default with no JSON form is still a default; it just is not shown
            desc = metadata.pop("description", None) or doc_fields.get(name)
            if desc:
                schema["description"] = str(desc)
            for key, value in metadata.items():
                if key not in SCHEMA_KEYWORDS:
                    raise SchemaError("%s: unknown metadata key %r (JSON Schema keywords allowed: %s)"
                                      % (what, key, ", ".join(sorted(SCHEMA_KEYWORDS))))
                schema[key] = value
            properties[name] = schema
            if not has_default:
                required.append(name)
        out = {"type": "object"}
        if description:
            out["description"] = description
        out["properties"] = properties
        if required:
            out["required"] = required
        out["additionalProperties"] = False
        return out

    def hint(self, tp, what):
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is typing.Annotated:
            return self.hint(args[0], what)
        if tp is typing.Any:
            return {}
        if tp is str:
            return {"type": "string"}
        if tp is bool:
            return {"type": "boolean"}
        if tp is int:
            return {"type": "integer"}
        if tp is float:
            return {"type": "number"}
        if tp is None or tp is _NONE:
            return {"type": "null"}
        if origin in (list, typing.List) or tp is list:
            if not args:
                raise SchemaError("%s: list needs an item type, e.g. list[str]" % what)
            return {"type": "array", "items": self.hint(args[0], what + "[]")}
        if origin in (dict, typing.Dict) or tp is dict:
            if not args or args[0] is not str:
                raise SchemaError("%s: dict needs str keys and a value type, e.g. dict[str, int] (JSON object "
                                  "keys are strings), got %s" % (what, _name(tp)))
            return {"type": "object", "additionalProperties": self.hint(args[1], what + "{}")}
        if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
            members = [a for a in args if a is not _NONE]
            if len(members) == len(args):
                # Unions of several types would need the input converted by guessing; say so.
                raise SchemaError("%s: unsupported type hint %s (a union other than Optional[T]; use a Literal, "
                                  "an Enum or separate optional fields)" % (what, _name(tp)))
            if len(members) != 1:
                raise SchemaError("%s: unsupported type hint %s (only Optional[T] of one type)" % (what, _name(tp)))
            inner = self.hint(members[0], what)
            return {"anyOf": [inner, {"type": "null"}]}
        if origin is typing.Literal:
            values = list(args)
            for v in values:
                if not isinstance(v, (str, int, bool)) and v is not None:
                    raise SchemaError("%s: Literal values must be str, int, bool or None, got %r" % (what, v))
            return {"const": values[0]} if len(values) == 1 else {"enum": values}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            values = [m.value for m in tp]
            if not values or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values):
                raise SchemaError("%s: Enum %s needs str or int values" % (what, tp.__name__))
            return {"enum": values}
        if _is_record(tp):
            return self.record(tp, what)
        raise SchemaError("%s: unsupported type hint %s (supported: str, int, float, bool, None, list[T], "
                          "dict[str, T], Optional[T], Literal[...], Enum, dataclasses, TypedDicts, Any)"
                          % (what, _name(tp)))


def _name(tp):
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__qualname__ if tp.__module__ in ("builtins", "__main__") else "%s.%s" % (tp.__module__, tp.__qualname__)
    return repr(tp).replace("typing.", "")


# --- conversion between JSON and the typed values ------------------------------------------------


def _to_json(value):
    """A dataclass, TypedDict, Enum, list or dict as plain JSON data."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise SchemaError("%r has no JSON form" % value)
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    raise SchemaError("a %s has no JSON form" % type(value).__name__)


def _from_json(tp, data):
    """JSON data (already checked against the schema of `tp`) as a value of type `tp`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _from_json(args[0], data)
    if data is None:
        return None
    if tp is float and isinstance(data, int) and not isinstance(data, bool):
        # JSON has one number type: 2 validates as a number and the author asked for a float.
        return float(data)
    if origin in (list, typing.List):
        return [_from_json(args[0], v) for v in data]
    if origin in (dict, typing.Dict):
        return {k: _from_json(args[1], v) for k, v in data.items()}
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        member = next(a for a in args if a is not _NONE)
        return _from_json(member, data)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    if _is_record(tp):
        hints = typing.get_type_hints(tp)
        values = {k: _from_json(hints[k], v) for k, v in data.items() if k in hints}
        return tp(**values)
    return data


# --- tools ---------------------------------------------------------------------------------------

_TOOLS = {}


class Tool:
    """A declared tool: its manifest parts and the function that implements it."""

    def __init__(self, run, name, description, version, examples, where):
        self.run = run
        self.name = name
        self.description = description
        self.version = version
        self.where = where
        try:
            hints = typing.get_type_hints(run)
        except Exception as e:
            raise SchemaError("%s: cannot read the type hints of %s: %s" % (where, run.__name__, e)) from None
        params = [p for p in inspect.signature(run).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(params) != 1 or params[0].name not in hints:
            raise SchemaError("%s: %s must take one annotated argument, e.g. def %s(input: Input) -> Output"
                              % (where, run.__name__, run.__name__))
        if "return" not in hints:
            raise SchemaError("%s: %s needs a return annotation, e.g. -> Output" % (where, run.__name__))
        self.input_type = hints[params[0].name]
        self.output_type = hints["return"]
        self.input_schema = _Deriver().root(self.input_type, "%s: the input of %s" % (where, run.__name__))
        self.output_schema = _Deriver().root(self.output_type, "%s: the output of %s" % (where, run.__name__))
        self.examples = []
        for i, example in enumerate(examples):
            if not (isinstance(example, tuple) and len(example) == 2):
                raise SchemaError("%s: example %d of `%s` must be an (input, output) pair" % (where, i, name))
            try:
                self.examples.append({"input": _to_json(example[0]), "output": _to_json(example[1])})
            except SchemaError as e:
                raise SchemaError("%s: example %d of `%s`: %s" % (where, i, name, e)) from None

    def manifest(self):
        """The manifest as a dict (schemas/tool-manifest.schema.json)."""
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "input_schema": self.input_schema,
            "output_schema": self.output_schema,
            "examples": self.examples,
            "kind": "plugin",
            **({"capabilities": self.capabilities} if getattr(self, "capabilities", None) else {}),
        }

    def manifest_json(self):
        return json.dumps(self.manifest(), indent=2, ensure_ascii=False)

    def call(self, args):
        """Runs the tool on JSON-able arguments (a dict) and returns its result as JSON data: the
        path the component's `call` export takes, minus the encoding. Raises ToolError."""
        try:
            value = _from_json(self.input_type, args)
        except (TypeError, ValueError, KeyError) as e:
            raise ToolError("invalid_args", "arguments do not match the input type: %s" % e) from None
        out = self.run(value)
        try:
            return _to_json(out)
        except SchemaError as e:
            raise ToolError("invalid_output", "cannot encode the result: %s" % e) from None

    def call_json(self, args_json):
        """`call` over JSON text, as the WIT's `call(args-json)`."""
        try:
            args = json.loads(args_json)
        except ValueError as e:
            raise ToolError("invalid_args", "arguments are not JSON: %s" % e) from None
        return json.dumps(self.call(args), ensure_ascii=False, allow_nan=False)


def tool(*, name, description=None, examples, version="0.1.0", capabilities=None):
    """Declares `run` as the tool `name`. `description` defaults to the function's docstring;
    `examples` is a non-empty list of (input, output) pairs, as instances of the input and output
    types or as plain dicts; `capabilities` declares what the tool asks an operator to grant
    (`{"http": [{"host": "api.example.com", "methods": ["GET"]}], "secrets": [{"name": "key"}]}`). Raises SchemaError at import for anything the manifest cannot hold."""

    def decorate(run):
        where = _where(run)
        if not isinstance(name, str) or len(name) > NAME_MAX_LEN or not NAME_PATTERN.match(name):
            raise SchemaError("%s: tool name %r is not snake_case ASCII of at most %d characters"
                              % (where, name, NAME_MAX_LEN))
        desc = description if description is not None else inspect.getdoc(run)
        if not desc or not str(desc).strip():
            raise SchemaError("%s: tool `%s` needs a description (description=... or a docstring)" % (where, name))
        if not SEMVER.match(str(version)):
            raise SchemaError("%s: tool `%s` version %r is not semver (e.g. 0.1.0)" % (where, name, version))
        if not examples:
            raise SchemaError("%s: tool `%s` declares no examples; add at least one (input, output) pair"
                              % (where, name))
        if name in _TOOLS:
            raise SchemaError("%s: tool `%s` is declared twice (first at %s)" % (where, name, _TOOLS[name].where))
        _TOOLS[name] = Tool(run, name, " ".join(str(desc).split()) if "\n" in str(desc) else str(desc),
                            str(version), list(examples), where)
        _TOOLS[name].capabilities = dict(capabilities or {})
        run.__toolsmith_tool__ = _TOOLS[name]
        return run

    return decorate


def registered():
    """Every tool declared so far, by name."""
    return dict(_TOOLS)


def the_tool(module_file="the module"):
    """The one tool a component exports; SchemaError when there is none or more than one."""
    if not _TOOLS:
        raise SchemaError("%s declares no tool: decorate a function with @toolsmith_sdk.tool(name=..., "
                          "description=..., examples=[...])" % module_file)
    if len(_TOOLS) > 1:
        raise SchemaError("%s declares %d tools (%s); a component exports one tool: put each in its own project"
                          % (module_file, len(_TOOLS), ", ".join("`%s` at %s" % (t.name, t.where)
                                                                 for t in _TOOLS.values())))
    return next(iter(_TOOLS.values()))


# --- a validator for the subset above ------------------------------------------------------------

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def validate(value, schema, root=None, pointer=""):
    """The ways `value` fails `schema`, as "pointer: reason" strings (empty when it validates).
    Knows the keywords this module emits plus the metadata ones; the host's validator is the full
    one."""
    root = schema if root is None else root
    errors = []
    if schema is True or schema == {}:
        return errors
    if schema is False:
        return ["%s: no value is allowed here" % (pointer or "/")]
    at = pointer or "/"
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            return ["%s: cannot follow $ref %s" % (at, ref)]
        return validate(value, root["$defs"][ref[len("#/$defs/"):]], root, pointer)
    if "anyOf" in schema:
        branches = [validate(value, s, root, pointer) for s in schema["anyOf"]]
        if all(branches):
            errors.append("%s: matches none of anyOf (%s)" % (at, "; ".join(b[0] for b in branches)))
        return errors
    t = schema.get("type")
    if t is not None:
        allowed = t if isinstance(t, list) else [t]
        if not any(_TYPES[x](value) for x in allowed):
            return ["%s: expected %s, got %s" % (at, " or ".join(allowed), json.dumps(value)[:80])]
    if "const" in schema and not _json_eq(value, schema["const"]):
        errors.append("%s: expected %s" % (at, json.dumps(schema["const"])))
    if "enum" in schema and not any(_json_eq(value, e) for e in schema["enum"]):
        errors.append("%s: %s is not one of %s" % (at, json.dumps(value)[:80], json.dumps(schema["enum"])))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append("%s: missing required property %r" % (at, key))
        extra = schema.get("additionalProperties", True)
        for key, v in value.items():
            sub = pointer + "/" + key.replace("~", "~0").replace("/", "~1")
            if key in props:
                errors += validate(v, props[key], root, sub)
            elif extra is False:
                errors.append("%s: unknown property %r" % (at, key))
            elif isinstance(extra, dict):
                errors += validate(v, extra, root, sub)
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            errors.append("%s: fewer than %d properties" % (at, schema["minProperties"]))
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            errors.append("%s: more than %d properties" % (at, schema["maxProperties"]))
    if isinstance(value, list):
        if "items" in schema:
            for i, v in enumerate(value):
                errors += validate(v, schema["items"], root, "%s/%d" % (pointer, i))
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append("%s: fewer than %d items" % (at, schema["minItems"]))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append("%s: more than %d items" % (at, schema["maxItems"]))
        if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True) for v in value}) != len(value):
            errors.append("%s: items are not unique" % at)
    if isinstance(value, str):
        # JSON Schema counts code points, as Python's len does.
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append("%s: shorter than %d characters" % (at, schema["minLength"]))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append("%s: longer than %d characters" % (at, schema["maxLength"]))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append("%s: does not match /%s/" % (at, schema["pattern"]))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for key, ok in (("minimum", lambda b: value >= b), ("maximum", lambda b: value <= b),
                        ("exclusiveMinimum", lambda b: value > b), ("exclusiveMaximum", lambda b: value < b),
                        ("multipleOf", lambda b: (value / b).is_integer())):
            if key in schema and not ok(schema[key]):
                errors.append("%s: %s fails %s %s" % (at, json.dumps(value), key, json.dumps(schema[key])))
    return errors


def _json_eq(a, b):
    # JSON equality: true is not 1, and 1 equals 1.0.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def check_examples(test=None, tool=None):
    """Checks every example of `tool` (the module's one tool by default): its input validates
    against the input schema, `run` returns its output, and the output validates against the output
    schema. With a unittest.TestCase as `test`, each example is a subTest; without, it raises
    AssertionError at the first failure. Examples that need `call_tool` are skipped natively."""
    t = tool or the_tool()
    if not t.examples:
        raise AssertionError("tool `%s` declares no examples" % t.name)
    for i, example in enumerate(t.examples):
        ctx = test.subTest(example=i, input=example["input"]) if test is not None else _nullcontext()
        with ctx:
            problems = validate(example["input"], t.input_schema)
            if problems:
                raise AssertionError("example %d input does not match the input schema: %s" % (i, "; ".join(problems)))
            problems = validate(example["output"], t.output_schema)
            if problems:
                raise AssertionError("example %d output does not match the output schema: %s" % (i, "; ".join(problems)))
            try:
                got = json.loads(t.call_json(json.dumps(example["input"])))
            except ToolError as e:
                if e.code == "not_in_host":
                    print("skipped natively (needs call_tool): example %d" % i, file=sys.stderr)
                    continue
                raise AssertionError("example %d raised %s" % (i, e)) from None
            if got != example["output"]:
                raise AssertionError("example %d: run returned %s, the example says %s"
                                     % (i, json.dumps(got), json.dumps(example["output"])))


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
