#!/usr/bin/env bash
# Install (idempotently) the official TypeScript MCP SDK for the end-to-end test client
# tests/mcp/ts/client.mjs, pinned by tests/mcp/ts/package.json and package-lock.json, cached
# outside the clone (the clone never gets a node_modules).
#
# Usage: scripts/mcp-ts-client-env.sh
#   The install lives at ${TOOLSMITH_CACHE:-~/.cache/toolsmith}/node/mcp-ts-VERSION. The LAST line
#   on stdout is the absolute path of the client to run with `node`: a copy of
#   tests/mcp/ts/client.mjs beside the install's node_modules, refreshed on every run. (ES modules
#   resolve bare imports relative to the importing file and ignore NODE_PATH, so the client must
#   live there.) npm output and diagnostics go to stderr. Needs node and npm (Node.js >= 18).
#
#     CLIENT=$(scripts/mcp-ts-client-env.sh | tail -n 1)
#     node "$CLIENT" http://127.0.0.1:PORT/mcp --token TOKEN
#
# When the install matches the committed package files (a stamp holds their hash) this is one
# quick check and, if client.mjs changed, a copy. A fresh install is built with `npm ci` in a
# temporary directory beside the target and renamed into place once verified, so an interrupted
# install never leaves a half-built tree at the target path.
set -euo pipefail

src="$(cd -- "$(dirname -- "$0")/../tests/mcp/ts" && pwd -P)"
stamp_name=".toolsmith-node-env"

log() { printf 'mcp-ts-client-env: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

command -v node >/dev/null 2>&1 ||
    die "node not found: install Node.js >= 18 with npm (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null 2>&1 || die "npm not found: install it beside node (Debian: apt-get install npm)"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' ||
    die "Node.js $(node --version) is too old; the SDK needs >= 18"

# The pin (package.json's exact SDK version, which the lock must agree with) and a hash of both
# package files: a changed lock reinstalls even when the SDK version stayed the same.
read -r version hash < <(node - "$src/package.json" "$src/package-lock.json" <<'JS'
const fs = require('fs');
const crypto = require('crypto');
const [pkgPath, lockPath] = process.argv.slice(2);
const name = '@modelcontextprotocol/sdk';
const fail = (m) => { console.error(`mcp-ts-client-env: error: ${m}`); process.exit(1); };
const pkgText = fs.readFileSync(pkgPath, 'utf8');
const lockText = fs.readFileSync(lockPath, 'utf8');
const pin = JSON.parse(pkgText).dependencies?.[name];
if (!/^\d+\.\d+\.\d+$/.test(pin ?? '')) fail(`${pkgPath} must pin ${name} to an exact version, not ${pin}`);
const locked = JSON.parse(lockText).packages?.[`node_modules/${name}`]?.version;
if (locked !== pin) fail(`${lockPath} locks ${name} ${locked}, package.json pins ${pin}: regenerate the lock`);
const hash = crypto.createHash('sha256').update(pkgText).update('\0').update(lockText).digest('hex');
console.log(pin, hash);
JS
) || die "cannot read the pin from $src/package.json"
[ -n "${hash:-}" ] || die "cannot read the pin from $src/package.json"

root="${TOOLSMITH_CACHE:-$HOME/.cache/toolsmith}/node"
mkdir -p -- "$root"
root="$(cd -- "$root" && pwd -P)"
dir="$root/mcp-ts-$version"

# True when $1 is a complete install of these package files holding the pinned SDK.
install_ok() {
    [ -f "$1/$stamp_name" ] && [ "$(cat -- "$1/$stamp_name")" = "$hash" ] &&
        [ -f "$1/node_modules/@modelcontextprotocol/sdk/package.json" ] &&
        node -e 'process.exit(require(process.argv[1]).version === process.argv[2] ? 0 : 1)' \
            "$1/node_modules/@modelcontextprotocol/sdk/package.json" "$version" 2>/dev/null
}

# Puts the current client beside the install (only when it differs, by an atomic rename so a
# concurrent run never sees half a file) and prints its path as the last stdout line.
publish_client() {
    if ! cmp -s -- "$src/client.mjs" "$dir/client.mjs"; then
        cp -- "$src/client.mjs" "$dir/.client.mjs.$$"
        mv -f -- "$dir/.client.mjs.$$" "$dir/client.mjs"
    fi
    printf '%s\n' "$dir/client.mjs"
}

if install_ok "$dir"; then
    publish_client
    exit 0
fi

# Serialise concurrent installers where flock(1) exists; the rename below is race-safe on its own,
# this only avoids duplicate downloads.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$dir.lock"
    flock 9
    if install_ok "$dir"; then
        publish_client
        exit 0
    fi
fi

tmp="$(mktemp -d "$root/.mcp-ts-$version.XXXXXX")"
chmod u=rwx,go=rx "$tmp"
cleanup() { rm -rf -- "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

log "installing @modelcontextprotocol/sdk $version (npm ci) at $dir"
cp -- "$src/package.json" "$src/package-lock.json" "$tmp/"
# --ignore-scripts: none of the SDK's dependencies needs an install script, and none should run.
(cd -- "$tmp" && npm ci --no-audit --no-fund --ignore-scripts --prefer-offline --loglevel=error \
    --update-notifier=false) >&2 ||
    die "npm ci failed: installing the SDK needs the npm registry (or a warm npm cache)"

# The install counts only once the SDK really imports, at the pinned version, with every export the
# client uses. (For --eval input, bare imports resolve from the working directory.)
(cd -- "$tmp" && node --input-type=module - "$version" <<'JS') >&2 || die "the installed SDK does not load"
import { readFileSync } from 'node:fs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpError, ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/sdk/validation/ajv';
const want = process.argv[2];
const got = JSON.parse(readFileSync('node_modules/@modelcontextprotocol/sdk/package.json', 'utf8')).version;
if (got !== want) throw new Error(`installed @modelcontextprotocol/sdk ${got}, expected ${want}`);
const used = {
  Client, StreamableHTTPClientTransport, McpError, ToolListChangedNotificationSchema, AjvJsonSchemaValidator,
};
for (const [name, value] of Object.entries(used)) {
  if (value === undefined) throw new Error(`the SDK exports no ${name}`);
}
JS
node --check "$src/client.mjs" || die "$src/client.mjs does not parse"
printf '%s\n' "$hash" >"$tmp/$stamp_name"

# Move an invalid leftover out of the way, then rename the new install in.
if [ -e "$dir" ] || [ -L "$dir" ]; then
    old="$(mktemp -d "$root/.mcp-ts-old.XXXXXX")"
    mv -- "$dir" "$old/" 2>/dev/null || true
    rm -rf -- "$old"
fi
if ! node -e 'require("fs").renameSync(process.argv[1], process.argv[2])' "$tmp" "$dir" 2>/dev/null; then
    # Lost a race with a concurrent installer: use its install if it is complete.
    install_ok "$dir" || die "could not move the new install into place at $dir"
fi

install_ok "$dir" || die "the install at $dir failed verification"
publish_client
