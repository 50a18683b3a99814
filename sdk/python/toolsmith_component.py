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
import re  # noqa: F401
import statistics  # noqa: F401
import string  # noqa: F401
import struct  # noqa: F401
import textwrap  # noqa: F401
import typing  # noqa: F401
import importlib
import sys
import traceback

import wit_world
from componentize_py_types import Err
from wit_world.imports import host, types

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


toolsmith_sdk._bind_host(host, types, Err)
try:
    importlib.import_module(MODULE)
    _TOOL = toolsmith_sdk.the_tool(MODULE.replace(".", "/") + ".py")
    _MANIFEST = _TOOL.manifest_json()
except toolsmith_sdk.SchemaError as e:
    # One line `plugin build` can quote: it names the file and the item.
    print("toolsmith: error: %s" % e, file=sys.stderr)
    raise
print("toolsmith: tool %s" % _TOOL.name)
sys.stdout.flush()
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
            # message (there is no stderr to print the traceback to), so the agent gets the
            # exception and where it was raised, and the traceback goes to the call's log.
            frames = traceback.extract_tb(e.__traceback__)
            at = ""
            if frames:
                last = frames[-1]
                at = " (%s line %d, in %s)" % (toolsmith_sdk._short(last.filename), last.lineno, last.name)
            toolsmith_sdk.log(toolsmith_sdk.Level.ERROR, "".join(traceback.format_exception(e)))
            raise Err(types.ToolError(code="uncaught_exception", message="%s: %s%s" % (type(e).__name__, e, at)))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
