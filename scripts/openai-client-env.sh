#!/usr/bin/env bash
# The venv of the OpenAI-compatible end-to-end test client (tests/openai/client.py): the official
# `openai` SDK, the `openai-agents` SDK and `jsonschema`, pinned. The last line on stdout is its
# python interpreter (see python-venv.sh).
#
#   PY=$(scripts/openai-client-env.sh | tail -n 1)
#   $PY tests/openai/client.py --base-url http://127.0.0.1:PORT/v1 --model NAME
exec "$(dirname "$0")/python-venv.sh" openai-clients-3.57.0-agents-0.24.0 \
    openai==3.57.0 openai-agents==0.24.0 jsonschema==4.26.0
