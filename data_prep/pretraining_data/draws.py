"""Owns the random draws of pretraining data: the original's, faster, and whose they are.

* `shuffle` is CPython's `Random.shuffle` inlined: the same permutation from the same
  generator state, without the method calls per element that dominate the original's
  masking (a shuffle of every instance's positions): 15-30% of an `--exact_draws` run's
  CPU (bench/RESULTS.md, "Speed machinery"). It follows `_randbelow_with_getrandbits`;
  `INLINE_OK` checks at import that this Python's `random` agrees, and `Random.shuffle`
  is used if it does not.
* `chunk_rng` / `chunk_masking_rng`: the generators of one unit of work (a chunk of the
  local pipeline, a pool of the Beam pipeline), derived from the seed and the unit's
  number only, so the output does not depend on which process runs which unit.
"""

from __future__ import annotations

import random

import numpy as np

BIT_LENGTHS = [n.bit_length() for n in range(4097)]


def shuffle(items: list, rng: random.Random) -> None:
    """`rng.shuffle(items)`: the same permutation from the same random draws, faster.

    The hot loop of masking; inlines CPython's Fisher-Yates with rejection sampling
    (`_randbelow_with_getrandbits`). Other generator types use their own `shuffle`.
    """
    if type(rng) is not random.Random or not INLINE_OK:
        rng.shuffle(items)
        return
    getrandbits = rng.getrandbits
    bits = BIT_LENGTHS if len(items) < len(BIT_LENGTHS) else \
        [n.bit_length() for n in range(len(items) + 1)]
    for i in range(len(items) - 1, 0, -1):
        k = bits[i + 1]
        j = getrandbits(k)
        while j > i:
            j = getrandbits(k)
        items[i], items[j] = items[j], items[i]


def _check_inline() -> bool:
    """Whether the inlined shuffle equals this Python's `Random.shuffle` (it follows CPython
    3.x's `_randbelow_with_getrandbits`); if not, the generator's own shuffle is used."""
    global INLINE_OK
    INLINE_OK = True
    try:
        for seed in range(3):
            r1, r2 = random.Random(seed), random.Random(seed)
            for n in (1, 2, 3, 130, 5000):
                a, b = list(range(n)), list(range(n))
                r1.shuffle(a)
                shuffle(b, r2)
                if a != b or r1.random() != r2.random():
                    return False
        return True
    finally:
        INLINE_OK = False


INLINE_OK = False  # set at the end of the module by _check_inline()


def chunk_rng(seed: int, chunk_index: int) -> random.Random:
    """The generator of one chunk. Chunk 0 uses the seed itself, so that a corpus that
    fits in one chunk gives exactly the original's instances, in the original's order."""
    if chunk_index == 0:
        return random.Random(seed)
    return random.Random(f"{seed}/chunk/{chunk_index}")


def chunk_masking_rng(seed: int, chunk_index: int) -> "np.random.Generator":
    """The numpy generator of one chunk's vectorised masking."""
    return np.random.default_rng(
        random.Random(f"{seed}/masking/{chunk_index}").getrandbits(128))


INLINE_OK = _check_inline()
