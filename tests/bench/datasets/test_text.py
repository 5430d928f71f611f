"""Pieces of prompts of exact token counts, counted in context (with the space before them), down
to one token, with a byte-level tokenizer (the embedded engine's: one token per UTF-8 byte, BOS)."""

from __future__ import annotations

import asyncio
import random

import pytest

from servelab.bench.datasets.text import fit_piece


async def byte_count(text: str) -> int:
    return 1 + len(text.encode())  # BOS + bytes, as servelab.mini.model.tokenizer counts


@pytest.mark.parametrize("target", [1, 2, 3, 4, 5, 16, 37])
@pytest.mark.parametrize("lead", ["", " "])
def test_small_pieces_are_exact_in_context(target, lead):
    if lead == "" and target < 1:
        pytest.skip("nothing to fit")
    text, n, exact = asyncio.run(fit_piece(byte_count, 1, target, random.Random(target), lead))
    assert exact and n == target
    assert len((lead + text).encode()) == target  # in its place in the prompt: exact there
