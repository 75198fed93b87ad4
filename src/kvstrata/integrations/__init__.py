"""Integrations with inference engines (transformers, SGLang, vLLM). Heavy imports (torch, transformers) live here only.

Importing this package sets ``OMP_WAIT_POLICY=PASSIVE`` unless it is set already: on shared CPUs, OpenMP
workers that spin between parallel regions slow torch down several times. It only takes effect when torch has
not been imported yet.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
