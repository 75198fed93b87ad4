"""`kvstrata chat` and `kvstrata bench chat` on a tiny random-weight model (fast)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (see scripts/test.sh)
pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvstrata.bench import chat as bench_chat
from kvstrata.cli import main


def test_chat_script_reports_cached_tokens(tmp_path, capsys, module_make_server):
    srv = module_make_server()
    script = tmp_path / "turns.txt"
    script.write_text("What is kvstrata?\n\nHow does it reuse the cache?\nThanks!\n")
    assert main(["chat", "--model", "tiny-qwen2", "--script", str(script), "--max-new-tokens", "4",
                 "--url", f"redis://{srv.host}:{srv.port}", "--chunk-size", "16"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "[turn" in ln]
    assert len(lines) == 3
    assert "cached 0 tokens" in lines[0]
    assert "cached 0 tokens" not in lines[1] and "cached 0 tokens" not in lines[2]
    assert all("TTFT" in ln and "computed" in ln for ln in lines)


def test_chat_no_cache_and_local(tmp_path, capsys):
    script = tmp_path / "turns.txt"
    script.write_text("one\ntwo\n")
    assert main(["chat", "--model", "tiny-llama", "--script", str(script), "--max-new-tokens", "2",
                 "--no-cache"]) == 0
    assert capsys.readouterr().out.count("cached 0 tokens") == 2
    assert main(["chat", "--model", "tiny-llama", "--script", str(script), "--max-new-tokens", "2",
                 "--local", "--chunk-size", "8"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "[turn" in ln]
    assert "cached 0 tokens" not in lines[1]


def test_bench_chat_tiny_all_modes():
    result = bench_chat.run("tiny-qwen2", users=2, turns=2, max_new=3, chunk_size=32, system_tokens=200,
                            modes=list(bench_chat.MODES), compression=None)
    assert set(result["modes"]) == set(bench_chat.MODES)
    assert result["tokens_identical"] is True
    for mode in ("server", "local"):
        m = result["modes"][mode]
        assert m["hit_tokens"] > 0 and m["by_turn"][1]["cached_tokens"] > 0
        assert m["restore_over_memcpy_median"] > 0
        assert 0 < m["restore_share_median"] < 1
        assert 0 < m["uncached_forward_median_s"] and m["uncached_tokens_median"] > 0
        assert m["speedup_bound_from_turn_2"] > 0
    assert result["modes"]["recompute"]["hit_tokens"] == 0
    assert "restore_share_median" not in result["modes"]["recompute"]
    md = bench_chat.write_markdown(result)
    assert md.startswith("## Chat") and "| server |" in md and "tokens identical" in md
    assert "turn 2" in bench_chat.render(result)
    assert "uncached tokens takes" in md and "uncached tokens takes" in bench_chat.render(result)


def test_tokens_stream_as_they_are_generated():
    """``on_token`` gets each token when it is chosen: the first right after the prefill, before any decode step."""
    from kvstrata.chat import ByteChatTokenizer
    from kvstrata.integrations.models import load_tiny
    from kvstrata.integrations.transformers import CachedGenerator, ChatSession

    model = load_tiny("qwen2")
    gen = CachedGenerator(model)
    forwards = []
    hook = model.register_forward_hook(lambda *a: forwards.append(1))
    seen = []  # (token, forwards so far)
    res = gen.generate(list(range(40)), 6, on_token=lambda t: seen.append((t, len(forwards))))
    hook.remove()
    assert [t for t, _ in seen] == res.tokens
    assert [n for _, n in seen] == list(range(1, 7))  # token i is out after forward i, not at the end
    pieces = []
    session = ChatSession(gen, ByteChatTokenizer(), "be brief")
    reply, _ = session.ask("hello", max_new_tokens=8, on_text=pieces.append)
    assert "".join(pieces) == reply


def test_chat_session_server_on_the_given_port(tmp_path, capsys):
    from kvstrata.bench.procs import free_port

    port = free_port()
    script = tmp_path / "turns.txt"
    script.write_text("hi\nagain\n")
    assert main(["chat", "--model", "tiny-llama", "--script", str(script), "--max-new-tokens", "3",
                 "--chunk-size", "8", "--port", str(port)]) == 0
    captured = capsys.readouterr()
    assert f"server redis://127.0.0.1:{port}" in captured.err
    turns = [ln for ln in captured.out.splitlines() if "[turn" in ln]
    assert len(turns) == 2 and "cached 0 tokens" not in turns[1]
    assert captured.out.count("assistant> ") == 2
