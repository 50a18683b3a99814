#!/usr/bin/env bash
# The venv of the MCP end-to-end test client (tests/mcp/client.py): the official `mcp` SDK, pinned.
# The last line on stdout is its python interpreter (see python-venv.sh).
exec "$(dirname "$0")/python-venv.sh" mcp-2.3.0 mcp==2.3.0
