#!/usr/bin/env python3
"""End-to-end OpenEnv client checks for `toolsmith env serve`, using openenv-core's own clients
and its `openenv validate` CLI.

Run it with the interpreter printed (last stdout line) by `scripts/openenv-clients-env.sh`, which
holds the pinned openenv-core (its `openenv` console script sits beside the interpreter):

    PY=$(scripts/openenv-clients-env.sh | tail -n 1)
    $PY tests/openenv/client.py --base-url http://127.0.0.1:PORT [--timeout SECS] [--only a,b]

Checks, in order (each one entry of the report's `checks`; every check runs even when an earlier
one failed):
    validate             `openenv validate --url URL` exits 0 and its JSON report says passed
    sync_episode         GenericEnvClient(...).sync(): reset(task_id=<first task of GET /tasks>)
                         gives messages[0].role == "system" and the task's question; a step with an
                         answer turn ends the episode with a numeric reward; state() has
                         step_count 1 and the episode's id
    async_episode        the async GenericEnvClient: reset + the same step
    bad_action           step({"bad": 1}) raises RuntimeError naming VALIDATION_ERROR; the same
                         connection then still resets
    mcp_tools            MCPToolClient (over /ws): list_tools() includes `search`;
                         call_tool("search", query=<the question>) returns a non-error result
    mcp_production       MCPToolClient with use_production_mode=True (HTTP POST /mcp) lists the
                         same tools
    concurrent_sessions  two sync clients connected at once keep separate step counts

Exactly one JSON object is printed to stdout at the end:
    {"passed": bool, "checks": [{"name": str, "passed": bool, "detail": str|object}, ...]}
Exit status 0 when every check that ran passed, 1 otherwise, 2 on a usage error. Progress and
tracebacks go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any, Callable

from openenv.core import GenericEnvClient, MCPToolClient

CHECKS = (
    "validate",
    "sync_episode",
    "async_episode",
    "bad_action",
    "mcp_tools",
    "mcp_production",
    "concurrent_sessions",
)
ANSWER_TURN = "<answer>\\boxed{nothing}</answer>"


class CheckFailed(AssertionError):
    """A failed expectation; its argument is the check's detail."""


def expect(cond: bool, detail: Any) -> None:
    if not cond:
        raise CheckFailed(detail)


def short(value: Any, limit: int = 600) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class Context:
    def __init__(self, base_url: str, timeout: float):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._task: dict | None = None

    def http_json(self, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data,
                                     headers={"Content-Type": "application/json"} if data else {})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return json.loads(resp.read().decode())

    def task(self) -> dict:
        """The first task of GET /tasks."""
        if self._task is None:
            listing = self.http_json("/tasks")
            tasks = listing.get("tasks") if isinstance(listing, dict) else None
            expect(isinstance(tasks, list) and tasks, f"GET /tasks has no tasks: {short(listing)}")
            first = tasks[0]
            expect(isinstance(first, dict) and isinstance(first.get("task_id"), str)
                   and isinstance(first.get("question"), str),
                   f"GET /tasks entry lacks task_id/question: {short(first)}")
            self._task = first
        return self._task

    def reset_kwargs(self) -> dict:
        t = self.task()
        kw = {"task_id": t["task_id"]}
        if isinstance(t.get("world"), int):
            kw["world"] = t["world"]
        return kw

    def sync_client(self):
        return GenericEnvClient(base_url=self.base_url, connect_timeout_s=self.timeout,
                                message_timeout_s=self.timeout).sync()


def check_reset(ctx: Context, result) -> dict:
    obs = result.observation
    expect(isinstance(obs, dict), f"reset observation is not an object: {short(obs)}")
    msgs = obs.get("messages")
    expect(isinstance(msgs, list) and msgs and isinstance(msgs[0], dict),
           f"reset observation has no messages: {short(obs)}")
    expect(msgs[0].get("role") == "system", f"messages[0].role is {msgs[0].get('role')!r}, not 'system'")
    expect(obs.get("question") == ctx.task()["question"],
           f"question {obs.get('question')!r} != the task's {ctx.task()['question']!r}")
    expect(result.done is False, f"reset says done={result.done!r}")
    expect(result.reward is None, f"reset reward is {result.reward!r}, expected null")
    return obs


def check_answer_step(result) -> None:
    expect(result.done is True, f"the answer turn did not end the episode: done={result.done!r}, "
                                f"observation={short(result.observation)}")
    expect(is_number(result.reward), f"final reward is not a number: {result.reward!r}")
    res = result.observation.get("result") if isinstance(result.observation, dict) else None
    expect(isinstance(res, dict) and res, f"done observation has an empty result: {short(result.observation)}")


# ---------------------------------------------------------------------------------------------
def c_validate(ctx: Context):
    exe = Path(sys.executable).parent / ("openenv.exe" if os.name == "nt" else "openenv")
    expect(exe.exists(), f"no openenv console script beside {sys.executable}")
    proc = subprocess.run([str(exe), "validate", "--url", ctx.base_url], capture_output=True, text=True,
                          timeout=ctx.timeout)
    out = proc.stdout
    report = None
    start = out.find("{")
    if start >= 0:
        try:
            report = json.loads(out[start:])
        except json.JSONDecodeError:
            report = None
    failed = report.get("summary", {}).get("failed_criteria") if isinstance(report, dict) else None
    detail = {"exit": proc.returncode, "passed": report.get("passed") if isinstance(report, dict) else None,
              "failed_criteria": failed}
    if not isinstance(report, dict) or proc.returncode != 0 or report.get("passed") is not True:
        detail["stdout"] = short(out, 3000)
        detail["stderr"] = short(proc.stderr, 1000)
        if isinstance(report, dict):
            detail["failed"] = [c for c in report.get("criteria", []) if not c.get("passed")]
        raise CheckFailed(detail)
    return detail


def c_sync_episode(ctx: Context):
    with ctx.sync_client() as env:
        r = env.reset(**ctx.reset_kwargs())
        obs = check_reset(ctx, r)
        episode = obs.get("episode_id")
        r = env.step({"text": ANSWER_TURN})
        check_answer_step(r)
        st = env.state()
    expect(isinstance(st, dict), f"state is not an object: {short(st)}")
    expect(st.get("step_count") == 1, f"state step_count is {st.get('step_count')!r}, expected 1: {short(st)}")
    if episode is not None:
        expect(st.get("episode_id") == episode, f"state episode_id {st.get('episode_id')!r} != the "
                                               f"observation's {episode!r}")
    return {"reward": r.reward, "outcome": r.observation["result"].get("outcome"), "state": st}


def c_async_episode(ctx: Context):
    async def run():
        async with GenericEnvClient(base_url=ctx.base_url, connect_timeout_s=ctx.timeout,
                                    message_timeout_s=ctx.timeout) as env:
            r = await env.reset(**ctx.reset_kwargs())
            check_reset(ctx, r)
            r = await env.step({"text": ANSWER_TURN})
            check_answer_step(r)
            st = await env.state()
            expect(st.get("step_count") == 1, f"state step_count {st.get('step_count')!r}, expected 1")
            return {"reward": r.reward, "step_count": st.get("step_count")}
    return asyncio.run(asyncio.wait_for(run(), ctx.timeout))


def c_bad_action(ctx: Context):
    with ctx.sync_client() as env:
        env.reset(**ctx.reset_kwargs())
        try:
            r = env.step({"bad": 1})
        except RuntimeError as e:
            msg = str(e)
        else:
            raise CheckFailed(f"step({{'bad': 1}}) did not raise; it answered {short(r.observation)}, "
                              f"reward={r.reward!r}, done={r.done!r}")
        expect("VALIDATION_ERROR" in msg, f"the error does not name VALIDATION_ERROR: {msg}")
        r = env.reset(**ctx.reset_kwargs())
        check_reset(ctx, r)
        st = env.state()
        expect(st.get("step_count") == 0, f"after the fresh reset step_count is {st.get('step_count')!r}")
    return {"error": msg}


def tool_names(tools) -> list[str]:
    return sorted(t.name for t in tools)


def c_mcp_tools(ctx: Context):
    async def run():
        async with MCPToolClient(base_url=ctx.base_url, connect_timeout_s=ctx.timeout,
                                 message_timeout_s=ctx.timeout) as m:
            await m.reset(**ctx.reset_kwargs())
            tools = await m.list_tools()
            names = tool_names(tools)
            expect("search" in names, f"list_tools() has no 'search': {names}")
            search = next(t for t in tools if t.name == "search")
            props = (search.input_schema or {}).get("properties", {})
            expect("query" in props, f"search's input_schema has no 'query': {short(search.input_schema)}")
            # call_tool raises RuntimeError when the observation carries an error.
            out = await m.call_tool("search", query=ctx.task()["question"])
            expect(out is not None, "call_tool('search') returned None")
            # call_tool falls back to returning the parsed observation itself when the reply was not
            # recognised as a call_tool observation (no `tool_name`, or a `tools` key that wins).
            expect(not type(out).__name__.endswith("Observation"),
                   f"call_tool('search')'s reply was parsed as {type(out).__name__}, not CallToolObservation: "
                   f"{short(getattr(out, 'model_dump', lambda: out)())}")
            if isinstance(out, dict):
                expect(not out.get("is_error") and not out.get("isError"),
                       f"call_tool('search') returned an error result: {short(out)}")
            return {"tools": names, "result": short(out, 300)}
    return asyncio.run(asyncio.wait_for(run(), ctx.timeout))


def c_mcp_production(ctx: Context):
    async def names_over(production: bool):
        async with MCPToolClient(base_url=ctx.base_url, connect_timeout_s=ctx.timeout,
                                 message_timeout_s=ctx.timeout) as m:
            if production:
                m.use_production_mode = True
            else:
                await m.reset(**ctx.reset_kwargs())
            return tool_names(await m.list_tools())

    async def run():
        prod = await names_over(True)
        if not prod:
            # The client swallows errors in production mode and answers []; show the raw exchange.
            raw = {}
            try:
                created = ctx.http_json("/mcp", {"jsonrpc": "2.0", "method": "openenv/session/create",
                                                 "params": {}, "id": 1})
                raw["openenv/session/create"] = created
                sid = (created.get("result") or {}).get("session_id")
                raw["tools/list"] = ctx.http_json("/mcp", {"jsonrpc": "2.0", "method": "tools/list",
                                                           "params": {"session_id": sid}, "id": 2})
            except Exception as e:  # noqa: BLE001 - reported
                raw["exception"] = repr(e)
            raise CheckFailed({"production_tools": prod, "raw": short(raw, 2000)})
        sim = await names_over(False)
        expect(prod == sim, {"production_tools": prod, "ws_tools": sim})
        expect("search" in prod, f"no 'search' among {prod}")
        return {"tools": prod}
    return asyncio.run(asyncio.wait_for(run(), ctx.timeout))


def c_concurrent_sessions(ctx: Context):
    a, b = ctx.sync_client(), ctx.sync_client()
    try:
        a.connect()
        b.connect()
        ra = a.reset(**ctx.reset_kwargs())
        rb = b.reset(**ctx.reset_kwargs())
        ea, eb = ra.observation.get("episode_id"), rb.observation.get("episode_id")
        expect(ea is None or ea != eb, f"both sessions got episode_id {ea!r}")
        r = a.step({"text": ANSWER_TURN})
        check_answer_step(r)
        sa, sb = a.state(), b.state()
        expect(sa.get("step_count") == 1 and sb.get("step_count") == 0,
               f"after one step on A: A step_count {sa.get('step_count')!r} (want 1), "
               f"B step_count {sb.get('step_count')!r} (want 0)")
        expect(sb.get("done") in (None, False), f"B is done though only A stepped: {short(sb)}")
        r = b.step({"text": ANSWER_TURN})
        check_answer_step(r)
        sa, sb = a.state(), b.state()
        expect(sa.get("step_count") == 1 and sb.get("step_count") == 1,
               f"after one step each: A {sa.get('step_count')!r}, B {sb.get('step_count')!r}")
        if ea is not None:
            expect(sa.get("episode_id") == ea and sb.get("episode_id") == eb,
                   f"states' episode ids {sa.get('episode_id')!r}/{sb.get('episode_id')!r} != {ea!r}/{eb!r}")
        return {"a": sa, "b": sb}
    finally:
        for c in (a, b):
            try:
                c.close()
            except Exception:  # noqa: BLE001 - best effort
                pass


RUNNERS: dict[str, Callable[[Context], Any]] = {
    "validate": c_validate,
    "sync_episode": c_sync_episode,
    "async_episode": c_async_episode,
    "bad_action": c_bad_action,
    "mcp_tools": c_mcp_tools,
    "mcp_production": c_mcp_production,
    "concurrent_sessions": c_concurrent_sessions,
}


def main() -> int:
    ap = argparse.ArgumentParser(description="openenv-core client checks against `toolsmith env serve`")
    ap.add_argument("--base-url", required=True, help="the server's base URL, e.g. http://127.0.0.1:PORT")
    ap.add_argument("--timeout", type=float, default=60.0, help="per-request / per-check timeout (s)")
    ap.add_argument("--only", default="", help="comma-separated subset of: " + ",".join(CHECKS))
    a = ap.parse_args()
    only = [c for c in a.only.split(",") if c]
    unknown = [c for c in only if c not in CHECKS]
    if unknown:
        ap.error(f"unknown checks {unknown}; known: {list(CHECKS)}")

    ctx = Context(a.base_url, a.timeout)
    checks = []
    for name in CHECKS:
        if only and name not in only:
            continue
        t0 = time.monotonic()
        try:
            detail = RUNNERS[name](ctx)
            ok = True
        except CheckFailed as e:
            ok, detail = False, e.args[0] if e.args else "failed"
        except Exception as e:  # noqa: BLE001 - every check runs; the failure is reported
            ok, detail = False, f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
        dt = time.monotonic() - t0
        print(f"openenv-client: {'PASS' if ok else 'FAIL'} {name} ({dt:.2f}s)", file=sys.stderr)
        checks.append({"name": name, "passed": ok, "detail": detail, "seconds": round(dt, 3)})

    passed = bool(checks) and all(c["passed"] for c in checks)
    print(json.dumps({"passed": passed, "checks": checks}, default=str))
    n_ok = sum(c["passed"] for c in checks)
    print(f"openenv-client: {n_ok} passed, {len(checks) - n_ok} failed", file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
