"""``isiwatch demo`` serves Prometheus metrics where the shipped ``deploy/prometheus/prometheus.yml`` scrapes them,
takes the next free port when that one is taken and the user did not name it (and says so), and refuses in one line
a taken port the user named."""

import contextlib
import inspect
import socket

import pytest
import yaml
from click.testing import CliRunner

from isiwatch.cli import demo as demo_module
from isiwatch.cli.commands import main
from isiwatch.cli.demo import PROMETHEUS_PORT, run_demo
from isiwatch.cli.deploy import DEPLOYMENT


def scraped_port() -> int:
    config = yaml.safe_load((DEPLOYMENT / "prometheus" / "prometheus.yml").read_text())
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "isiwatch"]
    (target,) = job["static_configs"][0]["targets"]
    host, port = target.rsplit(":", 1)
    assert host == "127.0.0.1"
    return int(port)


def test_the_demo_serves_on_the_port_the_shipped_prometheus_config_scrapes():
    option = next(p for p in main.commands["demo"].params if p.name == "prometheus_port")
    default = inspect.signature(run_demo).parameters["prometheus_port"].default
    assert option.default == default == PROMETHEUS_PORT == scraped_port() == 9108


def hold(port: int) -> socket.socket:
    """A listening socket on ``port`` of 127.0.0.1 (left as it is when another process holds the port already)."""
    holder = socket.socket()
    with contextlib.suppress(OSError):
        holder.bind(("127.0.0.1", port))
        holder.listen()
    return holder


def test_a_taken_port_the_user_named_is_one_line_naming_the_option_and_writes_nothing(tmp_path):
    with hold(PROMETHEUS_PORT):
        result = CliRunner().invoke(main, ["demo", "--quick", "--prometheus-port", str(PROMETHEUS_PORT),
                                           "--out", str(tmp_path / "d")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    last = result.output.splitlines()[-1]
    assert last.startswith("Error: port 9108 on 127.0.0.1 is taken") and "--prometheus-port" in last
    assert not (tmp_path / "d").exists()


class Started(Exception):
    """Raised where the demo starts its work, after it chose its port."""


def test_a_taken_default_port_gives_the_next_free_one_and_says_so(tmp_path, monkeypatch):
    def start(out, echo):
        raise Started

    monkeypatch.setattr(demo_module, "_start_afresh", start)
    lines: list[str] = []
    with hold(PROMETHEUS_PORT), hold(PROMETHEUS_PORT + 1):
        chosen = demo_module.next_free_port(PROMETHEUS_PORT)
        with pytest.raises(Started):
            run_demo(tmp_path / "d", quick=True, echo=lines.append)
    assert chosen > PROMETHEUS_PORT + 1 or chosen == 0
    assert lines == [f"port 9108 on 127.0.0.1 is taken: serving Prometheus metrics on port {chosen} instead (the "
                     "prometheus.yml of 'isiwatch deploy DIR' scrapes 9108; --prometheus-port P chooses)"]


def test_only_a_port_the_user_did_not_name_moves(tmp_path, monkeypatch):
    calls: list[dict] = []
    monkeypatch.setattr(demo_module, "run_demo", lambda out, **kwargs: calls.append(kwargs))
    for args in ([], ["--prometheus-port", "9108"]):
        result = CliRunner().invoke(main, ["demo", "--quick", "--out", str(tmp_path / "d"), *args])
        assert result.exit_code == 0, result.output
    assert [c["take_next_port"] for c in calls] == [True, False]


def test_a_folder_a_watch_writes_is_refused_in_one_line_and_left_alone(tmp_path):
    from isiwatch.watch.log_folder import LogFolderLock

    lock = LogFolderLock(tmp_path, "training")
    (tmp_path / "metrics.jsonl").write_text("the training run's\n")
    try:
        result = CliRunner().invoke(main, ["demo", "--quick", "--prometheus-port", "0", "--out", str(tmp_path)])
    finally:
        lock.release()
    assert result.exit_code == 1 and "Traceback" not in result.output
    last = result.output.splitlines()[-1]
    assert last.startswith(f"Error: {tmp_path}/ is in use by run 'training' (pid ") and "--out" in last
    assert (tmp_path / "metrics.jsonl").read_text() == "the training run's\n"
