"""What a prefill server hands a decode server (prefill/decode disaggregation), on the wire; and
the counters of those transfers.

After prefilling a prompt, the prefill server holds everything the decode server needs to go on
as if it had prefilled the prompt itself: the latent KV rows of every layer for the prompt's
positions (the MLA cache row and the indexer key of each token; the MTP layer's rows too when it
speculates), the first sampled token, the MTP drafts for the first verify step, and the state of
the request's random generator (so seeded sampling continues the same stream). Greedy output of
router -> prefill -> decode therefore equals one server's, token for token.

Wire format (one HTTP body, application/octet-stream): b"SLKV", a 4-byte big-endian header
length, a JSON header (room, prompt ids, first token, drafts, dtype, shapes, model fingerprint,
byte counts, the prompt tokens the prefill reused from its prefix cache), then the raw bytes of
`kv` [L, S, kv_dim], `ik` [L, S, index_dim] and the generator state. Raw tensor bytes, not pickle: the decode side never unpickles what it receives.
"""

from __future__ import annotations

import json
import struct
import threading
from dataclasses import dataclass, field

import torch

from servelab.mini.engine.kv_handoff import KVHandoff, TransferError

MAGIC = b"SLKV"
VERSION = 1
ROOM_MAX = 2**64 - 1  # SGLang's router draws rooms in [0, 2^63 - 1]; any u64 is accepted
# every dimension of a received tensor is at most this before anything is allocated: a header
# of kv_shape [0, S, 2^63] with zero bytes is consistent (0 elements) yet torch.empty refuses
# it with a C++ traceback. 2^24 is far past any layer count, context or row width served here,
# and three such dimensions multiply to less than 2^63 (no stride overflows).
DIM_MAX = 1 << 24
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def encode(h: KVHandoff) -> bytes:
    """The handoff as one framed byte string (see the module docstring)."""
    kv = h.kv.detach().contiguous().cpu()
    ik = h.ik.detach().contiguous().cpu()
    kv_b = kv.view(torch.uint8).numpy().tobytes()
    ik_b = ik.view(torch.uint8).numpy().tobytes()
    gen = h.gen_state or b""
    header = json.dumps({
        "version": VERSION, "room": h.room, "prompt": h.prompt, "first_token": h.first_token,
        "drafts": h.drafts, "dtype": str(kv.dtype).removeprefix("torch."),
        "kv_shape": list(kv.shape), "ik_shape": list(ik.shape), "fingerprint": h.fingerprint,
        "bytes": [len(kv_b), len(ik_b), len(gen)], "cached_tokens": h.cached_tokens,
    }).encode()
    return b"".join((MAGIC, struct.pack(">I", len(header)), header, kv_b, ik_b, gen))


def decode(buf: bytes) -> KVHandoff:
    """Parse a framed handoff; TransferError when it is malformed or inconsistent (whatever the
    bytes: a decode server must survive a broken or hostile peer on the bootstrap port)."""
    if len(buf) < 8 or buf[:4] != MAGIC:
        raise TransferError("the prefill server sent something that is not a KV handoff")
    (n,) = struct.unpack(">I", buf[4:8])
    try:
        hd = json.loads(buf[8:8 + n])
        if hd["version"] != VERSION:
            raise TransferError(f"KV handoff version {ascii(hd['version'])[:40]}, this server "
                                f"reads {VERSION}: run the same servelab on both sides")
        dtype = _DTYPES[hd["dtype"]]
        kv_shape, ik_shape = _shape(hd["kv_shape"]), _shape(hd["ik_shape"])
        nkv, nik, ngen = (_count(x) for x in hd["bytes"])
        room, first = _count(hd["room"]), _count(hd["first_token"])
        prompt, drafts = [_count(t) for t in hd["prompt"]], [_count(t) for t in hd["drafts"]]
        fingerprint = hd["fingerprint"]
        if not isinstance(fingerprint, str):
            raise TypeError("fingerprint is not a string")
        cached = _count(hd.get("cached_tokens", 0))  # reported only; absent from older peers
        if cached > len(prompt):
            raise ValueError(f"cached_tokens {cached} > {len(prompt)} prompt tokens")
    except TransferError:
        raise
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise TransferError(f"malformed KV handoff header ({type(exc).__name__}: "
                            f"{one_line(str(exc))[:150]})") from None
    itemsize = torch.empty((), dtype=dtype).element_size()
    if (8 + n + nkv + nik + ngen != len(buf) or nkv != _numel(kv_shape) * itemsize
            or nik != _numel(ik_shape) * itemsize or kv_shape[:2] != ik_shape[:2]
            or kv_shape[1] != len(prompt)):
        raise TransferError(f"KV handoff of {len(buf)} bytes does not match its header "
                            f"(shapes {kv_shape} and {ik_shape}, {hd['dtype']}, "
                            f"{len(prompt)} prompt tokens)")
    off = 8 + n
    try:
        kv = _tensor(buf[off:off + nkv], dtype, kv_shape)
        ik = _tensor(buf[off + nkv:off + nkv + nik], dtype, ik_shape)
    except (RuntimeError, ValueError, OverflowError) as exc:  # not expected past the checks
        raise TransferError(f"KV handoff tensors cannot be built ({type(exc).__name__}: "
                            f"{one_line(str(exc))[:150]})") from None
    gen = buf[off + nkv + nik:] or None
    return KVHandoff(room=room, prompt=prompt, first_token=first, drafts=drafts, kv=kv, ik=ik,
                     fingerprint=fingerprint, gen_state=gen, cached_tokens=cached)


def _count(x: object) -> int:
    """A non-negative JSON integer (token id, room, byte count, dimension)."""
    if type(x) is not int or x < 0:
        raise ValueError(f"{str(x)[:40]!r} is not a non-negative integer")
    return x


def _shape(xs: object) -> list[int]:
    if not isinstance(xs, list) or len(xs) != 3:
        raise ValueError(f"shape {str(xs)[:60]} is not [layers, tokens, dim]")
    out = [_count(x) for x in xs]
    if max(out) > DIM_MAX:
        raise ValueError(f"shape {str(out)[:60]} has a dimension over {DIM_MAX:,}")
    return out


def one_line(text: str) -> str:
    """`text` on one line of printable characters (a peer's text goes into error messages)."""
    return "".join(c if c.isprintable() else " " for c in text)


def _numel(shape: list[int]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _tensor(b: bytes, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    if not b:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).view(dtype).reshape(shape)


@dataclass(slots=True)
class TransferStats:
    """Lifetime counters of KV transfers on one server, read by /metrics.

    direction: "sent" on a prefill server (bytes written to decode servers, seconds spent
    encoding and writing them), "received" on a decode server (bytes read, seconds from the
    first byte of the answer to the last; the wait before it, while the prefill computes, is
    `wait_seconds`). `outcomes` counts transfers by how they ended. A decode server's requests
    that waited for a fetch slot (pd/fetch_queue.py): `queued` of them, `queue_seconds` waited,
    `queue_waiting` waiting now.
    """

    direction: str
    bytes: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    queued: int = 0
    queue_seconds: float = 0.0
    queue_waiting: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def queue(self, waiting: int, seconds: float = 0.0) -> None:
        """A request starts (`waiting` 1) or stops (-1, after `seconds`) waiting for a slot."""
        with self._lock:
            self.queued += max(waiting, 0)
            self.queue_waiting += waiting
            self.queue_seconds += seconds

    def add(self, outcome: str, nbytes: int = 0, seconds: float = 0.0,
            wait_seconds: float = 0.0) -> None:
        with self._lock:
            self.bytes += nbytes
            self.seconds += seconds
            self.wait_seconds += wait_seconds
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
