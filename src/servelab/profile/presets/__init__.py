"""Model and GPU presets as data (TOML), each number with its source; lookup lists the known ones."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from servelab.errors import UserError
from servelab.profile.roofline import GpuSpec, ModelSpec, model_from_config

HERE = Path(__file__).parent


def _names(kind: str) -> list[str]:
    return sorted(p.stem for p in (HERE / kind).glob("*.toml"))


def known_models() -> list[str]:
    """Preset names accepted by `--model`."""
    return _names("models")


def known_gpus() -> list[str]:
    """Preset names accepted by `--gpu`."""
    return _names("gpus")


def _find(kind: str, name: str) -> Path | None:
    key = name.lower().replace("_", "-")
    for stem in _names(kind):
        if stem == key:
            return HERE / kind / f"{stem}.toml"
    aliases = {"h100-sxm": "h100", "h200-sxm": "h200", "rtx-pro-6000-blackwell": "rtx-pro-6000",
               "rtx-pro-6000-server": "rtx-pro-6000", "rtx-pro-6000-workstation": "rtx-pro-6000-ws",
               "rtxpro6000": "rtx-pro-6000", "v3": "deepseek-v3", "v3.2": "deepseek-v3.2",
               "v4-flash": "deepseek-v4-flash", "llama-8b": "llama-3.1-8b",
               "llama-70b": "llama-3.1-70b", "qwen3-moe": "qwen3-30b-a3b"}
    stem = aliases.get(key)
    return HERE / kind / f"{stem}.toml" if stem else None


def load_model(name_or_path: str) -> tuple[ModelSpec, dict]:
    """A model preset by name, or any HF `config.json` path. Returns (spec, provenance)."""
    p = Path(name_or_path)
    if p.suffix == ".json" or (p.exists() and p.is_file()):
        if not p.is_file():
            raise UserError(f"--model {name_or_path}: file not found")
        try:
            cfg = json.loads(p.read_text())
        except ValueError as exc:
            raise UserError(f"--model {p}: not valid JSON ({exc})") from None
        if not isinstance(cfg, dict):
            raise UserError(f"--model {p}: a config.json holds one JSON object")
        if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers
            cfg = cfg["text_config"] | {k: v for k, v in cfg.items() if k != "text_config"}
        wdt = "fp8" if (cfg.get("quantization_config") or {}).get("quant_method") == "fp8" else "bf16"
        edt = cfg.get("expert_dtype") if cfg.get("expert_dtype") in ("bf16", "fp8", "fp4") else None
        spec = model_from_config(cfg, name=p.name, default_weight_dtype=wdt, default_expert_dtype=edt)
        return spec, {"source": str(p)}
    path = _find("models", name_or_path)
    if path is None:
        raise UserError(
            f"unknown model preset {name_or_path!r}; known: {', '.join(known_models())} "
            "(or pass a Hugging Face config.json path)"
        )
    doc = tomllib.loads(path.read_text())
    spec = model_from_config(
        doc["config"],
        name=doc["name"],
        kv_bytes_per_token=doc.get("kv_bytes_per_token"),
        default_weight_dtype=doc.get("default_weight_dtype", "bf16"),
        default_expert_dtype=doc.get("default_expert_dtype"),
    )
    return spec, {"preset": path.stem, "source": doc["source"]}


def load_gpu(name: str, measured_peaks: bool = False) -> tuple[GpuSpec, dict]:
    """A GPU preset by name (datasheet numbers; `measured_peaks` uses this lab's where known)."""
    path = _find("gpus", name)
    if path is None:
        raise UserError(f"unknown GPU preset {name!r}; known: {', '.join(known_gpus())}")
    doc = tomllib.loads(path.read_text())
    flops = dict(doc["flops"])
    hbm = float(doc["hbm_bytes_s"])
    src = doc["source"]
    if measured_peaks:
        meas = doc.get("measured")
        if not meas:
            raise UserError(f"GPU preset {path.stem} has no measured peaks; drop --measured-peaks")
        hbm = float(meas.get("hbm_bytes_s", hbm))
        flops.update({k: float(v) for k, v in meas.items() if k in ("bf16", "fp8", "fp4")})
        src += "; measured peaks from this lab (the preset's [measured] rows, docs/FIELD.md)"
    spec = GpuSpec(
        name=doc["name"],
        hbm_bytes_s=hbm,
        link_bytes_s=float(doc["link_bytes_s"]),
        flops={k: float(v) for k, v in flops.items()},
        memory_bytes=float(doc["memory_bytes"]) if "memory_bytes" in doc else None,
        sms=doc.get("sms"),
    )
    return spec, {"preset": path.stem, "source": src}
