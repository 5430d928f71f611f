"""Byte-level tokenizer: token i < 256 is byte i; a few special tokens above. No files needed.

`encode` is exact and reversible for any text (UTF-8 bytes), so `/tokenize` gives the exact
prompt length a benchmark asks for: len(utf8 bytes) + 1 for BOS.
"""

from __future__ import annotations

import codecs

BOS = 256
EOS = 257
SYSTEM = 258
USER = 259
ASSISTANT = 260
SPECIALS = {BOS: "<|bos|>", EOS: "<|eos|>", SYSTEM: "<|system|>", USER: "<|user|>",
            ASSISTANT: "<|assistant|>"}
_ROLE = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}


def encode(text: str, add_bos: bool = True) -> list[int]:
    """Token ids of `text`: [BOS] + its UTF-8 bytes."""
    ids = list(text.encode("utf-8"))
    return [BOS, *ids] if add_bos else ids


def decode(ids: list[int], skip_special: bool = True) -> str:
    """Text of token ids; invalid UTF-8 sequences become U+FFFD."""
    out = bytearray()
    parts: list[str] = []
    for t in ids:
        if t < 256:
            out.append(t)
        elif not skip_special:
            parts.append(out.decode("utf-8", errors="replace"))
            out.clear()
            parts.append(SPECIALS.get(t, f"<|{t}|>"))
    parts.append(out.decode("utf-8", errors="replace"))
    return "".join(parts)


def token_str(t: int) -> str:
    """Printable form of one token (for /tokenize's token_strs)."""
    if t < 256:
        return bytes([t]).decode("latin-1")
    return SPECIALS.get(t, f"<|{t}|>")


def apply_chat_template(messages: list[dict]) -> list[int]:
    """Chat prompt: BOS, then <|role|> content per message, then <|assistant|> to answer."""
    ids = [BOS]
    for m in messages:
        ids.append(_ROLE[m["role"]])
        ids.extend(m["content"].encode("utf-8"))
    ids.append(ASSISTANT)
    return ids


class StreamDecoder:
    """Incremental detokenizer: bytes in, complete UTF-8 text out (never half a character)."""

    __slots__ = ("_dec",)

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: list[int]) -> str:
        """Text completed by these tokens (special tokens produce no text)."""
        return self._dec.decode(bytes(t for t in ids if t < 256))

    def flush(self) -> str:
        """Whatever is left (an incomplete character becomes U+FFFD)."""
        return self._dec.decode(b"", final=True)
