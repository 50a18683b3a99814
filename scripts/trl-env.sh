#!/usr/bin/env bash
# The venv of the TRL GRPO example (examples/trl/grpo_toolsmith.py) and the Atropos batch check
# (tests/atropos/grpo_step.py): PyTorch, transformers, TRL (its GRPOTrainer with rollout_func) and
# openenv-core (the environment client), pinned, with accelerate and datasets pinned too so the
# resolution does not drift. About 3 GB of wheels (PyTorch pulls its CUDA libraries even for CPU
# use), installed once into ~/.cache/toolsmith/venvs. The last line on stdout is its python
# interpreter (see python-venv.sh).
#
#   PY=$(scripts/trl-env.sh | tail -n 1)
#   $PY examples/trl/grpo_toolsmith.py --env-url http://127.0.0.1:PORT --make-tiny "$(mktemp -d)"
exec "$(dirname "$0")/python-venv.sh" trl-1.16.0-torch-2.11.0-openenv-0.3.0 \
    torch==2.11.0 transformers==5.23.0 trl==1.16.0 openenv-core==0.3.0 \
    accelerate==1.16.0 datasets==5.2.0
