"""Secret redaction: which arguments of which commands, passwords inside URLs, the HTTP side's view."""

from kvstrata.redact import REDACTED, public_args, redact_args, redact_url

R = REDACTED


def test_auth_and_hello():
    assert redact_args([b"AUTH", b"pw"]) == [b"AUTH", R]
    assert redact_args([b"auth", b"user", b"pw"]) == [b"auth", R, R]
    assert redact_args([b"HELLO", b"3", b"AUTH", b"u", b"pw", b"SETNAME", b"auth"]) == [
        b"HELLO", b"3", b"AUTH", R, R, b"SETNAME", b"auth"]
    assert redact_args([b"HELLO", b"3", b"SETNAME", b"auth", b"AUTH", b"u", b"pw"]) == [
        b"HELLO", b"3", b"SETNAME", b"auth", b"AUTH", R, R]


def test_config_set_secrets_only():
    assert redact_args([b"CONFIG", b"SET", b"requirepass", b"x", b"maxmemory", b"1mb"]) == [
        b"CONFIG", b"SET", b"requirepass", R, b"maxmemory", b"1mb"]
    assert redact_args([b"config", b"set", b"MASTERAUTH", b"x"])[3] == R
    assert redact_args([b"config", b"set", b"pool", b"redis://:pw@h:1"])[3] == R
    args = [b"CONFIG", b"SET", b"maxmemory", b"1mb"]
    assert redact_args(args) == args


def test_acl_setuser_passwords_and_hashes():
    assert redact_args([b"ACL", b"SETUSER", b"u", b"on", b">pw", b"<old", b"#" + b"a" * 64, b"!h", b"~k:*",
                        b"+get"]) == [b"ACL", b"SETUSER", b"u", b"on", R, R, R, R, b"~k:*", b"+get"]


def test_other_commands_untouched():
    args = [b"SET", b"auth", b"requirepass"]
    assert redact_args(args) is args


def test_urls():
    assert redact_url("redis://:pw@h:1") == "redis://:***@h:1"
    assert redact_url("redis-cluster://user:p%40w@a:1,b:2") == "redis-cluster://user:***@a:1,b:2"
    assert redact_url("redis://pw@h") == "redis://***@h"
    assert redact_url("redis://h:1") == "redis://h:1"
    assert "s3cret" not in redact_url("redis://u:s3cret@h:1/0?x=1")
    assert redact_url("redis-sentinel://:pw@a:1,b:2/m?sentinel_password=sp&x=1") == \
        "redis-sentinel://:***@a:1,b:2/m?sentinel_password=***&x=1"
    assert redact_url("unix:///tmp/r.sock?password=pw&db=1") == "unix:///tmp/r.sock?password=***&db=1"


def test_public_args_never_show_keys_or_values():
    assert public_args([b"SET", b"tenant:secret", b"value"]) == ["set", "(2 arguments)"]
    assert public_args([b"CONFIG", b"SET", b"requirepass", b"x"]) == ["config", "set", "(2 arguments)"]
    assert public_args([b"CLIENT", b"s3cret word"]) == ["client", "(1 argument)"]
    assert public_args([b"PING"]) == ["ping"]


def test_migrate_auth_and_auth2():
    base = [b"MIGRATE", b"h", b"1", b"", b"0", b"5"]
    assert redact_args([*base, b"COPY", b"AUTH", b"pw", b"KEYS", b"auth", b"k"]) == [
        *base, b"COPY", b"AUTH", R, b"KEYS", b"auth", b"k"]  # a key named auth is a key
    assert redact_args([*base, b"auth2", b"user", b"pw"]) == [*base, b"auth2", R, R]
    assert redact_args([*base, b"AUTH"]) == [*base, b"AUTH"]
