"""What the SDK test modules share: random KV tensors shaped like the SDK's default layout."""

from __future__ import annotations

import numpy as np


def make_kv(n_tokens: int, seed: int = 0, layers: int = 2, heads: int = 2, dim: int = 8) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((layers, 2, heads, n_tokens, dim)).astype(np.float32)

