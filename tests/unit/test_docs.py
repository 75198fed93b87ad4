"""docs/commands.md and docs/configuration.md are generated from the tables and must not go stale."""

from pathlib import Path

from kvstrata.docgen import commands_markdown, configuration_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_commands_doc_is_current():
    assert (ROOT / "docs" / "commands.md").read_text() == commands_markdown(), "run python -m kvstrata.docgen"


def test_configuration_doc_is_current():
    assert (ROOT / "docs" / "configuration.md").read_text() == configuration_markdown(), (
        "run python -m kvstrata.docgen"
    )


def test_every_command_is_documented():
    text = commands_markdown()
    for name in ("`GET key`", "TAIR.KV.SETEX", "TAIR.KV.MGET", "TAIR.KV.PREFETCH", "CLIENT KILL", "CONFIG SET"):
        assert name in text
