#!/usr/bin/env bash
# The venv of the policy's reference implementation (PyTorch eager + Hugging Face transformers, and
# PEFT for the LoRA reference), used by the equivalence tests and the benchmarks. About 3 GB of
# wheels (PyTorch pulls its CUDA libraries even for CPU use), installed once into
# ~/.cache/toolsmith/venvs. The last line on stdout is its python interpreter (see python-venv.sh).
exec "$(dirname "$0")/python-venv.sh" torch-2.11.0-peft-0.21.2 \
    torch==2.11.0 transformers==5.23.0 safetensors==0.8.0 peft==0.21.2
