"""The entry module of a Python plugin component, written by `toolsmith plugin build`.

componentize-py imports this module while it builds the component (and snapshots the interpreter
after), so the author's module, its tool declaration and the derived manifest are all checked and
computed at build time; a call only runs `call`.
"""

# The guest's standard library: the component has no filesystem at run time, so only modules
# imported while it is built exist. These are the Python guest's (plugins/python/app.py), which an
# author's module may import at top level or lazily inside `run`.
import base64  # noqa: F401
import bisect  # noqa: F401
import cmath  # noqa: F401
import collections  # noqa: F401
import copy  # noqa: F401
import dataclasses  # noqa: F401
import datetime  # noqa: F401
import decimal  # noqa: F401
import enum  # noqa: F401
import fractions  # noqa: F401
import functools  # noqa: F401
import hashlib  # noqa: F401
import heapq  # noqa: F401
import itertools  # noqa: F401
import json
import math  # noqa: F401
import operator  # noqa: F401
import random  # noqa: F401
import re
import statistics  # noqa: F401
import string  # noqa: F401
import struct  # noqa: F401
import textwrap  # noqa: F401
import typing  # noqa: F401
import importlib
import os
import sys
import time
import traceback

import wit_world
from componentize_py_types import Err
from wit_world.imports import capabilities, host, types

import toolsmith_sdk

MODULE = "__TOOLSMITH_MODULE__"


class _LogStream:
    """sys.stdout and sys.stderr of a call: the component links no WASI (`--stub-wasi`), so print()
    becomes `host.log` lines in the call's report instead of writes that would trap."""

    def __init__(self, level):
        self.level = level
        self.buffer = ""

    def write(self, s):
        self.buffer += str(s)
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            toolsmith_sdk.log(self.level, line)
        return len(s)

    def flush(self):
        if self.buffer:
            toolsmith_sdk.log(self.level, self.buffer)
            self.buffer = ""

    def writable(self):
        return True

    def isatty(self):
        return False


toolsmith_sdk._bind_host(host, types, Err, capabilities)
try:
    importlib.import_module(MODULE)
    _TOOL = toolsmith_sdk.the_tool(MODULE.replace(".", "/") + ".py")
    _MANIFEST = _TOOL.manifest_json()
except toolsmith_sdk.SchemaError as e:
    # One line `plugin build` can quote: it names the file and the item.
    print("toolsmith: error: %s" % e, file=sys.stderr)
    raise

# Source lines of the project's modules, read now: formatting a traceback at run time must not
# touch the filesystem (linecache would, and every WASI call traps in this component).
_SOURCES = {}
for _module in list(sys.modules.values()):
    _file = getattr(_module, "__file__", None) or ""
    if re.match(r"^/\d+/", _file) and _file.endswith(".py"):
        try:
            with open(_file, encoding="utf-8") as _f:
                _SOURCES[_file] = _f.read().splitlines()
        except OSError:
            pass


def _traceback(e):
    """The traceback of `e` as text, and " (FILE line N, in FUNCTION)" for its innermost frame."""
    lines = ["Traceback (most recent call last):"]
    at = ""
    for frame, lineno in traceback.walk_tb(e.__traceback__):
        file = frame.f_code.co_filename
        lines.append('  File "%s", line %d, in %s' % (toolsmith_sdk._short(file), lineno, frame.f_code.co_name))
        source = _SOURCES.get(file)
        if source and 0 < lineno <= len(source):
            lines.append("    " + source[lineno - 1].strip())
        if not file.endswith(("/toolsmith_component.py", "/toolsmith_sdk.py")):
            # Where in the author's code, not in the SDK that called it.
            at = " (%s line %d, in %s)" % (toolsmith_sdk._short(file), lineno, frame.f_code.co_name)
    lines.append("%s: %s" % (type(e).__name__, e))
    return "\n".join(lines), at


def _unavailable(what):
    def refuse(*args, **kwargs):
        raise RuntimeError("%s is not available in a Toolsmith plugin (the component links no WASI: no clock, "
                           "no entropy, no files); pass what the tool needs as an argument" % what)

    return refuse


# Each of these would trap without a message; a Python exception says what happened instead.
# (datetime.now() reads the clock in C and still traps.)
for _name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "sleep",
              "process_time", "process_time_ns", "localtime", "gmtime", "ctime", "asctime", "strftime"):
    if hasattr(time, _name):
        setattr(time, _name, _unavailable("time.%s()" % _name))
os.urandom = _unavailable("os.urandom()")
sys.stdout, sys.stderr = _LogStream(toolsmith_sdk.Level.INFO), _LogStream(toolsmith_sdk.Level.WARN)


class WitWorld(wit_world.WitWorld):
    def manifest(self) -> str:
        return _MANIFEST

    def call(self, args_json: str) -> str:
        try:
            return _TOOL.call_json(args_json)
        except toolsmith_sdk.ToolError as e:
            raise Err(types.ToolError(code=e.code, message=e.message))
        except Exception as e:
            # A bug in the tool. A Rust plugin would panic and trap, but a trap here carries no
            # message (there is no stderr to print the traceback to), so the caller gets the
            # exception and the innermost frame, and the full traceback is logged first.
            trace, at = _traceback(e)
            toolsmith_sdk.log(toolsmith_sdk.Level.ERROR, trace)
            raise Err(types.ToolError(code="uncaught_exception", message="%s: %s%s" % (type(e).__name__, e, at)))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
