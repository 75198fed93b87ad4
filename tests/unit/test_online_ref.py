"""Reference caches of the hit-ratio benchmark (bench/online_ref.py) and the public trace loader."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from kvstrata.bench.hitrate import main, simulate_optimal, simulate_policy
from kvstrata.bench.online_ref import (
    _waiting_density,
    format_references,
    session_continues,
    simulate_informed,
    simulate_lfu_memory,
    simulate_static,
)
from kvstrata.bench.public_traces import TWITTER_MEMBER, load_named, load_public, parse_twitter_csv
from kvstrata.bench.traces import (
    PRESETS,
    Origin,
    Request,
    TraceParams,
    generate,
    generate_annotated,
    trace_stats,
)

SMALL = TraceParams(seed=11, arrivals=150, documents=60, system_prompts=4)


def test_annotated_trace_is_the_trace_and_origins_match_it() -> None:
    trace, origins = generate_annotated(SMALL)
    assert trace == generate(SMALL) and len(origins) == len(trace)
    turns: dict[int, int] = {}
    for req, o in zip(trace, origins, strict=True):
        assert o.family == req.kind
        if o.family == "chat":
            assert o.turn == turns.get(o.session, -1) + 1  # turns of a session come in order
            turns[o.session] = o.turn
            assert o.decode_s > 0
        if o.family == "single":
            assert len(req.reads) == o.prompt_chunks  # a single request reads its prompt only
        if o.family == "rag":
            assert 0 <= o.doc < SMALL.documents and o.prompt_chunks < len(req.reads)
    assert max(turns.values()) >= 1


def _chat(session: int, turn: int, decode: float = 5.0) -> Origin:
    return Origin("chat", session, turn, 0, -1, 1, decode)


def _single(session: int) -> Origin:
    return Origin("single", session, 0, 0, -1, 1, 1.0)


def test_informed_evicts_a_one_off_chunk_before_a_live_session_hand_checked() -> None:
    """Three slots. LRU evicts the session's chunk (oldest) for a one-off request; the informed reference
    evicts the one-off answer, which can never be read again, and the session's next turn hits."""
    params = TraceParams(mean_turns=4.0, think_time_mean_s=30.0, system_prompts=2)
    p, s, x1, x2 = b"P", b"S", b"X1", b"X2"
    trace = [
        Request(0.0, (p,), (s,), "chat"),  # session 0, turn 0: prompt chunk P, writes its chunk S
        Request(1.0, (p,), (x1,), "single"),  # one-off: X1 never read again
        Request(2.0, (p,), (x2,), "single"),  # full: informed evicts X1, LRU evicts S
        Request(40.0, (p, s), (), "chat"),  # turn 1 re-reads P and S
    ]
    origins = [_chat(0, 0), _single(1), _single(2), _chat(0, 1)]
    # Reads: P (miss), P, P, P and S. LRU: 3 hits (P three times; S was evicted for X2).
    assert simulate_policy(trace, 3, "lru") == 3
    victims: list[tuple[int, bytes]] = []
    assert simulate_informed(trace, origins, params, 3, victims=victims) == 4
    assert victims == [(2, x1)]
    assert simulate_optimal(trace, 3) == 4


def test_informed_drops_a_session_that_reached_max_turns() -> None:
    params = TraceParams(mean_turns=4.0, max_turns=1, system_prompts=2)
    trace = [Request(0.0, (b"P",), (b"S",), "chat"), Request(1.0, (b"Q",), (), "chat")]
    origins = [_chat(0, 0), Origin("chat", 1, 0, 1, -1, 1, 5.0)]
    victims: list[tuple[int, bytes]] = []
    simulate_informed(trace, origins, params, 2, victims=victims)
    assert victims == [(1, b"S")]  # with max_turns 1 the session is over: its chunk goes, not the prompt


def test_informed_prefers_the_popular_prompt() -> None:
    """Prompt 0 is read ~3x as often as prompt 2 (Zipf s=1 over 3): with one slot for prompts, keep prompt 0."""
    params = TraceParams(system_prompts=3, system_zipf_s=1.0)
    trace = [Request(0.0, (b"P2",), (), "single"), Request(1.0, (b"P0",), (), "single"),
             Request(2.0, (b"P1",), (), "single")]
    origins = [Origin("single", i, 0, prompt, -1, 1, 1.0) for i, prompt in enumerate((2, 0, 1))]
    victims: list[tuple[int, bytes]] = []
    simulate_informed(trace, origins, params, 2, victims=victims)
    assert victims == [(2, b"P2")]  # LRU would evict P2 too, so also check the reverse order below
    victims.clear()
    simulate_informed([trace[1], trace[0], trace[2]], [origins[1], origins[0], origins[2]], params, 2,
                      victims=victims)
    assert victims == [(2, b"P2")]  # P2 is the most recent, still the least popular


def test_blind_to_decode_ranks_sessions_by_idle_time() -> None:
    """Session 0 was served first with a short answer, session 1 later with a long one. Knowing decode times,
    session 1 is the one that cannot come back for a minute, so its chunk goes; blind to them, the session idle
    longest goes, as in LRU."""
    params = TraceParams(mean_turns=4.0, think_time_mean_s=30.0, system_prompts=1)
    trace = [Request(0.0, (b"P",), (b"A",), "chat"), Request(5.0, (b"P",), (b"B",), "chat"),
             Request(6.0, (b"P",), (b"C",), "chat")]
    origins = [_chat(0, 0, decode=1.0), _chat(1, 0, decode=60.0), _chat(2, 0, decode=1.0)]
    seen: list[tuple[int, bytes]] = []
    simulate_informed(trace, origins, params, 3, victims=seen)
    assert seen == [(2, b"B")]  # session 1 cannot return before t = 65; session 0 is due since t = 1
    seen.clear()
    simulate_informed(trace, origins, params, 3, victims=seen, blind=frozenset({"decode"}))
    assert seen == [(2, b"A")]  # without decode times: the longest idle session, as LRU would
    with pytest.raises(ValueError, match="unknown blind"):
        simulate_informed(trace, origins, params, 3, blind=frozenset({"future"}))


def test_hit_density_of_a_waiting_session() -> None:
    """A session sure to return (p = 1) after wait + Exp(T) is worth one hit per wait + T seconds of space; a
    session that may not return is worth less, and less the longer it is still to wait; at wait 0 its density
    tends to p / T, the overdue formula's value at x = 0 (continuity between the two cases)."""
    assert _waiting_density(1.0, 30.0, 10.0) == pytest.approx(1 / 40, rel=0.01)
    assert _waiting_density(0.75, 30.0, 10.0) < _waiting_density(1.0, 30.0, 10.0)
    assert _waiting_density(0.75, 30.0, 20.0) < _waiting_density(0.75, 30.0, 5.0)
    assert _waiting_density(0.75, 30.0, 1e-6) == pytest.approx(0.75 / 30, rel=0.02)


def test_lfu_memory_keeps_the_most_read_key_and_remembers_counts() -> None:
    seq = [b"a", b"a", b"a", b"b", b"c", b"a"]
    trace = [Request(float(i), (k,), ()) for i, k in enumerate(seq)]
    assert simulate_policy(trace, 2, "lru") == 2  # c evicts a, the least recently used
    assert simulate_lfu_memory(trace, 2) == 3  # c evicts b (read once), a hits again
    # b is evicted (a tie at count 1), comes back with its old count (now 2), so c's arrival evicts y (1), not b.
    back = [Request(float(i), (k,), ()) for i, k in enumerate([b"b", b"x", b"y", b"b", b"c", b"b"])]
    assert simulate_lfu_memory(back, 2) == 1
    with pytest.raises(ValueError):
        simulate_lfu_memory(trace, 0)


def test_static_reference_counts_rereads_of_the_best_set() -> None:
    trace = [Request(float(i), (k,), ()) for i, k in enumerate([b"a", b"a", b"a", b"b", b"b", b"c"])]
    assert simulate_static(trace, 1) == 2  # a: first access is compulsory, two re-reads
    assert simulate_static(trace, 2) == 3
    assert simulate_static(trace, 3) == 3
    written = [Request(0.0, (), (b"a",)), Request(1.0, (b"a",), ()), Request(2.0, (b"a",), ())]
    assert simulate_static(written, 1) == 2  # written first, so both reads hit


def test_references_bounded_by_full_capacity_and_min() -> None:
    trace, origins = generate_annotated(SMALL)
    stats = trace_stats(trace)
    full = stats["distinct_chunks"]
    compulsory = simulate_optimal(trace, full)
    assert simulate_informed(trace, origins, SMALL, full) == compulsory
    assert simulate_informed(trace, origins, SMALL, full, peek=True) == compulsory
    for cap in (full // 50, full // 20, full // 5):
        opt = simulate_optimal(trace, cap)
        for peek in (False, True):
            assert 0 < simulate_informed(trace, origins, SMALL, cap, peek=peek) <= opt
        assert simulate_static(trace, cap) <= compulsory


def _victims_before(trace: list[Request], origins: list[Origin], cap: int, cut: int, peek: bool) -> list:
    victims: list[tuple[int, bytes]] = []
    simulate_informed(trace, origins, SMALL, cap, peek=peek, victims=victims)
    return [v for v in victims if v[0] < cut]


def test_informed_reference_never_uses_the_future() -> None:
    """Changing the trace after request ``cut`` leaves every eviction before ``cut`` unchanged; the peeking
    variant, which is told which sessions continue, does change (so this test can tell the two apart)."""
    params = replace(SMALL, arrivals=300)
    trace, origins = generate_annotated(params)
    cap = trace_stats(trace)["distinct_chunks"] // 20
    cut = len(trace) // 2
    # Future 1: the trace stops at ``cut``. Future 2: every chat turn after ``cut`` is dropped (sessions end).
    keep = [i for i in range(len(trace)) if i < cut or origins[i].family != "chat"]
    futures = [(trace[:cut], origins[:cut]), ([trace[i] for i in keep], [origins[i] for i in keep])]
    base = _victims_before(trace, origins, cap, cut, peek=False)
    assert len(base) > 50
    for t, o in futures:
        assert _victims_before(t, o, cap, cut, peek=False) == base
    peek_base = _victims_before(trace, origins, cap, cut, peek=True)
    t, o = futures[1]
    assert _victims_before(t, o, cap, cut, peek=True) != peek_base
    assert session_continues(o) != session_continues(origins)


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(PRESETS, "tiny", SMALL)
    return "tiny"


def test_online_ref_command(capsys: pytest.CaptureFixture[str], tiny: str) -> None:
    assert main(["--online-ref", "--trace", tiny, "--fractions", "0.05,0.2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmark"] == "hitrate-online-ref" and len(doc["results"]) == 2
    for row in doc["results"]:
        ratios = row["over_optimal"]
        assert {"informed", "informed+peek", "informed-no-decode", "informed-no-oneoff", "informed-no-popularity",
                "informed-no-ranks", "lfu-memory", "static", "lru", "lru-k"} <= set(ratios)
        assert all(0 < v <= 1.0 for k, v in ratios.items() if k != "static")
    md = format_references(doc, markdown=True)
    assert md.count(f"| {tiny} |") == 2 and "informed+peek" in md


_CSV = "# time, object, size, next_access_vtime\n" + "".join(
    f"{i // 4}, {k}, 100, -1\n" for i, k in enumerate([7, 8, 7, 9, 7, 8, 10, 7, 11, 8, 7, 12])
)


def test_twitter_csv_parsed_from_file_and_source_archive(tmp_path: Path) -> None:
    trace = parse_twitter_csv(io.StringIO(_CSV))
    assert [r.reads for r in trace][:3] == [(b"7",), (b"8",), (b"7",)] and trace[4].time == 1.0
    assert len(parse_twitter_csv(io.StringIO(_CSV), limit=5)) == 5
    with pytest.raises(ValueError):
        parse_twitter_csv(["1\n"])
    csv = tmp_path / "twitter_cluster52.csv"
    csv.write_text(_CSV)
    archive = tmp_path / "libcachesim-0.3.5.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(csv, arcname="libcachesim-0.3.5/" + TWITTER_MEMBER)
    assert load_public("twitter52", str(archive)) == load_public("twitter52", str(csv)) == trace
    other = tmp_path / "other.tar.gz"
    with tarfile.open(other, "w:gz") as tar:
        tar.add(csv, arcname="x/data.csv")
    with pytest.raises(ValueError, match="no src/libCacheSim"):
        load_public("twitter52", str(other))
    loaded, info = load_named("twitter52", trace_file=str(csv))
    assert loaded == trace and "libcachesim" in info["source"]


def test_twitter_trace_in_the_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text(_CSV)
    assert main(["--trace", "twitter52", "--trace-file", str(csv), "--fractions", "0.4", "--no-cost",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["results"]
    # 12 reads of 6 objects, 2 slots (7 8 7 9 7 8 10 7 11 8 7 12): MIN keeps 7 and hits it four times.
    assert row["capacity"] == 2 and row["hits"]["optimal"] == 4
    assert doc["traces"]["twitter52"]["stats"]["chunk_reads"] == 12
    assert main(["--online-ref", "--trace", "twitter52", "--trace-file", str(csv), "--fractions", "0.4"]) == 0
    out = capsys.readouterr().out
    assert "twitter52" in out and "static" in out and "informed" not in out
    monkeypatch.delenv("KVSTRATA_TWITTER_TRACE", raising=False)
    with pytest.raises(SystemExit):
        main(["--trace", "twitter52"])
