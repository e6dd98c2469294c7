"""deploy/: promtool checks and unit tests of the rules, the metric-name cross-check against a real exporter,
and the wiring of the Grafana provisioning and docker-compose.yml (compose itself cannot run here).

promtool comes from Debian's ``prometheus`` package, which ``.ci/run`` installs; without it these tests fail.
"""

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_truncate import one_thread  # noqa: F401  (autouse: one torch thread, the other core for prometheus)
from test_watch import mixing_vit, set_middle_blocks

from isiwatch import Watch
from isiwatch.cli.deploy import DEPLOYMENT
from isiwatch.io.data import embedded_digits
from isiwatch.measure.analysis import METRICS
from isiwatch.measure.metric_table import HEATMAP_METRICS
from isiwatch.measure.vocabulary import alert_hint

DEPLOY = Path(str(DEPLOYMENT))  # the packaged copy, which `isiwatch deploy DIR` writes out
PROMETHEUS_DIR = DEPLOY / "prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
METRIC_NAME = re.compile(r"\bisiwatch_[A-Za-z0-9_:]+")


def require(binary: str) -> str:
    """Path of a Prometheus binary; a loud failure (not a skip) when it is missing."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} not found: install Debian's prometheus package (apt-get install prometheus), "
                    "as .ci/run does", pytrace=False)
    return path


def promtool(*args) -> str:
    done = subprocess.run([require("promtool"), *map(str, args)], cwd=PROMETHEUS_DIR, capture_output=True,
                          text=True, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def alerting_rules() -> list[dict]:
    return [rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"] if "alert" in rule]


def dashboard(path: Path) -> dict:
    return json.loads(path.read_text())


def dashboard_queries(board: dict) -> list[str]:
    """Every PromQL text of a dashboard: panel targets, annotations and template-variable queries."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query", "definition") and isinstance(value, str) and "isiwatch_" in value:
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(board)
    return found


def test_promtool_checks_the_config_and_every_rule_file():
    assert RULE_FILES and RULE_TESTS
    assert "SUCCESS" in promtool("check", "config", "prometheus.yml")  # loads rules/*.yml too
    assert promtool("check", "rules", *RULE_FILES).count("SUCCESS") == len(RULE_FILES)


def test_every_alerting_rule_passes_its_promtool_unit_test():
    output = promtool("test", "rules", *RULE_TESTS)
    assert "SUCCESS" in output and "FAILED" not in output
    tested = {case["alertname"] for path in RULE_TESTS for test in yaml.safe_load(path.read_text())["tests"]
              for case in test.get("alert_rule_test", [])}
    rules = {rule["alert"] for rule in alerting_rules()}
    assert {"IsiwatchPlateauOnset", "IsiwatchExporterStale", "IsiwatchIsiStall", "IsiwatchNonFinite"} <= rules
    assert tested == rules


def test_every_rule_on_a_watch_alert_carries_the_kinds_hint_and_its_unit_test_expects_it():
    """The hint annotation is the record's hint (`isiwatch.measure.vocabulary.alert_hint`), so an alert fired in
    Prometheus says what to try as the terminal and the report do; promtool's unit tests expect that text too."""
    kinds = {rule["alert"]: re.search(r'kind="(\w+)"', rule["expr"]) for rule in alerting_rules()}
    kinds = {alert: found.group(1) for alert, found in kinds.items() if found}
    assert set(kinds.values()) == {"plateau_onset", "isi_stall", "non_finite", "monitor_error"}
    for rule in alerting_rules():
        if rule["alert"] in kinds:
            assert rule["annotations"]["hint"] == alert_hint(kinds[rule["alert"]]), rule["alert"]
    expected = [(case["alertname"], alert["exp_annotations"]) for path in RULE_TESTS
                for test in yaml.safe_load(path.read_text())["tests"] for case in test.get("alert_rule_test", [])
                for alert in case.get("exp_alerts", [])]
    assert {name for name, _ in expected} >= set(kinds)
    for name, annotations in expected:
        assert annotations.get("hint") == (alert_hint(kinds[name]) if name in kinds else None), name


@pytest.fixture(scope="module")
def exported_names() -> set[str]:
    """Sample names a real Watch exporter publishes once it has sampled and raised an alert."""
    images, labels = embedded_digits()
    model = mixing_vit()
    set_middle_blocks(model, 0.0)
    registry = CollectorRegistry()
    watch = Watch(model, images[:64], labels[:64], every_n_steps=1, registry=registry, plateau_patience=1)
    assert [a.kind for a in watch.step(1, loss=1.0)] == ["plateau_onset"]
    watch.close()
    families = text_string_to_metric_families(generate_latest(registry).decode())
    return {sample.name for family in families for sample in family.samples}


def test_every_metric_name_in_rules_and_dashboards_is_exported(exported_names):
    texts = [rule["expr"] + " ".join(rule.get("annotations", {}).values()) for rule in alerting_rules()]
    texts += [query for path in DASHBOARDS for query in dashboard_queries(dashboard(path))]
    queried = {name for text in texts for name in METRIC_NAME.findall(text)}
    assert queried - exported_names == set()
    assert {"isiwatch_layer_metric", "isiwatch_alert_active", "isiwatch_plateau_start_layer",
            "isiwatch_last_sample_timestamp_seconds", "isiwatch_alerts_total",
            "isiwatch_sample_duration_seconds_bucket", "isiwatch_recommended_depth"} <= queried


def test_dashboard_has_run_selector_heatmaps_plateau_span_and_alert_annotations():
    board = dashboard(DEPLOY / "grafana" / "dashboards" / "isiwatch.json")
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert "isiwatch_" in variables["run"]["definition"]
    metric = variables["metric"]
    assert metric["query"].split(",") == list(METRICS)  # every metric, so a new one reaches Grafana
    assert metric["current"]["value"] == list(HEATMAP_METRICS)
    heatmap = next(p for p in board["panels"] if p["type"] == "heatmap")
    assert heatmap["repeat"] == "metric" and heatmap["options"]["calculate"] is False
    assert any(p["title"] == "Plateau span" for p in board["panels"])
    # no value is published as an absent series, never -1 (issue 13 #9): the stat panels show the open
    # plateau_onset episode's span and step (what IsiwatchPlateauOnset names), "none" when there is none
    stats = {p["title"]: p for p in board["panels"] if p["type"] == "stat"}
    onset = [stats["Plateau span at onset (blocks)"], stats["Plateau onset step"]]
    assert [t["expr"] for p in onset for t in p["targets"]] == [
        f'max(isiwatch_plateau_onset_{name}{{run="$run"}})' for name in ("start_layer", "end_layer", "step")]
    assert all(t["instant"] and p["fieldConfig"]["defaults"]["noValue"] for p in onset for t in p["targets"])
    assert "-1" not in json.dumps(board)
    annotations = [a for a in board["annotations"]["list"] if not a.get("builtIn")]
    assert any("isiwatch_alert_active" in a["expr"] for a in annotations)
    assert any(a["expr"].startswith("ALERTS{") for a in annotations)
    for query in dashboard_queries(board):  # every query follows the run selector
        assert 'run="$run"' in query or query == variables["run"]["definition"], query
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"


def test_grafana_provisioning_and_compose_fit_together():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"prometheus", "pushgateway", "grafana"}
    mounts = {}
    for service in services.values():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), volume
                mounts[target] = DEPLOY / source
    config = mounts["/etc/prometheus"] / "prometheus.yml"
    assert config == PROMETHEUS_DIR / "prometheus.yml"
    assert all("127.0.0.1" in flag for s in ("prometheus", "pushgateway") for flag in services[s]["command"]
               if flag.startswith("--web.listen-address"))
    assert services["grafana"]["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"

    provisioning = mounts["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "isiwatch.yml").read_text())["providers"]
    assert mounts[provider["options"]["path"]] == DEPLOY / "grafana" / "dashboards"
    board = dashboard(DEPLOY / "grafana" / "dashboards" / "isiwatch.json")
    assert board["templating"]["list"][0]["current"]["value"] == source["uid"]
    assert source["url"] == "http://127.0.0.1:9090"


def test_isiwatch_deploy_writes_the_packaged_files_and_refuses_a_folder_that_holds_files(tmp_path):
    from click.testing import CliRunner

    from isiwatch.cli.commands import main

    out = tmp_path / "monitoring"
    done = CliRunner().invoke(main, ["deploy", str(out)])
    assert done.exit_code == 0, done.output
    written = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    packaged = {p.relative_to(DEPLOY).as_posix(): p.read_bytes() for p in DEPLOY.rglob("*") if p.is_file()}
    assert {"docker-compose.yml", "prometheus/prometheus.yml", "prometheus/rules/isiwatch.yml",
            "grafana/dashboards/isiwatch.json"} <= set(written)
    assert written == packaged
    assert f"docker compose -f {out / 'docker-compose.yml'} up -d" in done.output
    promtool("check", "config", out / "prometheus" / "prometheus.yml")  # the written copy works where it lands

    again = CliRunner().invoke(main, ["deploy", str(out)])
    assert again.exit_code == 1 and again.output.count("\n") == 1, again.output
    assert "is not empty" in again.output
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == written


def test_deploy_prints_a_command_that_works_when_pasted_and_files_that_name_no_other_folder(tmp_path):
    """A folder with a space and a line break: the printed command is one line, and bash reads its path back as the
    folder's; no written file names a ``deploy/`` folder the user does not have."""
    from click.testing import CliRunner

    from isiwatch.cli.commands import main

    out = tmp_path / "my monitoring\nfolder"
    done = CliRunner().invoke(main, ["deploy", str(out)])
    assert done.exit_code == 0 and done.output.count("\n") == 1, done.output
    word = done.output.split("docker compose -f ", 1)[1].removesuffix(" up -d\n")
    pasted = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, text=True, check=True)
    assert pasted.stdout == str(out / "docker-compose.yml")
    for path in out.rglob("*"):
        if path.is_file():
            assert "deploy/" not in path.read_text(), path


def test_the_repository_deploy_folder_is_the_packaged_one(tmp_path):
    """People who clone the repository look for ``deploy/docker-compose.yml`` at its root: it is the copy the wheel
    ships (one folder, linked), not a second one that could drift: a wheel built from the sources carries exactly the
    root folder's files."""
    repo = Path(__file__).resolve().parents[1]
    root = repo / "deploy"
    assert root.is_symlink() and root.resolve() == DEPLOY.resolve()
    source = tmp_path / "source"  # a copy of what a wheel is built from, so the build leaves the checkout alone
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(repo / name, source)
    shutil.copytree(repo / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True)
    [wheel] = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as shipped:
        in_wheel = {name.removeprefix("isiwatch/deploy/"): shipped.read(name) for name in shipped.namelist()
                    if name.startswith("isiwatch/deploy/")}
    assert in_wheel == {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert "docker-compose.yml" in in_wheel


def test_python_m_isiwatch_is_the_isiwatch_command():
    ran = subprocess.run([sys.executable, "-m", "isiwatch", "--help"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert "Usage: python -m isiwatch" in ran.stdout and " deploy " in ran.stdout and " report " in ran.stdout
