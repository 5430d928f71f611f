"""Load and save model checkpoints: one torch file holding the config, bf16 weights and metadata.

The shipped `tiny` checkpoint lives in mini/weights/tiny.pt (trained by mini/train.py); `flash`
has no checkpoint and is always random (seeded).
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from servelab import atomic
from servelab.errors import UserError
from servelab.mini.model.config import ModelConfig, get_config
from servelab.mini.model.model import MiniModel

WEIGHTS_DIR = Path(__file__).parent.parent / "weights"  # mini/weights/


def shipped_weights(config_name: str) -> Path | None:
    """The checkpoint shipped for a config, if there is one."""
    p = WEIGHTS_DIR / f"{config_name}.pt"
    return p if p.exists() else None


def save(model: MiniModel, path: Path, meta: dict) -> None:
    """Write config + bf16 state dict + metadata (training recipe, losses)."""
    sd = {k: v.detach().to("cpu", torch.bfloat16) for k, v in model.state_dict().items()}
    buf = io.BytesIO()
    torch.save({"config": model.cfg.to_dict(), "state_dict": sd, "meta": meta}, buf)
    atomic.write_bytes(path, buf.getvalue())


def load_model(config_name: str, weights: str | Path | None, device: str, seed: int = 0,
               random_weights: bool = False) -> tuple[MiniModel, dict]:
    """Build the model for `config_name` on `device` in the config's dtype.

    weights: a checkpoint path; None uses the shipped checkpoint when there is one, else random
    weights from `seed` (also when random_weights is set). Returns (model, checkpoint meta).
    """
    cfg: ModelConfig = get_config(config_name)
    meta: dict = {"weights": "random", "seed": seed}
    state = None
    path = None if random_weights else (Path(weights) if weights else shipped_weights(cfg.name))
    if path is not None:
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "does not exist"
            raise UserError(f"weights file {path} {what}; omit --weights for the shipped "
                            "checkpoint or random weights")
        try:
            ck = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # truncated file, not a torch checkpoint, foreign pickle
            ck, why = None, (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        else:
            why = "no config/state_dict"
        if not (isinstance(ck, dict) and {"config", "state_dict"} <= ck.keys()):
            raise UserError(f"weights file {path} is not a servelab.mini checkpoint ({why}); "
                            "train one with python -m servelab.mini.train")
        saved, want = ck["config"], cfg.to_dict()
        if saved != want:
            diff = sorted(k for k in saved if saved.get(k) != want.get(k))
            raise UserError(f"checkpoint {path} was trained for a different config "
                            f"(fields differ: {diff}); pass --config {saved.get('name')}")
        state = ck["state_dict"]
        meta = {"weights": str(path), **ck.get("meta", {})}
    dtype = getattr(torch, cfg.dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = MiniModel(cfg)
    if state is not None:
        model.load_state_dict({k: v.float() for k, v in state.items()})
    model = model.to(dtype).eval().requires_grad_(False)
    # rope tables stay float32 for exact positions; they are cast per use.
    model.rope_cos, model.rope_sin = model.rope_cos.float(), model.rope_sin.float()
    return model.prepare_inference(), meta
