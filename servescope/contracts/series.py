"""The engine-neutral metric names and labels: exporter -> Prometheus rules -> dashboards -> report.

Every engine series carries `engine` (vllm, llamacpp, ollama), `instance` (the configured name)
and, where the engine reports one, `model`. Units are base units; ratios are 0..1.
"""

PREFIX = "servescope"

ENGINE_LABELS = ("engine", "instance")
MODEL_LABELS = ("engine", "instance", "model")
# Where a number came from, when not from the engine's own page: "process" / "container" (resource budget),
# "proxy" (Ollama's running / waiting, as the exporter's proxy observed the requests it relayed).
SOURCE = "source"
PROXY_SOURCE = "proxy"

# --- one set of gauges for every engine (exporter) ---
ENGINE_UP = f"{PREFIX}_engine_up"  # 1 when the last scrape of the engine succeeded
SCRAPE_DURATION = f"{PREFIX}_scrape_duration_seconds"  # per instance, this scrape
# Ollama reports neither: the exporter's proxy exports what it observed of the requests it relayed, labelled
# SOURCE="proxy" (running: their answer has begun; waiting: no byte of it yet), and nothing when it relayed none.
REQUESTS_RUNNING = f"{PREFIX}_requests_running"  # sequences in the running batch
REQUESTS_WAITING = f"{PREFIX}_requests_waiting"  # queued, not yet scheduled
KV_CACHE_USAGE = f"{PREFIX}_kv_cache_usage_ratio"  # 0..1 of the paged KV pool in use
GENERATED_TOKENS = f"{PREFIX}_generated_tokens_total"  # counter (exposed with _total)
PROMPT_TOKENS = f"{PREFIX}_prompt_tokens_total"  # counter: every prompt token, computed or taken from a cache
# Prompt tokens the engine took from its prefix / prompt cache instead of computing them (counter). Prefix-cache
# reuse, one series for every engine that reports it: rate(PROMPT_CACHED_TOKENS) / rate(PROMPT_TOKENS).
PROMPT_CACHED_TOKENS = f"{PREFIX}_prompt_tokens_cached_total"
# Requests the engine took out of the running batch to free KV blocks for others (counter; vLLM's own count): the
# KV pool, not the batch cap, was the limit while it rose.
PREEMPTIONS = f"{PREFIX}_preemptions_total"
ENGINE_INFO = f"{PREFIX}_engine_info"  # version and kind as labels, value 1
ENGINE_INVALID_SAMPLES = f"{PREFIX}_engine_invalid_samples_total"  # counter: values dropped as impossible

# --- the reference page's section-3 KV arithmetic (vLLM cache_config_info; llama.cpp slots) ---
KV_BLOCK_SIZE = f"{PREFIX}_kv_cache_block_size_tokens"
KV_BLOCKS = f"{PREFIX}_kv_cache_blocks"
KV_CAPACITY_TOKENS = f"{PREFIX}_kv_cache_capacity_tokens"
KV_MAX_CONCURRENCY = f"{PREFIX}_kv_cache_max_concurrency"  # at the served max-model-len

# --- Ollama bridge (on scrape: /api/ps, /api/tags) ---
OLLAMA_MODEL_SIZE = f"{PREFIX}_ollama_model_size_bytes"
OLLAMA_MODEL_VRAM = f"{PREFIX}_ollama_model_vram_bytes"
OLLAMA_MODEL_CONTEXT = f"{PREFIX}_ollama_model_context_length_tokens"
OLLAMA_MODEL_EXPIRES = f"{PREFIX}_ollama_model_expires_in_seconds"
OLLAMA_MODEL_INFO = f"{PREFIX}_ollama_installed_model_info"

# --- Ollama proxy (what passes through it) ---
PROXY_IN_FLIGHT = f"{PREFIX}_proxy_requests_in_flight"
PROXY_NUM_PARALLEL = f"{PREFIX}_proxy_num_parallel"  # OLLAMA_NUM_PARALLEL as configured (Ollama reports none)
PROXY_REQUESTS = f"{PREFIX}_proxy_requests_total"  # by outcome
PROXY_GEN_TOKENS_PER_SECOND = f"{PREFIX}_proxy_generation_tokens_per_second"  # histogram
PROXY_PROMPT_EVAL_SECONDS = f"{PREFIX}_proxy_prompt_eval_seconds"  # histogram
PROXY_LOAD_SECONDS = f"{PREFIX}_proxy_load_seconds"  # histogram (cold loads show here)
PROXY_FIRST_CHUNK_SECONDS = f"{PREFIX}_proxy_first_chunk_seconds"  # histogram
# summary (sum, count), derived from Ollama's durations: total - load - prompt eval - eval, its queue
PROXY_QUEUE_SECONDS = f"{PREFIX}_proxy_queue_seconds"

# --- resource budget (process table or docker stats) ---
ENGINE_CPU_SECONDS = f"{PREFIX}_engine_cpu_seconds_total"
ENGINE_RESIDENT_BYTES = f"{PREFIX}_engine_resident_memory_bytes"
ENGINE_MEMORY_LIMIT = f"{PREFIX}_engine_memory_limit_bytes"
ENGINE_CPU_LIMIT = f"{PREFIX}_engine_cpu_limit_cores"

# --- the load generator's client-side view (labels: engine, scenario) ---
CLIENT_LABELS = ("engine", "scenario")
CLIENT_TTFT = f"{PREFIX}_client_ttft_seconds"  # histogram
CLIENT_ITL = f"{PREFIX}_client_itl_seconds"  # histogram
CLIENT_E2E = f"{PREFIX}_client_e2e_seconds"  # histogram
CLIENT_OUTPUT_TOKENS = f"{PREFIX}_client_output_tokens_total"
CLIENT_REQUESTS = f"{PREFIX}_client_requests_total"  # + outcome label: ok / error reason
CLIENT_USERS = f"{PREFIX}_client_users"  # gauge: Locust users running
CLIENT_GOOD_REQUESTS = f"{PREFIX}_client_good_requests_total"  # met every SLO term (servescope/judgements/slo.py)
CLIENT_GOOD_OUTPUT_TOKENS = f"{PREFIX}_client_good_output_tokens_total"
CLIENT_SLO_OBJECTIVE = f"{PREFIX}_client_slo_objective"  # gauge: the attainment the SLOs ask for

# The three gauges of the reference page's section 4, in the order a person reads them.
LEVER_GAUGES = (REQUESTS_RUNNING, REQUESTS_WAITING, KV_CACHE_USAGE)
