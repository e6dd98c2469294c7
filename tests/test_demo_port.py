"""``isiwatch demo`` serves Prometheus metrics where the shipped ``deploy/prometheus/prometheus.yml`` scrapes them,
and says in one line when that port is taken."""

import inspect
import socket

import yaml
from click.testing import CliRunner

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


def test_a_taken_port_is_one_line_naming_the_option_and_writes_nothing(tmp_path):
    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", PROMETHEUS_PORT))
            holder.listen()
        except OSError:
            pass  # taken already, by another process: the demo must refuse it all the same
        result = CliRunner().invoke(main, ["demo", "--quick", "--out", str(tmp_path / "d")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    last = result.output.splitlines()[-1]
    assert last.startswith("Error: port 9108 on 127.0.0.1 is taken") and "--prometheus-port" in last
    assert not (tmp_path / "d").exists()


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
