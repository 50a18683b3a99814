#!/usr/bin/env bash
# The venv of the OpenEnv and Atropos end-to-end test clients (tests/openenv/client.py): the
# `openenv-core` package (its GenericEnvClient, MCPToolClient and `openenv validate` CLI) and
# `atroposlib` (the Atropos trajectory API), pinned. The two resolve together without moving each
# other's dependencies. No torch is pulled. The last line on stdout is its python interpreter
# (see python-venv.sh); the `openenv` console script sits beside it.
#
#   PY=$(scripts/openenv-clients-env.sh | tail -n 1)
#   $PY tests/openenv/client.py --base-url http://127.0.0.1:PORT
exec "$(dirname "$0")/python-venv.sh" openenv-0.3.0-atroposlib-0.4.0 \
    openenv-core==0.3.0 atroposlib==0.4.0
