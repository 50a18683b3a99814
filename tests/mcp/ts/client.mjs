#!/usr/bin/env node
// End-to-end MCP client driver for `toolsmith serve --http`, on the official TypeScript SDK
// (`@modelcontextprotocol/sdk`, pinned in package.json beside this file).
//
// The SDK is not installed in the clone: `scripts/mcp-ts-client-env.sh` installs it (with
// `npm ci` from package-lock.json) into a cache directory, copies this file next to its
// node_modules and prints that copy's path as its last stdout line. ES modules resolve bare
// imports relative to the importing file (NODE_PATH does not apply), so run that copy:
//
//     CLIENT=$(scripts/mcp-ts-client-env.sh | tail -n 1)
//     node "$CLIENT" http://127.0.0.1:PORT/mcp [--token TOKEN] [--timeout SECS] [--request-timeout SECS]
//
// The token may also come from TOOLSMITH_MCP_TOKEN. `--timeout` is a deadline for the whole
// scenario (default 180 s), `--request-timeout` the SDK's per-request timeout (default 60 s), so
// nothing hangs.
//
// The scenario mirrors tests/mcp/client.py (the Python SDK's driver) and adds what this SDK is
// strict about: it validates every `structuredContent` against the listed `outputSchema` (an
// error result must therefore carry its structured error in `_meta`, not in structuredContent),
// and it surfaces JSON-RPC errors as `McpError` with `code` and `data`. Steps: connect, a bogus
// cursor, tools/list through every page, calculator, search_tools, one tool error of each kind
// (invalid_args, tool_error, python_error, timeout) read back as data, an unknown tool (a
// protocol error), and create_and_execute_mcp with its list_changed notification.
//
// Exactly one JSON report goes to stdout: {"ok", "failures", "steps", "notifications", ...}.
// Exit status 0 when every check passed, 1 when any failed, 2 on a usage error; the report is
// printed in every case (a missing SDK, a refused connection, a deadline, a stray exception).
// SDK and diagnostic chatter goes to stderr.

import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

// stdout carries the report alone: anything the SDK or a dependency logs goes to stderr.
console.log = console.info = console.debug = console.error;

const REQUIRED_TOOLS = ['calculator', 'search_tools', 'create_and_execute_mcp'];
const LIST_CHANGED = 'notifications/tools/list_changed';
const LIST_CHANGED_WAIT_MS = 10_000;
const MAX_PAGES = 100;
const INVALID_PARAMS = -32602; // JSON-RPC; also the SDK's ErrorCode.InvalidParams
const CONNECTION_CLOSED = -32000; // the SDK's ErrorCode.ConnectionClosed

// The tools the scenario creates. Each runs once at creation on `inputs`, so the ones meant to
// fail only fail on other arguments: a tool that fails its first run is never created.
const SUM_INTEGERS = {
  name: 'sum_integers',
  description: 'Adds up a list of integers exactly and returns their total',
  arguments: 'numbers (list of int)',
  returns: 'the sum (int)',
  code: 'def sum_integers(numbers: list[int]) -> int:\n    return sum(numbers)\n',
  inputs: { numbers: [1, 2, 3, 4] },
};
const DIVIDE_BY_ZERO = {
  name: 'divide_by_zero_tool',
  description: 'Divides a numerator by a denominator; a zero denominator raises ZeroDivisionError',
  arguments: 'numerator, denominator (float)',
  returns: 'the quotient (float)',
  code:
    'def divide_by_zero_tool(numerator: float, denominator: float) -> float:\n' +
    '    return numerator / denominator\n',
  inputs: { numerator: 1, denominator: 1 },
};
const RUNAWAY = {
  name: 'runaway_loop',
  description: 'Never returns when asked to spin: a deliberately runaway busy loop, for deadline checks',
  arguments: 'spin (bool)',
  returns: 'zero (int)',
  code: 'def runaway_loop(spin: bool) -> int:\n    while spin:\n        pass\n    return 0\n',
  inputs: { spin: false },
};

// --------------------------------------------------------------------------- report

const report = {
  ok: false,
  target: null,
  sdk: null,
  current_step: null,
  steps: {},
  notifications: [],
  transport_errors: [],
  http: { session_id: null, exchanges: [] },
  failures: [],
};

function fail(step, message) {
  report.failures.push(`[${step}] ${message}`);
}

function check(step, cond, message) {
  if (!cond) fail(step, message);
  return Boolean(cond);
}

let reported = false;

// Prints the one report and exits; later calls (a deadline racing the end) do nothing.
function finish(usageError = false) {
  if (reported) return;
  reported = true;
  report.ok = report.failures.length === 0;
  const code = usageError ? 2 : report.ok ? 0 : 1;
  // Exit only once stdout has drained: a pipe to the test harness may be slower than us, and
  // lingering SDK handles (the SSE stream's reconnect timer) must not keep the process alive.
  process.stdout.write(JSON.stringify(report, null, 2) + '\n', () => process.exit(code));
}

// No exception escapes as a crash: it becomes a failure of the step that was running.
process.on('uncaughtException', (e) => {
  console.error('client.mjs: uncaught exception:', e);
  fail(report.current_step ?? 'client', `uncaught exception: ${describe(e)}`);
  finish();
});
process.on('unhandledRejection', (e) => {
  console.error('client.mjs: unhandled rejection:', e);
  fail(report.current_step ?? 'client', `unhandled rejection: ${describe(e)}`);
  finish();
});

// The SDK's classes, loaded in main() so that a missing install is a report, not a crash.
let sdk = null;

function describe(e) {
  if (sdk && e instanceof sdk.McpError) {
    const data = e.data !== undefined ? `, data=${JSON.stringify(e.data).slice(0, 300)}` : '';
    return `protocol error ${e.code}: ${e.message}${data}`;
  }
  if (sdk && e instanceof sdk.StreamableHTTPError) return `HTTP error ${e.code}: ${e.message}`;
  if (e instanceof Error) {
    // fetch() hides the useful part (ECONNREFUSED, ...) in `cause`.
    const cause = e.cause ? ` (cause: ${e.cause.code ?? e.cause.message ?? String(e.cause)})` : '';
    return `${e.name}: ${e.message}${cause}`;
  }
  return String(e);
}

// The SDK reports an HTTP failure (a 401, say) only as a generic error: name the last bad exchange.
function httpHint() {
  const bad = report.http.exchanges.filter((x) => /^\S+ [45]\d\d/.test(x));
  return bad.length ? ` (HTTP: ${bad[bad.length - 1]})` : '';
}

// Errors after which every later step would only repeat the same failure.
function isFatal(e) {
  if (sdk && e instanceof sdk.McpError) return e.code === CONNECTION_CLOSED;
  if (sdk && e instanceof sdk.StreamableHTTPError) return [401, 403, 404].includes(e.code);
  return e instanceof TypeError && /fetch failed/i.test(e.message);
}

// --------------------------------------------------------------------------- helpers

function texts(result) {
  return (result?.content ?? []).filter((c) => c?.type === 'text').map((c) => c.text ?? '');
}

function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function isObject(x) {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

function sameJson(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function usage(message) {
  console.error(`client.mjs: ${message}`);
  console.error('usage: node client.mjs MCP_URL [--token TOKEN] [--timeout SECS] [--request-timeout SECS]');
  fail('usage', message);
  finish(true);
}

function parseArgs(argv) {
  const args = { url: null, token: process.env.TOOLSMITH_MCP_TOKEN ?? null, timeoutS: 180, requestTimeoutS: 60 };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`);
      return argv[++i];
    };
    const seconds = () => {
      const s = Number(value());
      if (!(s > 0)) throw new Error(`${arg} needs a positive number of seconds`);
      return s;
    };
    if (arg === '--token') args.token = value();
    else if (arg === '--timeout') args.timeoutS = seconds();
    else if (arg === '--request-timeout') args.requestTimeoutS = seconds();
    else if (arg.startsWith('--')) throw new Error(`unknown option ${arg}`);
    else if (args.url === null) args.url = arg;
    else throw new Error(`unexpected argument ${arg}`);
  }
  if (args.url === null) throw new Error('the MCP URL is missing');
  return args;
}

// The installed SDK's version, read from its package.json (its exports map does not expose it).
function sdkInfo() {
  const info = {
    name: '@modelcontextprotocol/sdk',
    version: null,
    latest_protocol_version: sdk.LATEST_PROTOCOL_VERSION,
  };
  try {
    let dir = dirname(fileURLToPath(import.meta.resolve('@modelcontextprotocol/sdk/client/index.js')));
    for (; dir !== dirname(dir); dir = dirname(dir)) {
      // dist/esm has a package.json of its own ({"type": "module"}) and dist/ has none.
      let pkg;
      try {
        pkg = parseJson(readFileSync(join(dir, 'package.json'), 'utf8'));
      } catch {
        continue;
      }
      if (pkg?.name === info.name) {
        info.version = pkg.version;
        break;
      }
    }
  } catch {
    // Only diagnostics: the version stays null.
  }
  return info;
}

async function loadSdk() {
  const [client, http, types, ajv] = await Promise.all([
    import('@modelcontextprotocol/sdk/client/index.js'),
    import('@modelcontextprotocol/sdk/client/streamableHttp.js'),
    import('@modelcontextprotocol/sdk/types.js'),
    import('@modelcontextprotocol/sdk/validation/ajv'),
  ]);
  return {
    Client: client.Client,
    StreamableHTTPClientTransport: http.StreamableHTTPClientTransport,
    StreamableHTTPError: http.StreamableHTTPError,
    McpError: types.McpError,
    ToolListChangedNotificationSchema: types.ToolListChangedNotificationSchema,
    LATEST_PROTOCOL_VERSION: types.LATEST_PROTOCOL_VERSION,
    AjvJsonSchemaValidator: ajv.AjvJsonSchemaValidator,
  };
}

// --------------------------------------------------------------------------- scenario

async function scenario(args) {
  const requestOptions = { timeout: args.requestTimeoutS * 1000 };

  // Every HTTP exchange as one line, and the session id, for the report: the SDK's own errors
  // rarely say which status the server answered.
  const loggingFetch = async (input, init) => {
    const method = init?.method ?? 'GET';
    try {
      const response = await fetch(input, init);
      const sid = response.headers.get('mcp-session-id');
      if (sid && report.http.session_id === null) report.http.session_id = sid;
      const ctype = (response.headers.get('content-type') ?? '').split(';')[0];
      report.http.exchanges.push(`${method} ${response.status} ${ctype}`.trimEnd());
      return response;
    } catch (e) {
      report.http.exchanges.push(`${method} failed: ${describe(e)}`);
      throw e;
    }
  };

  const headers = args.token ? { Authorization: `Bearer ${args.token}` } : {};
  const transport = new sdk.StreamableHTTPClientTransport(new URL(args.url), {
    requestInit: { headers },
    fetch: loggingFetch,
  });
  const client = new sdk.Client({ name: 'toolsmith-e2e-ts-client', version: '0.1.0' }, { capabilities: {} });

  // list_changed arrives on the session's SSE stream, possibly before the response of the call
  // that caused it, so waiters compare against a count taken before that call.
  let listChangedCount = 0;
  let listChangedWaiters = [];
  client.setNotificationHandler(sdk.ToolListChangedNotificationSchema, async (n) => {
    report.notifications.push(n.method);
    listChangedCount += 1;
    for (const wake of listChangedWaiters) wake();
    listChangedWaiters = [];
  });
  // Anything else the server says is recorded too (the Rust test asserts there is nothing else).
  client.fallbackNotificationHandler = async (n) => {
    report.notifications.push(n.method);
  };
  client.onerror = (e) => {
    report.transport_errors.push(describe(e));
  };

  const waitForListChanged = async (after) => {
    const deadline = Date.now() + LIST_CHANGED_WAIT_MS;
    while (listChangedCount <= after && Date.now() < deadline) {
      await Promise.race([new Promise((wake) => listChangedWaiters.push(wake)), sleep(deadline - Date.now())]);
    }
    return listChangedCount > after;
  };

  let aborted = null;
  const step = async (name, body) => {
    if (aborted) {
      report.steps[name] = { skipped: `after a fatal failure in ${aborted}` };
      return;
    }
    report.current_step = name;
    const out = (report.steps[name] = {});
    try {
      await body(out);
    } catch (e) {
      // One broken step must not hide the others.
      const message = describe(e) + httpHint();
      fail(name, `raised ${message}`);
      out.exception = message;
      console.error(`client.mjs: step ${name} raised:`, e);
      if (name === 'connect' || isFatal(e)) aborted = name;
    }
    report.current_step = null;
  };

  // Every tool, following nextCursor. Each listTools call also replaces the SDK's cache of output
  // validators with that page's tools, so with several pages only the last page is checked by the
  // SDK; `validators` (compiled here from the full listing) checks every result regardless.
  const validators = new Map();
  const schemaValidator = new sdk.AjvJsonSchemaValidator();
  const listAll = async (stepName) => {
    const tools = [];
    const seen = new Set();
    let cursor;
    let pages = 0;
    for (;;) {
      const page = await client.listTools(cursor === undefined ? undefined : { cursor }, requestOptions);
      pages += 1;
      tools.push(...(page.tools ?? []));
      cursor = page.nextCursor;
      if (cursor === undefined || cursor === null) break;
      if (seen.has(cursor)) {
        fail(stepName, `the server repeated cursor ${JSON.stringify(cursor)} (a pagination loop)`);
        break;
      }
      if (pages >= MAX_PAGES) {
        fail(stepName, `more than ${MAX_PAGES} pages; stopped following nextCursor`);
        break;
      }
      seen.add(cursor);
    }
    for (const tool of tools) {
      if (!isObject(tool.outputSchema)) continue;
      try {
        validators.set(tool.name, schemaValidator.getValidator(tool.outputSchema));
      } catch (e) {
        fail(stepName, `the outputSchema of ${tool.name} does not compile: ${describe(e)}`);
      }
    }
    return { tools, names: tools.map((t) => t.name), pages };
  };

  // Checks a successful result's structuredContent against the tool's listed outputSchema.
  const checkOutput = (stepName, tool, structured) => {
    const validate = validators.get(tool);
    if (!validate) return;
    const verdict = validate(structured);
    check(stepName, verdict.valid, `structuredContent does not match ${tool}'s outputSchema: ${verdict.errorMessage}`);
  };

  // Whether the SDK itself holds an output validator for `tool` (it then validated the result).
  // `getToolOutputValidator` is internal to the SDK; null when a version lacks it.
  const sdkValidates = (tool) =>
    typeof client.getToolOutputValidator === 'function' ? client.getToolOutputValidator(tool) !== undefined : null;

  const call = (name, args) => client.callTool({ name, arguments: args }, undefined, requestOptions);

  // A failed call read back as data. The server's error result is
  //   {isError: true, content: [{type: text, text: <message>}, {type: text, text: <{"error": {...}}>}],
  //    _meta: {"toolsmith/error": {kind, tool, message, ...}}}
  // with no structuredContent: the SDK validates any structuredContent against the tool's
  // outputSchema, so an error envelope there would make it throw instead of returning the result.
  const expectErrorResult = async (stepName, out, tool, args, kind) => {
    let result;
    try {
      result = await call(tool, args);
    } catch (e) {
      out.outcome = sdk && e instanceof sdk.McpError ? 'protocol_error' : 'threw';
      out.thrown = describe(e);
      fail(stepName, `the SDK threw instead of returning the error result: ${describe(e)}${httpHint()}`);
      if (isFatal(e)) throw e;
      return null;
    }
    out.outcome = 'result';
    out.isError = result.isError ?? false;
    const error = isObject(result._meta) ? result._meta['toolsmith/error'] : undefined;
    const blocks = texts(result);
    const envelope = blocks.map(parseJson).find((v) => isObject(v) && isObject(v.error));
    out.kind = isObject(error) ? (error.kind ?? null) : null;
    out.kindFromText = envelope ? (envelope.error.kind ?? null) : null;
    out.message = isObject(error) ? (error.message ?? null) : null;
    out.tool = isObject(error) ? (error.tool ?? null) : null;
    out.error = error ?? null;
    out.text = blocks;
    out.hasStructuredContent = result.structuredContent !== undefined;

    check(stepName, out.isError === true, `isError should be true, got ${JSON.stringify(result).slice(0, 400)}`);
    if (!check(stepName, isObject(error), `_meta["toolsmith/error"] is missing: ${JSON.stringify(result._meta)}`)) {
      return result;
    }
    const where = '_meta["toolsmith/error"]';
    check(stepName, out.kind === kind, `${where}.kind should be ${kind}, got ${JSON.stringify(out.kind)}`);
    check(stepName, envelope !== undefined, `no text block holds the {"error": {...}} JSON: ${JSON.stringify(blocks)}`);
    check(
      stepName,
      out.kindFromText === out.kind,
      `the kind in the JSON text (${out.kindFromText}) differs from _meta's (${out.kind})`,
    );
    if (envelope) {
      check(stepName, envelope.error.tool === error.tool, 'the JSON text and _meta name different tools');
      check(stepName, envelope.error.message === error.message, 'the JSON text and _meta carry different messages');
    }
    check(stepName, out.tool === tool, `${where}.tool should be ${tool}, got ${JSON.stringify(out.tool)}`);
    check(stepName, typeof out.message === 'string' && out.message.trim() !== '', 'the error message is empty');
    // The first block is for people (and models that read text): a sentence, not the JSON.
    check(
      stepName,
      blocks.length >= 2 && blocks[0].trim() !== '' && parseJson(blocks[0]) === undefined,
      `the first text block should be the human-readable message, got ${JSON.stringify(blocks)}`,
    );
    check(stepName, !out.hasStructuredContent, 'an error result must not carry structuredContent');
    return result;
  };

  // Creates a tool with create_and_execute_mcp, waits for list_changed, and lists it.
  const createTool = async (stepName, out, request) => {
    const before = listChangedCount;
    const result = await call('create_and_execute_mcp', request);
    out.isError = result.isError ?? false;
    out.structuredContent = result.structuredContent ?? null;
    out.admission = isObject(result._meta) ? (result._meta['toolsmith/admission'] ?? null) : null;
    const sc = result.structuredContent;
    check(stepName, !out.isError, `creating ${request.name} gave isError: ${JSON.stringify(texts(result))}`);
    const created = isObject(sc) && sc.creation_success === true;
    if (!check(stepName, created, `creation_success is not true: ${JSON.stringify(sc)}`)) {
      return null;
    }
    checkOutput(stepName, 'create_and_execute_mcp', sc);
    // A near-duplicate is merged into an existing tool as an alias and is never listed itself.
    if (isObject(out.admission)) {
      check(
        stepName,
        out.admission.status !== 'merged' && out.admission.status !== 'candidate',
        `${request.name} was not registered as its own tool: ${JSON.stringify(out.admission)}`,
      );
    }
    const started = Date.now();
    out.list_changed_observed = await waitForListChanged(before);
    out.list_changed_wait_s = (Date.now() - started) / 1000;
    check(
      stepName,
      out.list_changed_observed,
      `no ${LIST_CHANGED} within ${LIST_CHANGED_WAIT_MS / 1000} s of creating ${request.name}`,
    );
    const listed = await listAll(stepName);
    out.listed_after = listed.names.includes(request.name);
    check(stepName, out.listed_after, `${request.name} is not in tools/list after its creation: ${listed.names}`);
    return sc;
  };

  // A JSON-RPC error the step expects to be `-32602` (invalid params): recorded, and checked.
  const recordInvalidParams = (stepName, out, e) => {
    if (!(e instanceof sdk.McpError)) throw e;
    out.outcome = 'protocol_error';
    out.code = e.code;
    out.message = e.message;
    out.data = e.data ?? null;
    check(stepName, e.code === INVALID_PARAMS, `expected code ${INVALID_PARAMS}, got ${e.code}: ${e.message}`);
  };

  // a. connect: initialize + initialized -----------------------------------------------------
  await step('connect', async (out) => {
    await client.connect(transport, requestOptions);
    out.protocolVersion = transport.protocolVersion ?? null;
    out.sessionId = transport.sessionId ?? null;
    out.serverInfo = client.getServerVersion() ?? null;
    out.capabilities = client.getServerCapabilities() ?? null;
    check('connect', Boolean(out.serverInfo?.name), 'serverInfo.name is empty');
    check(
      'connect',
      out.capabilities?.tools?.listChanged === true,
      `capabilities.tools.listChanged must be true, got ${JSON.stringify(out.capabilities)}`,
    );
  });

  // b. a cursor the server never issued: invalid params. Before the real listing, so that a
  //    wrongly successful page cannot replace the SDK's cached output validators.
  await step('bogus_cursor', async (out) => {
    try {
      const page = await client.listTools({ cursor: 'not-a-cursor' }, requestOptions);
      out.outcome = 'result';
      out.tool_names = (page.tools ?? []).map((t) => t.name);
      fail('bogus_cursor', `tools/list with cursor "not-a-cursor" succeeded (${out.tool_names.length} tools)`);
    } catch (e) {
      recordInvalidParams('bogus_cursor', out, e);
    }
  });

  // c. tools/list through every page --------------------------------------------------------
  await step('list_tools', async (out) => {
    const { tools, names, pages } = await listAll('list_tools');
    out.pages = pages;
    out.tool_names = names;
    out.with_output_schema = tools.filter((t) => isObject(t.outputSchema)).map((t) => t.name);
    const dupes = [...new Set(names.filter((n, i) => names.indexOf(n) !== i))];
    check('list_tools', dupes.length === 0, `tools listed more than once: ${dupes}`);
    for (const want of REQUIRED_TOOLS) {
      check('list_tools', names.includes(want), `${want} is missing from tools/list (got ${names})`);
    }
    for (const t of tools) {
      check(
        'list_tools',
        isObject(t.inputSchema) && t.inputSchema.type === 'object',
        `${t.name} has no object inputSchema: ${JSON.stringify(t.inputSchema)}`,
      );
    }
  });

  // d. calculator: the SDK validates structuredContent against the listed outputSchema ------
  await step('calculator', async (out) => {
    out.sdk_validated = sdkValidates('calculator');
    const result = await call('calculator', { expression: '2*(3+4)' });
    out.isError = result.isError ?? false;
    out.structuredContent = result.structuredContent ?? null;
    out.text = texts(result);
    check('calculator', !out.isError, `isError is true: ${JSON.stringify(out.text)}`);
    check(
      'calculator',
      sameJson(out.structuredContent, { value: 14 }),
      `structuredContent should be {"value": 14}, got ${JSON.stringify(out.structuredContent)}`,
    );
    checkOutput('calculator', 'calculator', result.structuredContent);
  });

  // e. search_tools ---------------------------------------------------------------------------
  await step('search_tools', async (out) => {
    const result = await call('search_tools', { query: 'evaluate an arithmetic expression' });
    out.isError = result.isError ?? false;
    const hits = result.structuredContent?.tools;
    check('search_tools', !out.isError, `isError is true: ${JSON.stringify(texts(result))}`);
    const got = JSON.stringify(result.structuredContent);
    if (!check('search_tools', Array.isArray(hits), `structuredContent.tools is not an array: ${got}`)) {
      return;
    }
    out.names = hits.map((h) => (isObject(h) ? h.name : null));
    check('search_tools', out.names.includes('calculator'), `calculator is not among the hits ${out.names}`);
    checkOutput('search_tools', 'search_tools', result.structuredContent);
  });

  // f. errors of the bundled calculator, read back as data ------------------------------------
  await step('invalid_args', async (out) => {
    // `expr` is not the calculator's parameter (`expression` is), and 1 is not a string.
    await expectErrorResult('invalid_args', out, 'calculator', { expr: 1 }, 'invalid_args');
    for (const key of ['pointer', 'expected', 'got', 'hint']) {
      if (isObject(out.error) && key in out.error) out[key] = out.error[key];
    }
  });

  await step('tool_error', async (out) => {
    // The calculator refuses a result that is not finite with its own error (code not_finite).
    await expectErrorResult('tool_error', out, 'calculator', { expression: '1/0' }, 'tool_error');
    out.code = isObject(out.error) ? (out.error.code ?? null) : null;
  });

  // g. unknown tool: a protocol error (MCP 2025-11-25), with the structured error as data -----
  await step('unknown_tool', async (out) => {
    try {
      const result = await call('no_such_tool', {});
      out.outcome = result.isError ? 'is_error_result' : 'success_result';
      out.result = result;
      const got = JSON.stringify(result).slice(0, 400);
      fail('unknown_tool', `calling an unknown tool should be a protocol error, got ${got}`);
    } catch (e) {
      recordInvalidParams('unknown_tool', out, e);
      check(
        'unknown_tool',
        e.data?.error?.kind === 'not_found',
        `data.error.kind should be not_found, got data=${JSON.stringify(e.data)}`,
      );
    }
  });

  // h. create_and_execute_mcp, list_changed, and a call of the new tool ----------------------
  await step('create_and_execute_mcp', async (out) => {
    const created = await createTool('create_and_execute_mcp', out, SUM_INTEGERS);
    if (!created) return;
    check(
      'create_and_execute_mcp',
      created.execution_result === 10,
      `execution_result should be 10, got ${JSON.stringify(created.execution_result)}`,
    );
    if (!out.listed_after) return;
    const result = await call('sum_integers', { numbers: [5, 6, 7] });
    out.call = {
      isError: result.isError ?? false,
      structuredContent: result.structuredContent ?? null,
      text: texts(result),
    };
    out.call.sdk_validated = sdkValidates('sum_integers');
    const said = JSON.stringify(out.call.text);
    check('create_and_execute_mcp', !out.call.isError, `calling sum_integers gave isError: ${said}`);
    check(
      'create_and_execute_mcp',
      sameJson(result.structuredContent, { result: 18 }),
      `sum_integers([5, 6, 7]) should give {"result": 18}, got ${JSON.stringify(result.structuredContent)}`,
    );
    checkOutput('create_and_execute_mcp', 'sum_integers', result.structuredContent);
  });

  // i. agent-written Python that raises: python_error --------------------------------------
  await step('python_error', async (out) => {
    out.create = {};
    if (!(await createTool('python_error', out.create, DIVIDE_BY_ZERO))) return;
    const args = { numerator: 1, denominator: 0 };
    if (!(await expectErrorResult('python_error', out, DIVIDE_BY_ZERO.name, args, 'python_error'))) return;
    out.python_exception = isObject(out.error?.exception) ? out.error.exception : null;
    check(
      'python_error',
      typeof out.message === 'string' && out.message.includes('ZeroDivisionError'),
      `the message should name ZeroDivisionError, got ${JSON.stringify(out.message)}`,
    );
  });

  // j. a runaway loop, stopped by the server's --timeout-ms: timeout ------------------------
  await step('timeout', async (out) => {
    out.create = {};
    if (!(await createTool('timeout', out.create, RUNAWAY))) return;
    const started = Date.now();
    await expectErrorResult('timeout', out, RUNAWAY.name, { spin: true }, 'timeout');
    out.elapsed_s = (Date.now() - started) / 1000;
  });

  // k. end the session (DELETE), then close the transport ---------------------------------
  await step('close', async (out) => {
    try {
      await transport.terminateSession();
      out.terminated = true;
    } catch (e) {
      // A server may refuse DELETE (405); that is allowed and only recorded.
      out.terminated = false;
      out.terminate_error = describe(e);
    }
    await client.close();
  });
}

// --------------------------------------------------------------------------- main

async function main() {
  let args;
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (e) {
    usage(e.message);
    return;
  }
  report.target = args.url;
  report.token_sent = Boolean(args.token);
  try {
    sdk = await loadSdk();
  } catch (e) {
    const how = 'run the copy that scripts/mcp-ts-client-env.sh prints';
    fail('setup', `cannot load @modelcontextprotocol/sdk (${how}): ${describe(e)}`);
    finish();
    return;
  }
  report.sdk = sdkInfo();

  const deadline = setTimeout(() => {
    fail(report.current_step ?? 'connect', `global timeout: the scenario did not finish within ${args.timeoutS} s`);
    finish();
  }, args.timeoutS * 1000);
  try {
    await scenario(args);
  } catch (e) {
    console.error('client.mjs: the scenario failed:', e);
    fail(report.current_step ?? 'client', `the scenario failed: ${describe(e)}`);
  }
  clearTimeout(deadline);
  finish();
}

main();
