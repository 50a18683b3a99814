#!/usr/bin/env python3
"""End-to-end OpenAI function-calling driver for `toolsmith serve --http`, using the official
`openai` SDK and the `openai-agents` SDK.

Run it with the interpreter printed (last stdout line) by `scripts/openai-client-env.sh`, which
holds the pinned SDKs:

    PY=$(scripts/openai-client-env.sh | tail -n 1)
    $PY tests/openai/client.py --base-url http://127.0.0.1:PORT/v1 --model NAME [--timeout SECS]

Options:
    --base-url URL     the server's OpenAI base URL, ending in /v1
    --model NAME       the model name the server was started with (--model-name)
    --timeout SECS     global deadline for the whole scenario (default 300)
    --seed N           the seed sent with every request (default 1234)
    --only A,B         run only these checks (the others are reported as skipped)

The served model is a random tiny model, so its text is gibberish: the checks assert only what the
protocol and the decoding constraints guarantee (shapes, schema validity of constrained output,
determinism for a fixed seed at temperature 0, 400s naming the bad item), never meaningful text.

Checks, in order (each one entry of the report's `checks`):
    models                 GET /v1/models lists --model
    chat_with_tools        two function tools, tool_choice "auto": a well-formed reply
    forced_call            a named tool_choice and "required" + parallel_tool_calls false: calls whose
                           arguments validate against the tool's schema; a repeat gives the same calls
    multi_turn             developer role, content parts, the assistant's tool_calls (content null) and
                           tool results sent back, tool_choice "none": a plain string reply
    streamed_call          the forced call streamed with include_usage: delta.tool_calls accumulate to
                           the non-streamed calls; finish_reason last; one final usage chunk
    structured_output      response_format json_schema (strict) and json_object
    n_and_logprobs         n=2 with logprobs (the sampled token's; top_logprobs is refused)
    bad_requests_are_400   invalid requests raise openai.BadRequestError naming the offending item
    agents_sdk             openai-agents Runner.run with a required function tool, stop_on_first_tool
    agents_sdk_streamed    the same through Runner.run_streamed
    agents_sdk_multi_turn  the tool's result sent back by the agents SDK, the model asked once more

Every check runs even when an earlier one failed. Exactly one JSON report is printed to stdout at
the end; exit status 0 when every check that ran passed, 1 when any failed (the report's
`failures` lists them), 2 on a usage error. SDK chatter and tracebacks go to stderr, closing with
one line `openai-client: N passed, N failed`.

No host but the base URL's is ever contacted: name resolution of any other host is refused in
this process (and reported under `network`), and the agents SDK's tracing is disabled.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import socket
import sys
import time
import traceback
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

# The agents SDK reads this when its trace provider is created; set it before any import of it.
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"

import jsonschema
import openai
from openai import AsyncOpenAI

try:
    _EXCEPTION_GROUPS: tuple[type, ...] = (BaseExceptionGroup,)
except NameError:  # Python 3.10 has no builtin exception groups
    _EXCEPTION_GROUPS = ()

CHECKS = (
    "models",
    "chat_with_tools",
    "forced_call",
    "multi_turn",
    "streamed_call",
    "structured_output",
    "n_and_logprobs",
    "bad_requests_are_400",
    "agents_sdk",
    "agents_sdk_streamed",
    "agents_sdk_multi_turn",
)

REQUEST_TIMEOUT_S = 120.0
FAILURE_SAMPLES = 5  # per-chunk problems reported per streamed check before summarising

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
FACTORIAL_NAME = "math.factorial"  # dotted on purpose: names are not always plain identifiers
FACTORIAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 20}},
    "required": ["n"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": WEATHER_SCHEMA,
        },
    },
    {
        "type": "function",
        "function": {
            "name": FACTORIAL_NAME,
            "description": "The factorial of a small non-negative integer",
            "parameters": FACTORIAL_SCHEMA,
        },
    },
]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, FACTORIAL_NAME: FACTORIAL_SCHEMA}
FORCE_WEATHER = {"type": "function", "function": {"name": "get_weather"}}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]

PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "color": {"type": "string", "enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "color"],
    "additionalProperties": False,
}

CAPITAL_ANSWER = "The capital is Paris (from lookup_capital)."
MULTI_TURN_SECOND_CALL = "(the model called a tool again instead of answering)"

# --------------------------------------------------------------------------- helpers


def sdk_info() -> dict[str, str]:
    info = {}
    for dist in ("openai", "openai-agents", "jsonschema"):
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[dist] = "missing"
    return info


class Report:
    def __init__(self, base_url: str, model: str, seed: int) -> None:
        self.data: dict[str, Any] = {
            "ok": False,
            "base_url": base_url,
            "model": model,
            "seed": seed,
            "sdk": sdk_info(),
            "passed": [],
            "failed": [],
            "skipped": [],
            "current_check": None,
            "checks": {},
            "network": {"allowed_host": urlsplit(base_url).hostname, "refused_hosts": []},
            "failures": [],
        }

    @property
    def checks(self) -> dict[str, Any]:
        return self.data["checks"]

    def fail(self, check: str, message: str) -> None:
        self.data["failures"].append(f"[{check}] {message}")

    def check(self, check: str, cond: bool, message: str) -> bool:
        if not cond:
            self.fail(check, message)
        return cond

    def finish(self) -> dict[str, Any]:
        failed_names = {f[1 : f.index("]")] for f in self.data["failures"] if f.startswith("[") and "]" in f}
        for name, out in self.checks.items():
            if "skipped" in out:
                continue
            out["ok"] = name not in failed_names
            (self.data["passed"] if out["ok"] else self.data["failed"]).append(name)
        for name in sorted(failed_names - set(self.checks)):
            self.data["failed"].append(name)
        self.data["ok"] = not self.data["failures"]
        return self.data


def describe_exc(exc: BaseException) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"{type(exc).__name__} (HTTP {exc.status_code}): {error_message(exc)}"
    if isinstance(exc, openai.APIConnectionError):
        cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        return f"{type(exc).__name__}: {exc}{cause}"
    if _EXCEPTION_GROUPS and isinstance(exc, _EXCEPTION_GROUPS):
        return "; ".join(describe_exc(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def error_message(exc: openai.APIStatusError) -> str:
    """The server's error.message, else the SDK's text."""
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    return str(exc)


def schema_errors(schema: dict[str, Any], instance: Any) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(instance)]


def parse_json(text: Any) -> tuple[Any, str | None]:
    if not isinstance(text, str):
        return None, f"not a string: {text!r}"
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"not JSON ({exc}): {text[:200]!r}"


def calls_of(message: Any) -> list[tuple[Any, Any]]:
    """(name, arguments) of each tool call of a message, in order."""
    return [
        (getattr(getattr(tc, "function", None), "name", None), getattr(getattr(tc, "function", None), "arguments", None))
        for tc in (getattr(message, "tool_calls", None) or [])
    ]


def tool_call_dicts(message: Any) -> list[dict[str, Any]]:
    return [
        {"id": tc.id, "type": tc.type, "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
        for tc in (message.tool_calls or [])
    ]


class Ctx:
    """What the scenario shares between checks."""

    def __init__(self, client: AsyncOpenAI, args: argparse.Namespace, report: Report) -> None:
        self.client = client
        self.model: str = args.model
        self.seed: int = args.seed
        self.base_url: str = args.base_url
        self.report = report
        self.forced: Any = None  # the ChatCompletion of forced_call's named-function request

    async def create(self, **kwargs: Any) -> Any:
        kwargs.setdefault("model", self.model)
        kwargs.setdefault("seed", self.seed)
        return await self.client.chat.completions.create(**kwargs)

    def forced_request(self) -> dict[str, Any]:
        return dict(messages=WEATHER_QUESTION, tools=TOOLS, tool_choice=FORCE_WEATHER, temperature=0, max_tokens=200)


def check_envelope(report: Report, name: str, resp: Any, n: int = 1) -> bool:
    """The non-streamed chat.completion fields every client relies on."""
    ok = report.check(name, getattr(resp, "object", None) == "chat.completion", f"object should be 'chat.completion', got {getattr(resp, 'object', None)!r}")
    ok &= report.check(name, isinstance(getattr(resp, "id", None), str) and resp.id != "", "id missing or empty")
    ok &= report.check(name, isinstance(getattr(resp, "created", None), int), f"created should be an integer, got {getattr(resp, 'created', None)!r}")
    ok &= report.check(name, isinstance(getattr(resp, "model", None), str), "model missing")
    choices = getattr(resp, "choices", None) or []
    ok &= report.check(name, len(choices) == n, f"expected {n} choice(s), got {len(choices)}")
    ok &= report.check(name, [getattr(c, "index", None) for c in choices] == list(range(len(choices))), f"choice indexes should be 0..{len(choices) - 1}, got {[getattr(c, 'index', None) for c in choices]}")
    for c in choices:
        ok &= report.check(name, getattr(getattr(c, "message", None), "role", None) == "assistant", f"choice {c.index}: message.role should be 'assistant'")
    usage = getattr(resp, "usage", None)
    if report.check(name, usage is not None, "usage missing"):
        p, c, t = (getattr(usage, k, None) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
        ok &= report.check(name, all(isinstance(x, int) for x in (p, c, t)) and p + c == t, f"usage should hold integer prompt/completion/total tokens with total = sum, got {usage}")
    else:
        ok = False
    return ok


def check_tool_calls(report: Report, name: str, message: Any, allowed: dict[str, dict[str, Any]], validate: bool) -> list[dict[str, Any]]:
    """Shape (and, with validate, schema validity) of each tool call; returns them for the report."""
    seen: list[dict[str, Any]] = []
    ids: list[Any] = []
    for i, tc in enumerate(message.tool_calls or []):
        fn = getattr(tc, "function", None)
        fname, fargs = getattr(fn, "name", None), getattr(fn, "arguments", None)
        seen.append({"id": getattr(tc, "id", None), "type": getattr(tc, "type", None), "name": fname, "arguments": fargs})
        ids.append(getattr(tc, "id", None))
        report.check(name, isinstance(getattr(tc, "id", None), str) and tc.id != "", f"tool_calls[{i}].id missing or empty")
        report.check(name, getattr(tc, "type", None) == "function", f"tool_calls[{i}].type should be 'function', got {getattr(tc, 'type', None)!r}")
        report.check(name, fname in allowed, f"tool_calls[{i}].function.name {fname!r} is not one of {sorted(allowed)}")
        report.check(name, isinstance(fargs, str), f"tool_calls[{i}].function.arguments should be a string, got {type(fargs).__name__}")
        if validate and isinstance(fargs, str) and fname in allowed:
            value, err = parse_json(fargs)
            if not report.check(name, err is None, f"tool_calls[{i}] ({fname}) arguments are {err}"):
                continue
            if not report.check(name, isinstance(value, dict), f"tool_calls[{i}] ({fname}) arguments are not a JSON object: {fargs[:200]!r}"):
                continue
            errors = schema_errors(allowed[fname], value)
            report.check(name, not errors, f"tool_calls[{i}] ({fname}) arguments {fargs[:200]!r} break its schema: {errors}")
    report.check(name, len(set(ids)) == len(ids), f"tool call ids are not unique: {ids}")
    return seen


# --------------------------------------------------------------------------- checks


async def check_models(ctx: Ctx, out: dict[str, Any]) -> None:
    page = await ctx.client.models.list()
    ids = [m.id for m in page.data]
    out["ids"] = ids
    ctx.report.check("models", ctx.model in ids, f"/v1/models does not list {ctx.model!r} (got {ids})")


async def check_chat_with_tools(ctx: Ctx, out: dict[str, Any]) -> None:
    r, name = ctx.report, "chat_with_tools"
    resp = await ctx.create(messages=WEATHER_QUESTION, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=48)
    if not check_envelope(r, name, resp):
        if not resp.choices:
            return
    choice = resp.choices[0]
    msg = choice.message
    out["finish_reason"] = choice.finish_reason
    out["content"] = msg.content
    r.check(name, choice.finish_reason in ("stop", "length", "tool_calls"), f"finish_reason {choice.finish_reason!r} not in stop/length/tool_calls")
    out["tool_calls"] = check_tool_calls(r, name, msg, SCHEMAS, validate=False)
    if choice.finish_reason == "tool_calls":
        r.check(name, bool(msg.tool_calls), "finish_reason is 'tool_calls' but message.tool_calls is empty")
    if not msg.tool_calls:
        r.check(name, isinstance(msg.content, str), f"no tool calls, so message.content should be a string, got {msg.content!r}")


async def check_forced_call(ctx: Ctx, out: dict[str, Any]) -> None:
    r, name = ctx.report, "forced_call"

    # Named function.
    resp = await ctx.create(**ctx.forced_request())
    check_envelope(r, name, resp)
    if resp.choices:
        choice = resp.choices[0]
        out["named"] = named = {"finish_reason": choice.finish_reason, "content": choice.message.content}
        r.check(name, choice.finish_reason == "tool_calls", f"named tool_choice: finish_reason should be 'tool_calls', got {choice.finish_reason!r}")
        calls = choice.message.tool_calls or []
        r.check(name, len(calls) >= 1, "named tool_choice: no tool call in the message")
        r.check(name, all(c.function.name == "get_weather" for c in calls), f"named tool_choice: every call must be get_weather, got {[c.function.name for c in calls]}")
        named["tool_calls"] = check_tool_calls(r, name, choice.message, {"get_weather": WEATHER_SCHEMA}, validate=True)
        r.check(name, choice.message.content is None or isinstance(choice.message.content, str), "message.content must be null or a string")
        if calls:
            ctx.forced = resp

        # The same request again: same seed, temperature 0 -> the same calls.
        again = await ctx.create(**ctx.forced_request())
        if again.choices:
            same = calls_of(again.choices[0].message) == calls_of(choice.message)
            named["repeat_identical"] = same
            r.check(name, same, f"the same request (seed {ctx.seed}, temperature 0) gave different calls: {calls_of(choice.message)} then {calls_of(again.choices[0].message)}")

    # "required", one call only.
    resp = await ctx.create(messages=WEATHER_QUESTION, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=200)
    check_envelope(r, name, resp)
    if resp.choices:
        choice = resp.choices[0]
        out["required"] = req = {"finish_reason": choice.finish_reason}
        r.check(name, choice.finish_reason == "tool_calls", f"tool_choice 'required': finish_reason should be 'tool_calls', got {choice.finish_reason!r}")
        calls = choice.message.tool_calls or []
        r.check(name, len(calls) == 1, f"tool_choice 'required' with parallel_tool_calls false: expected exactly one call, got {len(calls)}")
        req["tool_calls"] = check_tool_calls(r, name, choice.message, SCHEMAS, validate=True)


async def check_multi_turn(ctx: Ctx, out: dict[str, Any]) -> None:
    r, name = ctx.report, "multi_turn"

    def plain_answer(resp: Any, label: str) -> None:
        check_envelope(r, name, resp)
        if not resp.choices:
            return
        choice = resp.choices[0]
        out[label] = {"finish_reason": choice.finish_reason, "content": choice.message.content}
        r.check(name, not choice.message.tool_calls, f"{label}: tool_choice 'none' but the reply has tool_calls {tool_call_dicts(choice.message)}")
        r.check(name, isinstance(choice.message.content, str), f"{label}: message.content should be a string, got {choice.message.content!r}")
        r.check(name, choice.finish_reason in ("stop", "length"), f"{label}: finish_reason should be 'stop' or 'length', got {choice.finish_reason!r}")

    # A developer message and a user message given as content parts.
    parts = [
        {"role": "developer", "content": "Answer in one short sentence."},
        {"role": "user", "content": [{"type": "text", "text": "Say hello."}, {"type": "text", "text": "Then stop."}]},
    ]
    plain_answer(await ctx.create(messages=parts, temperature=0, max_tokens=24), "developer_and_parts")

    # The assistant's tool calls from forced_call, the tool's results, then a plain answer.
    if ctx.forced is not None:
        assistant_calls = tool_call_dicts(ctx.forced.choices[0].message)
        out["source"] = "forced_call"
    else:
        assistant_calls = [{"id": "call_multi_turn_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]
        out["source"] = "synthetic (forced_call gave no call)"
    conversation = parts[:1] + [
        {"role": "user", "content": [{"type": "text", "text": "What is the weather in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": assistant_calls},
    ]
    conversation += [{"role": "tool", "tool_call_id": c["id"], "content": '{"temperature": 21}'} for c in assistant_calls]
    out["messages_sent"] = len(conversation)
    plain_answer(await ctx.create(messages=conversation, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=32), "after_tool_result")


async def check_streamed_call(ctx: Ctx, out: dict[str, Any]) -> None:
    from openai.lib.streaming.chat import ChatCompletionStreamState

    r, name = ctx.report, "streamed_call"
    reference = ctx.forced
    if reference is None:
        out["reference"] = "fetched here (forced_call gave no call)"
        reference = await ctx.create(**ctx.forced_request())
    ref_msg = reference.choices[0].message if reference.choices else None
    ref_calls = calls_of(ref_msg) if ref_msg is not None else []

    stream = await ctx.create(**ctx.forced_request(), stream=True, stream_options={"include_usage": True})
    chunks: list[Any] = []
    problems: list[str] = []
    state = ChatCompletionStreamState()  # the SDK's own accumulator, as .stream() uses it
    state_error = None
    async for chunk in stream:
        chunks.append(chunk)
        try:
            state.handle_chunk(chunk)
        except Exception as exc:  # recorded, the manual accumulation still runs
            state_error = state_error or f"chunk {len(chunks) - 1}: {describe_exc(exc)}"

    def problem(msg: str) -> None:
        problems.append(msg)

    out["chunks"] = len(chunks)
    if not r.check(name, bool(chunks), "the stream had no chunks"):
        return

    ids = {getattr(c, "id", None) for c in chunks}
    r.check(name, len(ids) == 1 and None not in ids, f"every chunk should carry the same id, got {sorted(map(str, ids))}")
    for i, c in enumerate(chunks):
        if getattr(c, "object", None) != "chat.completion.chunk":
            problem(f"chunk {i}: object should be 'chat.completion.chunk', got {getattr(c, 'object', None)!r}")
        if not isinstance(getattr(c, "created", None), int):
            problem(f"chunk {i}: created should be an integer, got {getattr(c, 'created', None)!r}")
        if not isinstance(getattr(c, "model", None), str):
            problem(f"chunk {i}: model missing")

    choice_chunks = [(i, c) for i, c in enumerate(chunks) if c.choices]
    usage_chunks = [(i, c) for i, c in enumerate(chunks) if not c.choices]

    # Accumulate delta.tool_calls by index, the way client code does.
    acc: dict[int, dict[str, Any]] = {}
    finish_reasons: list[tuple[int, Any]] = []
    content = ""
    for i, c in choice_chunks:
        if len(c.choices) != 1 or c.choices[0].index != 0:
            problem(f"chunk {i}: expected one choice with index 0, got indexes {[ch.index for ch in c.choices]}")
        ch = c.choices[0]
        if ch.finish_reason is not None:
            finish_reasons.append((i, ch.finish_reason))
        if getattr(c, "usage", None) is not None:
            problem(f"chunk {i}: a choice chunk carries usage (it belongs in the final chunk with empty choices)")
        delta = ch.delta
        if delta is None:
            problem(f"chunk {i}: choice has no delta")
            continue
        if delta.content:
            content += delta.content
        for tc in delta.tool_calls or []:
            idx = tc.index
            if not isinstance(idx, int):
                problem(f"chunk {i}: a tool_calls delta has no integer index ({tc.to_dict()})")
                continue
            fn = tc.function
            if idx not in acc:
                acc[idx] = {"id": tc.id, "type": tc.type, "name": getattr(fn, "name", None), "arguments": "", "first_chunk": i, "pieces": 0}
                if not (isinstance(tc.id, str) and tc.id):
                    problem(f"chunk {i}: the first delta of tool call {idx} has no id")
                if not (fn is not None and isinstance(fn.name, str) and fn.name):
                    problem(f"chunk {i}: the first delta of tool call {idx} has no function.name")
                if tc.type != "function":
                    problem(f"chunk {i}: the first delta of tool call {idx} should have type 'function', got {tc.type!r}")
            else:
                # The SDK's accumulator concatenates repeated strings, so id/name must not repeat.
                if tc.id:
                    problem(f"chunk {i}: tool call {idx} repeats its id in a later delta")
                if fn is not None and fn.name:
                    problem(f"chunk {i}: tool call {idx} repeats function.name in a later delta")
            if fn is not None and fn.arguments:
                acc[idx]["arguments"] += fn.arguments
                acc[idx]["pieces"] += 1

    out["tool_calls"] = [acc[k] for k in sorted(acc)]
    out["finish_reasons"] = finish_reasons
    out["content"] = content
    r.check(name, sorted(acc) == list(range(len(acc))), f"tool call indexes should be 0..n-1, got {sorted(acc)}")
    first_delta = choice_chunks[0][1].choices[0].delta if choice_chunks else None
    r.check(name, getattr(first_delta, "role", None) == "assistant", f"the first choice chunk's delta.role should be 'assistant', got {getattr(first_delta, 'role', None)!r}")
    r.check(name, bool(acc), "no delta.tool_calls in the stream")
    stream_calls = [(acc[k]["name"], acc[k]["arguments"]) for k in sorted(acc)]
    r.check(name, stream_calls == ref_calls, f"streamed calls {stream_calls} differ from the non-streamed ones {ref_calls} (same seed, temperature 0)")
    for k in sorted(acc):
        value, err = parse_json(acc[k]["arguments"])
        if r.check(name, err is None and isinstance(value, dict), f"tool call {k}: concatenated arguments are {err or 'not an object'}"):
            errors = schema_errors(WEATHER_SCHEMA, value)
            r.check(name, not errors, f"tool call {k}: arguments break get_weather's schema: {errors}")
    if r.check(name, bool(choice_chunks), "no chunk with choices"):
        last_i, last = choice_chunks[-1]
        r.check(name, last.choices[0].finish_reason == "tool_calls", f"the last choice chunk's finish_reason should be 'tool_calls', got {last.choices[0].finish_reason!r}")
        r.check(name, [i for i, _ in finish_reasons] == [last_i], f"finish_reason should be set on the last choice chunk only, got {finish_reasons}")

    # The usage chunk: after every choice chunk, choices empty, usage present.
    out["usage_chunks"] = [{"chunk": i, "usage": c.usage.to_dict() if c.usage is not None else None} for i, c in usage_chunks]
    if r.check(name, len(usage_chunks) == 1, f"expected exactly one final chunk with empty choices (the usage chunk), got {len(usage_chunks)}"):
        ui, uc = usage_chunks[0]
        r.check(name, ui == len(chunks) - 1, f"the usage chunk should be the last chunk, it is chunk {ui} of {len(chunks)}")
        u = uc.usage
        if r.check(name, u is not None, "the final chunk with empty choices has no usage"):
            p, c, t = u.prompt_tokens, u.completion_tokens, u.total_tokens
            r.check(name, all(isinstance(x, int) for x in (p, c, t)) and p + c == t, f"usage should hold integer tokens with total = sum, got {u.to_dict()}")
            if reference.usage is not None:
                r.check(name, p == reference.usage.prompt_tokens, f"streamed prompt_tokens {p} != non-streamed {reference.usage.prompt_tokens}")
                r.check(name, c == reference.usage.completion_tokens, f"streamed completion_tokens {c} != non-streamed {reference.usage.completion_tokens}")

    # The SDK's own accumulation must agree.
    if r.check(name, state_error is None, f"the SDK's ChatCompletionStreamState rejected the stream: {state_error}"):
        try:
            final = state.get_final_completion()
            sdk_calls = calls_of(final.choices[0].message) if final.choices else []
            out["sdk_accumulated"] = sdk_calls
            r.check(name, sdk_calls == stream_calls, f"the SDK's accumulator built {sdk_calls}, not {stream_calls}")
            if final.choices:
                r.check(name, final.choices[0].finish_reason == "tool_calls", f"the SDK's accumulated finish_reason is {final.choices[0].finish_reason!r}")
        except Exception as exc:
            r.fail(name, f"the SDK's ChatCompletionStreamState could not build the final completion: {describe_exc(exc)}")

    for p in problems[:FAILURE_SAMPLES]:
        r.fail(name, p)
    if len(problems) > FAILURE_SAMPLES:
        r.fail(name, f"... and {len(problems) - FAILURE_SAMPLES} more chunk problems")


async def check_structured_output(ctx: Ctx, out: dict[str, Any]) -> None:
    r, name = ctx.report, "structured_output"
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}}
    resp = await ctx.create(messages=[{"role": "user", "content": "Describe a person as JSON."}], response_format=rf, temperature=0, max_tokens=128)
    check_envelope(r, name, resp)
    if resp.choices:
        choice = resp.choices[0]
        out["json_schema"] = {"finish_reason": choice.finish_reason, "content": choice.message.content}
        r.check(name, choice.finish_reason == "stop", f"json_schema: finish_reason should be 'stop', got {choice.finish_reason!r}")
        r.check(name, not choice.message.tool_calls, "json_schema: unexpected tool_calls")
        value, err = parse_json(choice.message.content)
        if r.check(name, err is None, f"json_schema: content is {err}"):
            errors = schema_errors(PERSON_SCHEMA, value)
            r.check(name, not errors, f"json_schema: content {choice.message.content[:200]!r} breaks the schema: {errors}")

    resp = await ctx.create(messages=[{"role": "user", "content": "Reply with a JSON object."}], response_format={"type": "json_object"}, temperature=0, max_tokens=128)
    check_envelope(r, name, resp)
    if resp.choices:
        choice = resp.choices[0]
        out["json_object"] = {"finish_reason": choice.finish_reason, "content": choice.message.content}
        r.check(name, choice.finish_reason == "stop", f"json_object: finish_reason should be 'stop', got {choice.finish_reason!r}")
        value, err = parse_json(choice.message.content)
        if r.check(name, err is None, f"json_object: content is {err}"):
            r.check(name, isinstance(value, dict), f"json_object: content is JSON but not an object: {choice.message.content[:200]!r}")


async def check_n_and_logprobs(ctx: Ctx, out: dict[str, Any]) -> None:
    r, name = ctx.report, "n_and_logprobs"
    resp = await ctx.create(messages=[{"role": "user", "content": "Count to three."}], n=2, temperature=0, max_tokens=8, logprobs=True)
    check_envelope(r, name, resp, n=2)
    out["choices"] = []
    for ch in resp.choices:
        lp = ch.logprobs.content if ch.logprobs is not None else None
        out["choices"].append({"index": ch.index, "finish_reason": ch.finish_reason, "content": ch.message.content, "logprob_tokens": len(lp or [])})
        r.check(name, isinstance(ch.message.content, str), f"choice {ch.index}: content should be a string")
        if not r.check(name, isinstance(lp, list) and len(lp) >= 1, f"choice {ch.index}: logprobs=True but logprobs.content is {lp!r}"):
            continue
        for j, tok in enumerate(lp):
            good = isinstance(tok.token, str) and isinstance(tok.logprob, (int, float)) and tok.logprob <= 1e-6
            tops = tok.top_logprobs or []
            good = good and isinstance(tok.top_logprobs, list) and len(tops) <= 2 and all(isinstance(t.logprob, (int, float)) and t.logprob <= 1e-6 for t in tops)
            if not r.check(name, good, f"choice {ch.index}: logprobs.content[{j}] malformed: {tok.to_dict()}"):
                break
        r.check(name, len(lp) <= 8, f"choice {ch.index}: {len(lp)} logprob entries for max_tokens 8")
        if ch.finish_reason == "length":
            r.check(name, len(lp) == 8, f"choice {ch.index}: finish_reason 'length' at max_tokens 8 but {len(lp)} logprob entries")
    if len(resp.choices) == 2:
        a, b = resp.choices
        r.check(name, a.message.content == b.message.content, f"temperature 0: the two choices should be identical, got {a.message.content!r} and {b.message.content!r}")


BAD_REQUESTS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    # (case, request, needles: the error message must contain one of them)
    ("tool_choice_unknown_tool", dict(messages=WEATHER_QUESTION, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "no_such_tool"}}), ("no_such_tool",)),
    ("duplicate_tool_names", dict(messages=WEATHER_QUESTION, tools=[TOOLS[0], TOOLS[0]]), ("get_weather",)),
    ("unknown_field", dict(messages=WEATHER_QUESTION, extra_body={"frobnicate": 1}), ("frobnicate",)),
    ("top_p_zero", dict(messages=WEATHER_QUESTION, top_p=0), ("top_p",)),
    ("max_tokens_zero", dict(messages=WEATHER_QUESTION, max_tokens=0), ("max_tokens",)),
    ("stop_empty", dict(messages=WEATHER_QUESTION, stop=""), ("stop",)),
    # Only the sampled token's log-prob is known: alternatives are refused, not made up.
    ("top_logprobs_refused", dict(messages=WEATHER_QUESTION, logprobs=True, top_logprobs=2), ("top_logprobs",)),
    (
        "tool_message_unknown_call_id",
        dict(messages=WEATHER_QUESTION + [{"role": "tool", "tool_call_id": "call_nope_42", "content": "{}"}], tools=TOOLS),
        ("call_nope_42",),
    ),
    ("stream_tool_choice_unknown_tool", dict(messages=WEATHER_QUESTION, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "no_such_tool"}}, stream=True), ("no_such_tool",)),
]


async def check_bad_requests(ctx: Ctx, out: dict[str, Any]) -> None:
    r, name = ctx.report, "bad_requests_are_400"
    for case, request, needles in BAD_REQUESTS:
        rec: dict[str, Any] = {}
        out[case] = rec
        try:
            req = dict(request)
            req.setdefault("max_tokens", 8)
            resp = await ctx.create(**req)
            if request.get("stream"):
                async for _ in resp:  # an error only inside the stream is still a failure
                    pass
            rec["outcome"] = "accepted"
            r.fail(name, f"{case}: the request was accepted; expected HTTP 400")
        except openai.BadRequestError as exc:
            msg = error_message(exc)
            rec.update(outcome="400", message=msg, error=exc.body if isinstance(exc.body, dict) else None)
            r.check(name, exc.status_code == 400, f"{case}: status {exc.status_code}")
            r.check(name, isinstance(exc.body, dict) and isinstance(exc.body.get("message"), str) and exc.body["message"].strip() != "", f"{case}: the body should be {{\"error\": {{\"message\": ...}}}}, got {exc.body!r}")
            r.check(name, any(n.lower() in msg.lower() for n in needles), f"{case}: the error message should name {' or '.join(needles)}: {msg!r}")
        except openai.APIStatusError as exc:
            rec.update(outcome=str(exc.status_code), message=error_message(exc))
            r.fail(name, f"{case}: expected HTTP 400, got {describe_exc(exc)}")
        except openai.APIError as exc:  # e.g. an error event inside an SSE stream
            rec.update(outcome="error", message=describe_exc(exc))
            r.fail(name, f"{case}: expected HTTP 400, got {describe_exc(exc)}")


async def run_agent(ctx: Ctx, out: dict[str, Any], name: str, mode: str) -> None:
    """One agents-SDK run. mode: "run" (Runner.run), "streamed" (Runner.run_streamed) or
    "multi_turn" (the tool's result goes back to the model once, in the SDK's own message shapes)."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        RunConfig,
        Runner,
        ToolsToFinalOutputResult,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    r = ctx.report
    calls: list[Any] = []

    @function_tool
    def lookup_capital(country: str) -> str:
        """Look up the capital city of a country.

        Args:
            country: The country to look up.
        """
        calls.append(country)
        return CAPITAL_ANSWER

    tool_batches: list[int] = []

    def after_tools(_context: Any, results: list[Any]) -> Any:
        # First batch of tool results: let the model answer. Should it call again, stop there.
        tool_batches.append(len(results))
        if len(tool_batches) == 1:
            return ToolsToFinalOutputResult(is_final_output=False)
        return ToolsToFinalOutputResult(is_final_output=True, final_output=MULTI_TURN_SECOND_CALL)

    agent_client = make_client(ctx.base_url, ctx.report)
    model = OpenAIChatCompletionsModel(model=ctx.model, openai_client=agent_client)
    agent = Agent(
        name="capital-finder",
        instructions="Use the lookup_capital tool to answer.",
        tools=[lookup_capital],
        model=model,
        # The SDK has no seed setting; extra_args are passed to chat.completions.create as they are.
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=200, extra_args={"seed": ctx.seed}),
        # reset_tool_choice (the default) drops tool_choice once a tool has run, so the
        # multi_turn run's second request goes out with tool_choice left to the server (auto).
        tool_use_behavior=after_tools if mode == "multi_turn" else "stop_on_first_tool",
    )
    run_config = RunConfig(tracing_disabled=True)
    question = "What is the capital of France?"
    try:
        if mode == "streamed":
            result = Runner.run_streamed(agent, question, max_turns=3, run_config=run_config)
            events: dict[str, int] = {}
            async for ev in result.stream_events():
                events[ev.type] = events.get(ev.type, 0) + 1
            out["stream_events"] = events
        else:
            result = await Runner.run(agent, question, max_turns=3, run_config=run_config)
    finally:
        out["tool_invocations"] = list(calls)
        await agent_client.close()
    out["final_output"] = result.final_output
    out["new_items"] = [type(i).__name__ for i in result.new_items]
    out["model_requests"] = len(result.raw_responses)
    out["tool_call_arguments"] = [
        getattr(i.raw_item, "arguments", None) for i in result.new_items if type(i).__name__ == "ToolCallItem"
    ]
    r.check(name, len(calls) >= 1, "the agents SDK never invoked lookup_capital")
    r.check(name, all(isinstance(c, str) for c in calls), f"lookup_capital got non-string arguments: {calls!r}")
    if mode == "multi_turn":
        out["tool_batches"] = tool_batches
        r.check(name, len(result.raw_responses) >= 2, f"expected a second model request after the tool ran, got {len(result.raw_responses)} request(s)")
        r.check(name, isinstance(result.final_output, str), f"final_output should be a string, got {result.final_output!r}")
        if tool_batches[1:]:
            out["note"] = "the second reply called a tool again (allowed: tool_choice was auto)"
    else:
        r.check(name, result.final_output == CAPITAL_ANSWER, f"final_output should be the tool's return value {CAPITAL_ANSWER!r}, got {result.final_output!r}")


async def check_agents_sdk(ctx: Ctx, out: dict[str, Any]) -> None:
    await run_agent(ctx, out, "agents_sdk", "run")


async def check_agents_sdk_streamed(ctx: Ctx, out: dict[str, Any]) -> None:
    await run_agent(ctx, out, "agents_sdk_streamed", "streamed")


async def check_agents_sdk_multi_turn(ctx: Ctx, out: dict[str, Any]) -> None:
    await run_agent(ctx, out, "agents_sdk_multi_turn", "multi_turn")


BODIES: dict[str, Callable[[Ctx, dict[str, Any]], Awaitable[None]]] = {
    "models": check_models,
    "chat_with_tools": check_chat_with_tools,
    "forced_call": check_forced_call,
    "multi_turn": check_multi_turn,
    "streamed_call": check_streamed_call,
    "structured_output": check_structured_output,
    "n_and_logprobs": check_n_and_logprobs,
    "bad_requests_are_400": check_bad_requests,
    "agents_sdk": check_agents_sdk,
    "agents_sdk_streamed": check_agents_sdk_streamed,
    "agents_sdk_multi_turn": check_agents_sdk_multi_turn,
}

# --------------------------------------------------------------------------- plumbing


def make_client(base_url: str, report: Report) -> AsyncOpenAI:
    """An SDK client whose HTTP exchanges are recorded under the current check."""
    import httpx2  # the HTTP library the openai 3.x SDK is built on

    def current() -> dict[str, Any] | None:
        name = report.data["current_check"]
        return report.checks.get(name) if name else None

    async def on_request(request: Any) -> None:
        out = current()
        if out is None:
            return
        entry: dict[str, Any] = {"request": f"{request.method} {request.url.path}"}
        try:
            body = json.loads(request.content) if request.content else None
            if isinstance(body, dict):
                entry["body_keys"] = sorted(body)
                if isinstance(body.get("messages"), list):
                    entry["messages"] = [
                        f"{m.get('role')}({','.join(sorted(k for k in m if k != 'role'))})" if isinstance(m, dict) else repr(m)
                        for m in body["messages"]
                    ]
        except Exception:
            pass
        out.setdefault("http", []).append(entry)

    async def on_response(response: Any) -> None:
        out = current()
        if out is None or not out.get("http"):
            return
        ctype = response.headers.get("content-type", "").split(";")[0]
        out["http"][-1]["response"] = f"{response.status_code} {ctype}".rstrip()

    http_client = openai.DefaultAsyncHttpxClient(
        timeout=httpx2.Timeout(REQUEST_TIMEOUT_S, connect=10.0),
        event_hooks={"request": [on_request], "response": [on_response]},
    )
    return AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http_client, timeout=REQUEST_TIMEOUT_S)


def guard_network(report: Report) -> None:
    """Refuse name resolution of any host but the base URL's (so nothing reaches api.openai.com)."""
    allowed = (report.data["network"]["allowed_host"] or "").lower()
    real_getaddrinfo = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        h = host.decode() if isinstance(host, bytes) else host
        if h is not None and str(h).lower().strip("[]") != allowed:
            report.data["network"]["refused_hosts"].append(str(h))
            cur = report.data["current_check"] or "setup"
            report.fail(cur, f"something tried to reach {h!r}; only {allowed!r} may be contacted")
            raise socket.gaierror(socket.EAI_NONAME, f"client.py refuses to resolve {h!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.getaddrinfo = guarded  # type: ignore[assignment]


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    report = Report(args.base_url, args.model, args.seed)
    guard_network(report)
    client = make_client(args.base_url, report)
    ctx = Ctx(client, args, report)

    async def body() -> None:
        for name in CHECKS:
            if args.only and name not in args.only:
                report.checks[name] = {"skipped": "not in --only"}
                report.data["skipped"].append(name)
                continue
            report.data["current_check"] = name
            report.checks[name] = out = {}
            t0 = time.monotonic()
            print(f"client.py: {name} ...", file=sys.stderr)
            try:
                await BODIES[name](ctx, out)
            except Exception as exc:  # one broken check must not hide the others
                msg = describe_exc(exc)
                report.fail(name, f"raised {msg}")
                out["exception"] = msg
                print(f"client.py: check {name} raised:", file=sys.stderr)
                traceback.print_exc(file=sys.stderr)
            out["seconds"] = round(time.monotonic() - t0, 3)
        report.data["current_check"] = None

    try:
        await asyncio.wait_for(body(), args.timeout)
    except asyncio.TimeoutError:
        cur = report.data["current_check"] or "setup"
        report.fail(cur, f"global timeout: the scenario did not finish within {args.timeout:.0f}s")
        for name in CHECKS:
            if name not in report.checks:
                report.checks[name] = {"skipped": "global timeout"}
                report.data["skipped"].append(name)
    finally:
        try:
            await client.close()
        except Exception:
            pass
    return report.finish()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="client.py", description="OpenAI function-calling end-to-end driver (openai + openai-agents SDKs).")
    p.add_argument("--base-url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8080/v1")
    p.add_argument("--model", required=True, help="model name served (toolsmith serve --model-name)")
    p.add_argument("--timeout", type=float, default=300.0, help="global deadline in seconds (default 300)")
    p.add_argument("--seed", type=int, default=1234, help="seed sent with every request (default 1234)")
    p.add_argument("--only", default="", help=f"comma-separated subset of: {','.join(CHECKS)}")
    args = p.parse_args(argv)
    parts = urlsplit(args.base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        p.error(f"--base-url must be an http(s) URL, got {args.base_url!r}")
    args.base_url = args.base_url.rstrip("/")
    if args.timeout <= 0:
        p.error("--timeout must be positive")
    args.only = [c for c in args.only.split(",") if c]
    unknown = [c for c in args.only if c not in CHECKS]
    if unknown:
        p.error(f"unknown check(s) in --only: {unknown}; known: {', '.join(CHECKS)}")
    return args


def main() -> int:
    args = parse_args(sys.argv[1:])
    report = asyncio.run(amain(args))
    sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
    sys.stdout.flush()
    print(f"openai-client: {len(report['passed'])} passed, {len(report['failed'])} failed", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
