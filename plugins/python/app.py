"""The Toolsmith Python guest: runs agent-written Python functions inside a WebAssembly sandbox.

Built into a component by componentize-py (scripts/build-python-guest.sh); the host instantiates a
fresh copy for every request, so nothing one call does (globals, builtins, sys.modules, random
state) survives into the next.

Allowed modules. Only modules imported while the component is built exist at run time, so the
imports below ARE the allowlist (plus what they import internally, such as os, sys and io). There is
no socket, subprocess, ctypes, urllib, http, multiprocessing or signal; threads cannot start; the
host gives no filesystem preopens, no network and an empty environment, except what an operator
granted the tool: directories read-only at /dirs/<name>, named environment variables, and through
`import toolsmith` the host's HTTP (`toolsmith.http_get(url)`, `toolsmith.http_request(...)`) and
secrets (`toolsmith.secret(name)`), each refused with PermissionError unless granted.

Requests (JSON):
  {"op": "exec", "code": str, "entry": str, "args": [...], "kwargs": {...}, "seed": int,
   "capture": int}
      Runs `code` in fresh globals, calls `entry(*args, **kwargs)`. stdout and stderr are captured
      up to `capture` characters each (default 65536; the rest is dropped and counted).
  {"op": "describe", "code": str, "entry": str}
      Parses `code` (nothing runs) and describes the signature of the top-level function `entry`.

Responses (JSON):
  exec:     {"result": <encoded>, "stdout": str, "stderr": str, "dropped": {"stdout": n, "stderr": n},
             "error": null | {"type": str, "message": str, "traceback": str}}
  describe: {"params": [{"name", "kind", "annotation", "has_default", "default"}], "returns": str|null,
             "doc": str|null, "error": null | {...}}

Encoding of results. JSON values pass through (tuples become arrays). Everything else becomes a
one-key object whose key starts with "$":
  int outside the signed 64-bit range -> {"$int": "123..."}; nan/inf -> {"$float": "nan"|"inf"|"-inf"};
  set/frozenset -> {"$set": [...]} (sorted when the items allow); complex -> {"$complex": [re, im]};
  Fraction -> {"$fraction": "1/3"}; Decimal -> {"$decimal": "1.10"}; datetime/date/time ->
  {"$datetime"|"$date"|"$time": ISO 8601}; timedelta -> {"$timedelta": seconds}; bytes/bytearray ->
  {"$bytes": base64}; dict with non-string keys -> {"$dict": [[key, value], ...]}; dataclass -> an
  object of its fields; Enum -> its value; anything else -> {"$repr": repr(value)}. Nesting deeper
  than 100 levels or a cycle -> {"$repr": ...} at that point.
"""

# --- the allowlist -------------------------------------------------------------------------------
import base64
import bisect
import cmath
import collections
import copy
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import heapq
import itertools
import json
import math
import operator
import random
import re
import statistics
import string
import struct
import textwrap
import typing

# --- what the runner itself needs ----------------------------------------------------------------
import _ast_unparse  # noqa: F401  (ast.unparse imports it lazily; absent unless imported here)
import ast
import builtins
import io
import linecache
import sys
import traceback

import types
import wit_world
from wit_world.imports import capabilities as _capabilities
from componentize_py_types import Err as _Err

# Captured before any tool code runs: a tool may monkeypatch json.dumps or sys in its own call, and
# the runner must still be able to answer.
_dumps, _loads = json.dumps, json.loads
_sys_stdout, _sys_stderr = sys.stdout, sys.stderr

TOOL_FILE = "<tool>"


# --- `import toolsmith`: the host's capabilities ------------------------------------------------
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
        return _loads(self.body)


def _host(fn, *args):
    try:
        return fn(*args)
    except _Err as exc:
        err = exc.value
        kind = {"permission_denied": PermissionError, "timeout": TimeoutError}.get(err.code, OSError)
        raise kind("%s: %s" % (err.code, err.message)) from None


def _http_request(method, url, headers=None, body=b""):
    """Makes one HTTP request through the host (only to hosts granted to this tool)."""
    if isinstance(body, str):
        body = body.encode("utf-8")
    pairs = list((headers or {}).items())
    request = _capabilities.HttpRequest(method=method, url=url, headers=pairs, body=bytes(body))
    out = _host(_capabilities.http, request)
    return HttpResponse(out.status, out.headers, out.body)


def _http_get(url, headers=None):
    """`GET url` through the host."""
    return _http_request("GET", url, headers)


def _secret(name):
    """A secret granted to this tool; the host scrubs its value from what the call returns."""
    return _host(_capabilities.secret, name)


_toolsmith = types.ModuleType("toolsmith", "The Toolsmith host's capabilities, as granted to this tool.")
_toolsmith.http_request, _toolsmith.http_get, _toolsmith.secret = _http_request, _http_get, _secret
_toolsmith.HttpResponse = HttpResponse
sys.modules["toolsmith"] = _toolsmith
DEFAULT_CAPTURE = 65536
MAX_DEPTH = 100
INT64 = 2**63


class _Capped(io.TextIOBase):
    """A text stream that keeps the first `limit` characters and counts the rest."""

    def __init__(self, limit):
        self.limit = limit
        self.parts = []
        self.kept = 0
        self.dropped = 0

    def writable(self):
        return True

    def write(self, s):
        s = str(s)
        room = self.limit - self.kept
        if room > 0:
            head = s[:room]
            self.parts.append(head)
            self.kept += len(head)
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def getvalue(self):
        return "".join(self.parts)


def _encode(value, depth=0, seen=None):
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if -INT64 <= value < INT64 else {"$int": str(value)}
    if isinstance(value, float):
        if math.isnan(value):
            return {"$float": "nan"}
        if math.isinf(value):
            return {"$float": "inf" if value > 0 else "-inf"}
        return value
    if depth >= MAX_DEPTH:
        return {"$repr": "<nested too deeply>"}
    seen = seen if seen is not None else set()
    if isinstance(value, (list, tuple, dict, set, frozenset)) or dataclasses.is_dataclass(value):
        if id(value) in seen:
            return {"$repr": "<cycle>"}
        seen = seen | {id(value)}
    enc = lambda v: _encode(v, depth + 1, seen)  # noqa: E731
    if isinstance(value, (list, tuple)):
        return [enc(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: enc(v) for k, v in value.items()}
        return {"$dict": [[enc(k), enc(v)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        items = list(value)
        try:
            items.sort()
        except TypeError:
            pass
        return {"$set": [enc(v) for v in items]}
    if isinstance(value, enum.Enum):
        return enc(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: enc(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, complex):
        return {"$complex": [enc(value.real), enc(value.imag)]}
    if isinstance(value, fractions.Fraction):
        return {"$fraction": str(value)}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, datetime.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"$date": value.isoformat()}
    if isinstance(value, datetime.time):
        return {"$time": value.isoformat()}
    if isinstance(value, datetime.timedelta):
        return {"$timedelta": value.total_seconds()}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    try:
        text = repr(value)
    except BaseException:  # a hostile __repr__
        text = "<unrepresentable %s>" % type(value).__name__
    return {"$repr": text[:10000]}


def _error(exc, tb=True):
    text = ""
    if tb:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == TOOL_FILE]
        lines = ["Traceback (most recent call last):\n"] if frames else []
        lines += traceback.format_list(frames)
        lines += traceback.format_exception_only(type(exc), exc)
        text = "".join(lines)[-8000:]
    try:
        message = str(exc)
    except BaseException:
        message = "<unprintable>"
    return {"type": type(exc).__name__, "message": message[:4000], "traceback": text}


def _syntax_error(exc):
    err = _error(exc, tb=False)
    where = "line %s, column %s" % (exc.lineno, exc.offset) if exc.lineno else "unknown position"
    line = (exc.text or "").rstrip("\n")
    err["message"] = "%s (%s)" % (exc.msg, where)
    err["traceback"] = "".join(traceback.format_exception_only(type(exc), exc))[-4000:]
    err["line"] = exc.lineno
    err["text"] = line[:400]
    return err


def _find(tree, entry):
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for node in reversed(defs):
        if node.name == entry:
            return node, None
    names = ", ".join(n.name for n in defs) or "none"
    return None, {
        "type": "EntryNotFound",
        "message": "no top-level function named %r (functions defined: %s)" % (entry, names),
        "traceback": "",
    }


def _literal(node):
    try:
        return True, _encode(ast.literal_eval(node))
    except Exception:
        return False, None


def _describe(req):
    code, entry = req["code"], req["entry"]
    try:
        tree = ast.parse(code, TOOL_FILE)
    except SyntaxError as exc:
        return {"error": _syntax_error(exc)}
    node, err = _find(tree, entry)
    if err:
        return {"error": err}
    if isinstance(node, ast.AsyncFunctionDef):
        return {"error": {"type": "UnsupportedFunction", "traceback": "",
                          "message": "%r is async; define a plain function (there is no event loop)" % entry}}
    a = node.args
    params = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = "positional_only" if i < len(a.posonlyargs) else "positional_or_keyword"
        params.append((arg, kind, default))
    if a.vararg:
        params.append((a.vararg, "var_positional", None))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        params.append((arg, "keyword_only", default))
    if a.kwarg:
        params.append((a.kwarg, "var_keyword", None))
    out = []
    for arg, kind, default in params:
        has_default, value = (False, None) if default is None else (True, None)
        literal = False
        if default is not None:
            literal, value = _literal(default)
        out.append({
            "name": arg.arg,
            "kind": kind,
            "annotation": ast.unparse(arg.annotation) if arg.annotation else None,
            "has_default": has_default,
            "default": value if literal else None,
        })
    return {
        "params": out,
        "returns": ast.unparse(node.returns) if node.returns else None,
        "doc": ast.get_docstring(node),
        "error": None,
    }


def _exec(req):
    code, entry = req["code"], req["entry"]
    args, kwargs = req.get("args") or [], req.get("kwargs") or {}
    random.seed(req.get("seed", 0))
    limit = int(req.get("capture", DEFAULT_CAPTURE))
    out, err = _Capped(limit), _Capped(limit)
    response = {"result": None, "stdout": "", "stderr": "", "error": None}
    sys.stdout, sys.stderr = out, err
    try:
        linecache.cache[TOOL_FILE] = (len(code), None, code.splitlines(True), TOOL_FILE)
        namespace = {"__name__": "__tool__", "__builtins__": builtins}
        exec(compile(code, TOOL_FILE, "exec"), namespace)
        fn = namespace.get(entry)
        if not callable(fn):
            defined = ", ".join(k for k, v in namespace.items() if callable(v) and not k.startswith("__"))
            response["error"] = {"type": "EntryNotFound", "traceback": "",
                                 "message": "no function named %r (defined: %s)" % (entry, defined or "none")}
        else:
            response["result"] = _encode(fn(*args, **kwargs))
    except SyntaxError as exc:
        response["error"] = _syntax_error(exc)
    except BaseException as exc:  # SystemExit, MemoryError and RecursionError included
        response["error"] = _error(exc)
    finally:
        sys.stdout, sys.stderr = _sys_stdout, _sys_stderr
    response["stdout"], response["stderr"] = out.getvalue(), err.getvalue()
    response["dropped"] = {"stdout": out.dropped, "stderr": err.dropped}
    return response


class WitWorld(wit_world.WitWorld):
    def run(self, request: str) -> str:
        try:
            req = _loads(request)
            op = req.get("op")
            if op == "exec":
                response = _exec(req)
            elif op == "describe":
                response = _describe(req)
            else:
                response = {"error": {"type": "BadRequest", "message": "unknown op %r" % op, "traceback": ""}}
        except BaseException as exc:
            response = {"error": _error(exc, tb=False)}
        try:
            # UTF-8, not \u escapes: a captured emoji costs 4 bytes of the output cap, not 12.
            return _dumps(response, allow_nan=False, ensure_ascii=False)
        except BaseException as exc:
            return _dumps({"error": _error(exc, tb=False)})
