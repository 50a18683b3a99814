#!/usr/bin/env python3
"""End-to-end MCP client driver for `toolsmith serve`, using the official `mcp` SDK.

Run it with the interpreter printed (last stdout line) by
`scripts/mcp-client-env.sh`, which holds the pinned SDK:

    PY=$(scripts/mcp-client-env.sh | tail -n 1)
    $PY tests/mcp/client.py [OPTIONS] stdio -- CMD [ARGS...]
    $PY tests/mcp/client.py [OPTIONS] http URL [--token TOKEN]

Options (before `stdio`/`http`, or anywhere before `--`):
    --timeout SECS     global deadline for the whole scenario (default 60)
    --min-pages N      fail unless the first tools/list took at least N pages
                       (use with a server started with a small page size)

The token may also come from the TOOLSMITH_MCP_TOKEN environment variable. In
stdio mode the server inherits this process's full environment and cwd (the
SDK's default would pass only a small safe subset of the environment).

The scenario is shared by both transports. Exactly one JSON report is printed
to stdout at the end; exit status 0 when every check passed, 1 when any failed
(the report's `failures` lists them), 2 on a usage error. SDK/server chatter
goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import math
import os
import sys
import time
import traceback
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

try:  # mcp >= 2 names the shared error type MCPError, 1.x named it McpError.
    from mcp.shared.exceptions import MCPError as ProtocolError
except ImportError:  # pragma: no cover - older SDKs
    from mcp.shared.exceptions import McpError as ProtocolError  # type: ignore[no-redef]

try:
    _EXCEPTION_GROUPS: tuple[type, ...] = (BaseExceptionGroup,)
except NameError:  # Python 3.10 has no builtin exception groups
    _EXCEPTION_GROUPS = ()

PLUGIN_TOOLS = ("calculator", "text", "units", "json_query")
META_TOOLS = ("search_tools", "create_and_execute_mcp")
LIST_CHANGED = "notifications/tools/list_changed"
CONNECTION_CLOSED = -32000  # the SDK's code for "Connection closed"
LIST_CHANGED_WAIT_S = 10.0
REQUEST_TIMEOUT_S = 30.0
MAX_PAGES = 100

HYPOTENUSE_ARGS = {
    "name": "hypotenuse",
    "description": "Length of the hypotenuse of a right triangle from its two legs",
    "arguments": "a, b (float)",
    "returns": "the hypotenuse (float)",
    "code": "import math\ndef hypotenuse(a: float, b: float) -> float:\n    return math.hypot(a, b)\n",
    "inputs": {"a": 3, "b": 4},
}


# --------------------------------------------------------------------------- helpers


class Report:
    def __init__(self, transport: str, target: Any) -> None:
        self.data: dict[str, Any] = {
            "ok": False,
            "transport": transport,
            "target": target,
            "sdk": sdk_info(),
            "current_step": None,
            "steps": {},
            "notifications": [],
            "transport_errors": [],
            "failures": [],
        }

    @property
    def steps(self) -> dict[str, Any]:
        return self.data["steps"]

    def fail(self, step: str, message: str) -> None:
        self.data["failures"].append(f"[{step}] {message}")

    def check(self, step: str, cond: bool, message: str) -> bool:
        if not cond:
            self.fail(step, message)
        return cond

    def http_hint(self) -> str:
        """The last failed HTTP exchange, if any: the SDK reports e.g. a 401 only as a generic error."""
        bad = [e for e in self.data.get("http", {}).get("exchanges", []) if int(e.split()[1]) >= 400]
        return f" (HTTP: {bad[-1]})" if bad else ""

    def finish(self) -> dict[str, Any]:
        self.data["ok"] = not self.data["failures"]
        return self.data


def sdk_info() -> dict[str, Any]:
    info: dict[str, Any] = {"mcp": importlib.metadata.version("mcp")}
    try:
        from mcp.types import version as v  # mcp >= 2

        info["latest_protocol_version"] = v.LATEST_PROTOCOL_VERSION
        info["latest_handshake_version"] = v.LATEST_HANDSHAKE_VERSION
        info["handshake_protocol_versions"] = list(v.HANDSHAKE_PROTOCOL_VERSIONS)
    except ImportError:  # pragma: no cover - 1.x
        from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS

        info["latest_protocol_version"] = types.LATEST_PROTOCOL_VERSION
        info["handshake_protocol_versions"] = list(SUPPORTED_PROTOCOL_VERSIONS)
    return info


def wire(model: Any) -> Any:
    """A pydantic protocol model as its JSON wire shape (camelCase keys)."""
    if model is None:
        return None
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def close_to(x: Any, expected: float) -> bool:
    return is_number(x) and math.isclose(float(x), expected, rel_tol=1e-9, abs_tol=1e-9)


def texts(result: dict[str, Any]) -> list[str]:
    return [c.get("text", "") for c in result.get("content", []) if c.get("type") == "text"]


def describe_exc(exc: BaseException) -> str:
    if isinstance(exc, ProtocolError):
        data = f", data={json.dumps(exc.error.data)[:300]}" if exc.error.data is not None else ""
        return f"protocol error {exc.error.code}: {exc.error.message}{data}"
    if isinstance(exc, _EXCEPTION_GROUPS):
        return "; ".join(describe_exc(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def numeric_result(result: dict[str, Any]) -> tuple[Any, str]:
    """The single number a tool returned, and where it was found."""
    sc = result.get("structuredContent")
    if is_number(sc):
        return sc, "structuredContent"
    if isinstance(sc, dict):
        for key in ("value", "result", "execution_result"):
            if is_number(sc.get(key)):
                return sc[key], f"structuredContent.{key}"
        nums = [k for k, v in sc.items() if is_number(v)]
        if len(nums) == 1:
            return sc[nums[0]], f"structuredContent.{nums[0]}"
    for t in texts(result):
        try:
            v = json.loads(t)
        except ValueError:
            continue
        if is_number(v):
            return v, "text"
        if isinstance(v, dict) and is_number(v.get("value")):
            return v["value"], "text.value"
    return None, "none"


async def call_tool(session: ClientSession, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return wire(await session.call_tool(name, args))


async def list_all_tools(session: ClientSession) -> tuple[list[dict[str, Any]], int, list[str]]:
    """Every tool, following nextCursor. Returns (tools, pages, problems)."""
    tools: list[dict[str, Any]] = []
    problems: list[str] = []
    cursor: str | None = None
    seen_cursors: set[str] = set()
    pages = 0
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        page = wire(await session.list_tools(params=params))
        pages += 1
        tools.extend(page.get("tools", []))
        cursor = page.get("nextCursor")
        if cursor is None:
            break
        if cursor in seen_cursors:
            problems.append(f"server repeated cursor {cursor!r} (pagination loop)")
            break
        if pages >= MAX_PAGES:
            problems.append(f"more than {MAX_PAGES} pages; stopped following nextCursor")
            break
        seen_cursors.add(cursor)
    return tools, pages, problems


# --------------------------------------------------------------------------- scenario


async def run_scenario(read: Any, write: Any, report: Report, min_pages: int) -> None:
    """The whole scenario over an already-connected transport stream pair."""
    list_changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, Exception):
            report.data["transport_errors"].append(describe_exc(message))
            return
        inner = getattr(message, "root", message)  # 1.x wrapped notifications in a RootModel
        method = getattr(inner, "method", type(inner).__name__)
        report.data["notifications"].append(method)
        if method == LIST_CHANGED:
            list_changed.set()

    async with ClientSession(
        read,
        write,
        read_timeout_seconds=REQUEST_TIMEOUT_S,
        message_handler=on_message,
        client_info=types.Implementation(name="toolsmith-e2e-client", version="0.1.0"),
    ) as session:

        aborted: list[str] = []

        async def step(name: str, body: Any) -> None:
            if aborted:
                report.steps[name] = {"skipped": f"after fatal failure in {aborted[0]}"}
                return
            report.data["current_step"] = name
            report.steps[name] = out = {}
            try:
                await body(out)
            except Exception as exc:  # one broken step must not hide the others
                msg = describe_exc(exc) + report.http_hint()
                report.fail(name, f"raised {msg}")
                out["exception"] = msg
                print(f"client.py: step {name} raised:", file=sys.stderr)
                traceback.print_exc(file=sys.stderr)
                # Without a handshake or a connection the later steps only repeat the error.
                if name == "initialize" or (isinstance(exc, ProtocolError) and exc.error.code == CONNECTION_CLOSED):
                    aborted.append(name)

        # a. initialize ---------------------------------------------------------------
        async def initialize(out: dict[str, Any]) -> None:
            init = wire(await session.initialize())
            out["protocolVersion"] = init.get("protocolVersion")
            out["serverInfo"] = {k: init.get("serverInfo", {}).get(k) for k in ("name", "version")}
            out["capabilities"] = caps = init.get("capabilities", {})
            report.check("initialize", bool(out["serverInfo"]["name"]), "serverInfo.name is empty")
            report.check("initialize", bool(out["serverInfo"]["version"]), "serverInfo.version is empty")
            report.check(
                "initialize",
                isinstance(caps.get("tools"), dict) and caps["tools"].get("listChanged") is True,
                f"capabilities.tools.listChanged must be true, got capabilities={json.dumps(caps)}",
            )

        await step("initialize", initialize)

        # b. list all tools -----------------------------------------------------------
        async def list_tools(out: dict[str, Any]) -> None:
            tools, pages, problems = await list_all_tools(session)
            names = [t.get("name") for t in tools]
            out["pages"] = pages
            out["tool_names"] = names
            for p in problems:
                report.fail("list_tools", p)
            report.check("list_tools", pages >= min_pages, f"expected at least {min_pages} pages, got {pages}")
            dupes = sorted({n for n in names if names.count(n) > 1})
            report.check("list_tools", not dupes, f"tools listed more than once across pages: {dupes}")
            for want in PLUGIN_TOOLS + META_TOOLS:
                report.check("list_tools", want in names, f"tool {want!r} missing from tools/list (got {names})")
            for t in tools:
                name = t.get("name")
                schema = t.get("inputSchema")
                report.check(
                    "list_tools",
                    isinstance(schema, dict) and schema.get("type") == "object",
                    f"tool {name!r} has no object inputSchema (got {json.dumps(schema)})",
                )
                if name not in META_TOOLS:
                    report.check(
                        "list_tools",
                        isinstance(t.get("outputSchema"), dict),
                        f"plugin tool {name!r} has no outputSchema",
                    )
            out["with_output_schema"] = [t.get("name") for t in tools if "outputSchema" in t]

        await step("list_tools", list_tools)

        # c. calculator -----------------------------------------------------------------
        async def calculator(out: dict[str, Any]) -> None:
            r = await call_tool(session, "calculator", {"expression": "2*(3+4)"})
            out["isError"] = r.get("isError", False)
            out["structuredContent"] = sc = r.get("structuredContent")
            out["text"] = texts(r)
            report.check("calculator", not out["isError"], f"isError is true: {out['text']}")
            report.check(
                "calculator",
                isinstance(sc, dict) and set(sc) == {"value"} and close_to(sc["value"], 14.0),
                f"structuredContent should be {{\"value\": 14.0}}, got {json.dumps(sc)}",
            )
            report.check("calculator", len(out["text"]) >= 1, "no text content item")

        await step("calculator", calculator)

        # d. search_tools ---------------------------------------------------------------
        async def search_tools(out: dict[str, Any]) -> None:
            r = await call_tool(session, "search_tools", {"query": "evaluate an arithmetic expression", "k": 3})
            out["isError"] = r.get("isError", False)
            sc = r.get("structuredContent")
            report.check("search_tools", not out["isError"], f"isError is true: {texts(r)}")
            hits = sc.get("tools") if isinstance(sc, dict) else None
            if not report.check(
                "search_tools", isinstance(hits, list), f"structuredContent.tools is not a list: {json.dumps(sc)}"
            ):
                return
            out["names"] = [h.get("name") if isinstance(h, dict) else None for h in hits]
            out["scores"] = [h.get("score") if isinstance(h, dict) else None for h in hits]
            report.check("search_tools", len(hits) <= 3, f"k=3 but {len(hits)} tools returned")
            for h in hits:
                missing = [k for k in ("name", "description", "score", "inputSchema") if not isinstance(h, dict) or k not in h]
                report.check("search_tools", not missing, f"hit {json.dumps(h)[:200]} lacks {missing}")
                if isinstance(h, dict) and "score" in h:
                    report.check("search_tools", is_number(h["score"]), f"score of {h.get('name')!r} is not a number")
            report.check("search_tools", "calculator" in out["names"], f"calculator not among hits {out['names']}")

        await step("search_tools", search_tools)

        # e. create_and_execute_mcp + list_changed + call the new tool -----------------
        async def create(out: dict[str, Any]) -> None:
            r = await call_tool(session, "create_and_execute_mcp", HYPOTENUSE_ARGS)
            out["isError"] = r.get("isError", False)
            out["structuredContent"] = sc = r.get("structuredContent")
            report.check("create_and_execute_mcp", not out["isError"], f"isError is true: {texts(r)}")
            if report.check(
                "create_and_execute_mcp", isinstance(sc, dict), f"structuredContent is not an object: {json.dumps(sc)}"
            ):
                for key in ("creation_success", "execution_result", "stdout", "stderr"):
                    report.check("create_and_execute_mcp", key in sc, f"structuredContent lacks {key!r}")
                report.check(
                    "create_and_execute_mcp",
                    sc.get("creation_success") is True,
                    f"creation_success is not true (error={sc.get('error')!r}, stderr={sc.get('stderr')!r})",
                )
                report.check(
                    "create_and_execute_mcp",
                    close_to(sc.get("execution_result"), 5.0),
                    f"execution_result should be 5.0, got {json.dumps(sc.get('execution_result'))}",
                )

        await step("create_and_execute_mcp", create)

        async def after_create(out: dict[str, Any]) -> None:
            if "exception" in report.steps.get("create_and_execute_mcp", {}):
                out["skipped"] = "create_and_execute_mcp raised"
                return
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(list_changed.wait(), LIST_CHANGED_WAIT_S)
            except asyncio.TimeoutError:
                pass
            out["list_changed_observed"] = list_changed.is_set()
            out["list_changed_wait_s"] = round(time.monotonic() - t0, 3)
            report.check(
                "list_changed",
                list_changed.is_set(),
                f"no {LIST_CHANGED} notification within {LIST_CHANGED_WAIT_S:.0f}s after create_and_execute_mcp",
            )
            tools, pages, problems = await list_all_tools(session)
            names = [t.get("name") for t in tools]
            out["pages"] = pages
            out["tool_names"] = names
            for p in problems:
                report.fail("list_changed", p)
            if not report.check("list_changed", "hypotenuse" in names, f"hypotenuse not in tools/list after create: {names}"):
                return
            hyp = next(t for t in tools if t.get("name") == "hypotenuse")
            out["hypotenuse_tool"] = hyp
            report.check("list_changed", isinstance(hyp.get("inputSchema"), dict), "hypotenuse has no inputSchema")
            r = await call_tool(session, "hypotenuse", {"a": 6, "b": 8})
            out["call_isError"] = r.get("isError", False)
            out["call_structuredContent"] = r.get("structuredContent")
            out["call_text"] = texts(r)
            value, where = numeric_result(r)
            out["call_value"], out["call_value_from"] = value, where
            report.check("list_changed", not out["call_isError"], f"calling hypotenuse gave isError: {out['call_text']}")
            report.check("list_changed", close_to(value, 10.0), f"hypotenuse(6, 8) should be 10, got {json.dumps(r)[:400]}")

        await step("list_changed", after_create)

        # f. bad arguments -> isError result with a structured error ----------------------
        async def bad_args(out: dict[str, Any]) -> None:
            try:
                r = await call_tool(session, "calculator", {"expr": 1})
            except ProtocolError as exc:
                out["outcome"] = "protocol_error"
                report.fail(
                    "bad_args",
                    f"server answered bad arguments with a JSON-RPC error ({describe_exc(exc)}) "
                    "instead of a result with isError: true",
                )
                return
            except RuntimeError as exc:  # the SDK's client-side outputSchema validation
                out["outcome"] = "sdk_validation_error"
                report.fail(
                    "bad_args",
                    f"the mcp SDK rejected the error result client-side ({exc}); is isError set on it?",
                )
                return
            out["outcome"] = "result"
            out["isError"] = r.get("isError", False)
            out["structuredContent"] = r.get("structuredContent")
            out["text"] = texts(r)
            report.check("bad_args", out["isError"] is True, f"isError should be true, got result {json.dumps(r)[:400]}")
            # An error result carries no structuredContent (it would not match the tool's
            # outputSchema); the structured error is in _meta and, as JSON, in a text block.
            report.check(
                "bad_args", out["structuredContent"] is None, "an error result must not carry structuredContent"
            )
            meta = r.get("_meta") or {}
            err = meta.get("toolsmith/error")
            from_text = None
            for t in out["text"]:
                try:
                    parsed = json.loads(t)
                except ValueError:
                    continue
                if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
                    from_text = parsed["error"]
            report.check("bad_args", from_text == err, f"the JSON text block {from_text!r} differs from _meta's {err!r}")
            if report.check(
                "bad_args", isinstance(err, dict), f"_meta['toolsmith/error'] missing, got {json.dumps(meta)}"
            ):
                out["kind"] = err.get("kind")
                out["tool"] = err.get("tool")
                out["message"] = err.get("message")
                report.check("bad_args", err.get("kind") == "invalid_args", f"error.kind should be 'invalid_args', got {err.get('kind')!r}")
                report.check("bad_args", err.get("tool") == "calculator", f"error.tool should be 'calculator', got {err.get('tool')!r}")
                report.check(
                    "bad_args",
                    isinstance(err.get("message"), str) and err["message"].strip() != "",
                    "error.message is missing or empty",
                )
            report.check(
                "bad_args",
                any(t.strip() for t in out["text"]),
                "no readable text content in the error result",
            )

        await step("bad_args", bad_args)

        # g. unknown tool: record only ----------------------------------------------------
        async def unknown_tool(out: dict[str, Any]) -> None:
            try:
                r = await call_tool(session, "no_such_tool", {})
            except ProtocolError as exc:
                out["outcome"] = "protocol_error"
                out["code"] = exc.error.code
                out["message"] = exc.error.message
                return
            except RuntimeError as exc:
                out["outcome"] = "sdk_runtime_error"
                out["message"] = str(exc)
                return
            out["outcome"] = "is_error_result" if r.get("isError") else "success_result"
            out["structuredContent"] = r.get("structuredContent")
            out["text"] = texts(r)

        await step("unknown_tool", unknown_tool)
        report.data["current_step"] = None


# --------------------------------------------------------------------------- transports


@asynccontextmanager
async def stdio_transport(command: list[str]) -> AsyncIterator[tuple[Any, Any]]:
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ), cwd=os.getcwd())
    async with stdio_client(params) as (read, write):
        yield read, write


@asynccontextmanager
async def http_transport(url: str, token: str | None, report: Report) -> AsyncIterator[tuple[Any, Any]]:
    import httpx2  # the HTTP client library mcp 2.x is built on
    from mcp.client.streamable_http import streamable_http_client

    # Diagnostics for the report: the session id the server assigned (if any), one
    # line per HTTP exchange, and the headers the SDK sent on its first POST/GET.
    http: dict[str, Any] = {"session_id": None, "exchanges": [], "request_headers": {}}
    report.data["http"] = http

    async def on_request(request: Any) -> None:
        if request.method not in http["request_headers"]:
            http["request_headers"][request.method] = {
                k: v for k, v in request.headers.items() if k.lower() != "authorization"
            }

    async def on_response(response: Any) -> None:
        sid = response.headers.get("mcp-session-id")
        if sid and http["session_id"] is None:
            http["session_id"] = sid
        ctype = response.headers.get("content-type", "").split(";")[0]
        http["exchanges"].append(f"{response.request.method} {response.status_code} {ctype}".rstrip())

    headers = {"Authorization": f"Bearer {token}"} if token else None
    # Same timeouts as the SDK's default client (30 s, 300 s read for SSE streams).
    client = httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(30.0, read=300.0),
        event_hooks={"request": [on_request], "response": [on_response]},
    )
    async with client:
        async with streamable_http_client(url, http_client=client) as streams:
            read, write = streams[0], streams[1]
            yield read, write


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    server_cmd: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, server_cmd = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(prog="client.py", description="MCP end-to-end client driver (official mcp SDK).")
    p.add_argument("--timeout", type=float, default=60.0, help="global deadline in seconds (default 60)")
    p.add_argument("--min-pages", type=int, default=1, help="require at least N tools/list pages")
    sub = p.add_subparsers(dest="transport", required=True)
    sub.add_parser("stdio", help="spawn the server: stdio -- CMD [ARGS...]")
    h = sub.add_parser("http", help="connect over streamable HTTP: http URL [--token TOKEN]")
    h.add_argument("url")
    h.add_argument("--token", default=os.environ.get("TOOLSMITH_MCP_TOKEN"), help="bearer token")
    for sp in sub.choices.values():  # accept the global options after the subcommand too
        sp.add_argument("--timeout", type=float, default=argparse.SUPPRESS)
        sp.add_argument("--min-pages", type=int, default=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.transport == "stdio":
        if not server_cmd:
            p.error("stdio needs the server command after `--`: client.py stdio -- CMD [ARGS...]")
        args.command = server_cmd
    elif server_cmd:
        p.error("unexpected `--` for the http transport")
    return args


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    if args.transport == "stdio":
        report = Report("stdio", args.command)
        transport = stdio_transport(args.command)
    else:
        report = Report("http", args.url)
        report.data["token_sent"] = bool(args.token)
        transport = http_transport(args.url, args.token, report)

    async def body() -> None:
        async with transport as (read, write):
            await run_scenario(read, write, report, args.min_pages)

    try:
        await asyncio.wait_for(body(), args.timeout)
    except asyncio.TimeoutError:
        report.fail(
            str(report.data["current_step"] or "connect"),
            f"global timeout: scenario did not finish within {args.timeout:.0f}s",
        )
    except BaseException as exc:  # connection failures, task-group errors, server crash
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        report.fail(str(report.data["current_step"] or "connect"), f"transport/session failed: {describe_exc(exc)}")
        traceback.print_exc(file=sys.stderr)
    return report.finish()


def main() -> int:
    args = parse_args(sys.argv[1:])
    report = asyncio.run(amain(args))
    sys.stdout.write(json.dumps(report, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
