"""End to end: a real Prometheus server (1 s scrape and evaluation interval, on 127.0.0.1) evaluates
deploy/prometheus's rules against the HTTP exporter of a short training run watched by isiwatch.Watch, and
the plateau alert shows up in Prometheus's HTTP API.

The rules are the shipped ones with one change: every ``for:`` is shortened to ``FOR`` (IsiwatchPlateauOnset
and IsiwatchExporterDown ship with ``for: 1m``), so the test sees the plateau alert go pending, then firing,
and, once the Watch closes its exporter, IsiwatchExporterDown firing, in seconds rather than minutes. The
expressions, labels and annotations are the shipped text. Only the scrape/evaluation intervals and the target
differ from the shipped prometheus.yml. Everything started here is stopped by pid.
"""

import json
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
import yaml
from test_deploy import DASHBOARDS, PROMETHEUS_DIR, dashboard, dashboard_queries, require
from test_truncate import one_thread  # noqa: F401  (autouse: one torch thread, the other core for prometheus)
from test_watch import mixing_vit, set_middle_blocks

from isiwatch import Watch
from isiwatch.io.data import embedded_digits
from isiwatch.measure.vocabulary import alert_hint

RUN = "e2e"
ALERT_TIMEOUT_S = 60
FOR = "3s"  # instead of the shipped for: durations (1m for the two alerts this test waits for)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def api(url: str, path: str, **params):
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:  # refused while starting, 503 until the TSDB is open
        return False


def poll(check, timeout: float, what: str, server: subprocess.Popen, log):
    """``check()`` until it returns something truthy; fail if the server dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"prometheus exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        value = check()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"no {what} after {timeout} s; prometheus log:\n{log.read_text()[-3000:]}")


def short_rules(folder) -> list[str]:
    """Copies of the shipped rule files with every ``for:`` set to ``FOR``, nothing else changed."""
    folder.mkdir()
    copies = []
    for path in sorted((PROMETHEUS_DIR / "rules").glob("*.yml")):
        rules = yaml.safe_load(path.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = FOR
        copies.append(str(folder / path.name))
        (folder / path.name).write_text(yaml.safe_dump(rules, allow_unicode=True, sort_keys=False))
    return copies


def write_config(path, exporter_port: int):
    """The shipped prometheus.yml with 1 s intervals, the rules with short ``for:`` and the test's exporter only."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = short_rules(path.parent / "rules")
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "isiwatch"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{exporter_port}"]}]
    config["scrape_configs"] = [job]
    path.write_text(yaml.safe_dump(config))


@contextmanager
def prometheus_server(tmp, exporter_port: int):
    config, log = tmp / "prometheus.yml", tmp / "prometheus.log"
    write_config(config, exporter_port)
    url = f"http://127.0.0.1:{free_port()}"
    with open(log, "w") as out:
        server = subprocess.Popen([require("prometheus"), f"--config.file={config}",
                                   f"--storage.tsdb.path={tmp / 'data'}",
                                   f"--web.listen-address={url.removeprefix('http://')}"],
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        poll(lambda: ready(url), 30, "ready prometheus", server, log)
        yield url, lambda check, timeout, what: poll(check, timeout, what, server, log)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def run_alerts(url: str, name: str, state: str | None = None) -> list[dict]:
    return [a for a in api(url, "/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == name and a["labels"].get("run") == RUN and state in (None, a["state"])]


def plateau_alerts(url: str, state: str | None = None) -> list[dict]:
    return run_alerts(url, "IsiwatchPlateauOnset", state)


def instant(url: str, query: str) -> list[dict]:
    return api(url, "/api/v1/query", query=query)["result"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Train the head of the mixing ViT under a Watch, first without a plateau, then with blocks 2–5
    collapsed to identities, until Prometheus reports the plateau alert."""
    images, labels = embedded_digits()
    model = mixing_vit().requires_grad_(False)
    model.head.requires_grad_(True)  # training moves the head only, so the blocks stay as set
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.05)
    watch = Watch(model, images[:32], labels[:32], every_n_steps=1, prometheus_port=0, run_name=RUN,
                  plateau_patience=3)
    steps = []

    def train_step():
        batch = slice(64 + 32 * len(steps), 96 + 32 * len(steps))
        loss = F.cross_entropy(model(images[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps.append(loss.item())
        watch.step(len(steps), loss)

    try:
        assert watch.prometheus.port, "the Watch's HTTP exporter did not start"
        with prometheus_server(tmp_path_factory.mktemp("prometheus"), watch.prometheus.port) as (url, wait):
            wait(lambda: train_step() or instant(url, f'isiwatch_training_step{{run="{RUN}"}}'), 30,
                 "scraped isiwatch sample")
            before = {"alerts": plateau_alerts(url),
                      "detected": instant(url, f'isiwatch_plateau_detected{{run="{RUN}"}}')}
            set_middle_blocks(model, 0.0)  # training "collapses" the middle blocks: a flat stretch
            changed, changed_at_step = time.monotonic(), len(steps)
            alerts = wait(lambda: train_step() or plateau_alerts(url), ALERT_TIMEOUT_S, "IsiwatchPlateauOnset")
            seconds = time.monotonic() - changed
            print(f"\nIsiwatchPlateauOnset {alerts[0]['state']} {seconds:.1f} s and "
                  f"{len(steps) - changed_at_step} steps after the change")
            firing = wait(lambda: train_step() or plateau_alerts(url, "firing"), ALERT_TIMEOUT_S,
                          "firing IsiwatchPlateauOnset")
            print(f"IsiwatchPlateauOnset firing {time.monotonic() - changed:.1f} s after the change")
            yield {"url": url, "before": before, "alerts": alerts, "firing": firing, "seconds": seconds,
                   "losses": steps, "watch": watch, "wait": wait, "changed_at_step": changed_at_step,
                   "onset": watch.alerts.opened["plateau_onset"]}
    finally:
        watch.close()


def test_plateau_onset_alert_goes_pending_then_firing_in_prometheus(live):
    assert live["before"]["alerts"] == []
    assert [s["value"][1] for s in live["before"]["detected"]] == ["0"]
    (pending,) = live["alerts"]
    assert pending["state"] == "pending"  # the for: delay is honoured: pending first
    (firing,) = live["firing"]
    for alert in (pending, firing):
        assert alert["labels"] == {"alertname": "IsiwatchPlateauOnset", "run": RUN, "severity": "warning"}
        assert "over blocks 1–5 since step" in alert["annotations"]["description"]
        assert alert["annotations"]["hint"] == alert_hint("plateau_onset")  # what to try, as the record says
    assert firing["activeAt"] == pending["activeAt"]  # the same alert, now past its for: delay
    # the episode opened plateau_patience (3) samples after the change, and the alert names that step
    assert live["onset"].step == live["changed_at_step"] + 3
    assert f"since step {live['onset'].step}" in pending["annotations"]["description"]
    assert [s["value"][1] for s in instant(live["url"], f'isiwatch_plateau_detected{{run="{RUN}"}}')] == ["1"]
    assert live["losses"][-1] < live["losses"][0]  # it really trained


def test_every_dashboard_query_returns_data_from_the_live_run(live):
    url = live["url"]
    for path in DASHBOARDS:
        for query in dashboard_queries(dashboard(path)):
            variable = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
            if variable:
                assert RUN in api(url, f"/api/v1/label/{variable[2]}/values", **{"match[]": variable[1]})
                continue
            expr = query.replace("$run", RUN).replace("$metric", "isi").replace("$__rate_interval", "1m")
            assert instant(url, expr), f"{path.name}: no data for {expr}"  # the plateau alert fires by now


def test_exporter_down_fires_once_the_run_closes_its_exporter(live):
    """Last in this file: it ends the live run (the dashboard test above needs the exporter up)."""
    url, step = live["url"], live["watch"].last_step
    assert run_alerts(url, "IsiwatchExporterDown") == []  # up while the exporter answers
    live["wait"](lambda: [s["value"][1] for s in instant(url, f'isiwatch_training_step{{run="{RUN}"}}')] == [str(step)],
                 10, f"scrape of step {step}")
    live["watch"].close()
    (alert,) = live["wait"](lambda: run_alerts(url, "IsiwatchExporterDown", "firing"), ALERT_TIMEOUT_S,
                            "firing IsiwatchExporterDown")
    assert alert["labels"]["severity"] == "warning" and alert["labels"]["job"] == "isiwatch"
    assert f"(last sampled step {step})" in alert["annotations"]["description"]
