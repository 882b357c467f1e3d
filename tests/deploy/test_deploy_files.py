"""The deployment files (Dockerfile, .dockerignore, docker-compose.yml, deploy/) checked without a
Docker engine or a cluster: every YAML parses; paths the files mount or COPY exist; host ports
bind loopback only; the commands they run parse with pidgate's own CLI and their configuration
loads through pidgate's settings loader exactly as ``main()`` would; alert rules are well formed
and fire on the series they are meant for (promtool, where installed); and every metric the
alerts and the dashboard query is one pidgate exports.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from pidgate.cli import build_parser
from pidgate.config import Settings, load_settings
from pidgate.config.serve_flags import serve_overrides

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "pidgate.json"
KUBERNETES = DEPLOY / "kubernetes"

#: The metric names dashboards and alerts may rely on (the contract with
#: proxy/operations/metric_families.py).
CONTRACT_METRICS = frozenset(
    {
        "pidgate_producer_ids_rate",
        "pidgate_producer_ids_tokens",
        "pidgate_producer_ids_throttle_time_seconds",
        "pidgate_requests_total",
        "pidgate_request_bytes_total",
        "pidgate_response_bytes_total",
        "pidgate_upstream_latency_seconds",
        "pidgate_connections",
        "pidgate_connections_total",
        "pidgate_producer_ids_new_total",
        "pidgate_producer_ids_rejected_total",
        "pidgate_produce_requests_rejected_total",
        "pidgate_producer_ids_refreshed_total",
        "pidgate_bloom_layers",
        "pidgate_bloom_filter_bytes",
        "pidgate_bloom_false_positive_rate_estimate",
        "pidgate_principals_tracked",
        "pidgate_principals_evicted_total",
        "pidgate_config_reloads_total",
        "pidgate_protocol_errors_total",
        "pidgate_producer_id_wait_seconds_max",
        "pidgate_producer_ids_waiting_over_half_delivery_timeout",
        "pidgate_producer_ids_waiting_over_delivery_timeout",
        "pidgate_produce_requests_held_total",
        "pidgate_producer_ids_throttled_total",
        "pidgate_quota_failures_total",
        "pidgate_event_log_events_written_total",
        "pidgate_event_log_events_dropped_total",
        "pidgate_event_log_write_errors_total",
        "pidgate_build_info",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
    }
)
_HISTOGRAMS = frozenset({"pidgate_upstream_latency_seconds"})
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_METRIC_NAME = re.compile(r"\bpidgate_[a-z0-9_]+\b")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _yaml_files() -> list[Path]:
    return sorted([COMPOSE, *DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")])


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


# -- every file parses --------------------------------------------------------------------------


@pytest.mark.parametrize("path", _yaml_files(), ids=_rel)
def test_yaml_parses(path: Path) -> None:
    documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    assert documents, "empty file"
    assert all(isinstance(doc, dict) for doc in documents), "every document is a mapping"


def test_dashboard_is_json_with_unique_panel_ids() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    ids = [panel["id"] for panel in _panels(dashboard)]
    assert ids and len(ids) == len(set(ids))
    assert dashboard["uid"] == "pidgate"


# -- Dockerfile ---------------------------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, arguments = line.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return instructions


def _instruction(name: str) -> list[str]:
    return [arguments for keyword, arguments in _dockerfile_instructions() if keyword == name]


def _exec_form(name: str) -> list[str]:
    (arguments,) = _instruction(name)
    value = json.loads(arguments)
    assert isinstance(value, list) and all(isinstance(item, str) for item in value)
    return value


def _dockerignore_excludes(path: str) -> bool:
    """Docker's rules for the build context: the last matching pattern wins, ``!`` re-includes,
    and a pattern matching a parent directory matches everything below it."""
    excluded = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").strip("/")
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            excluded = not negate
    return excluded


def test_dockerfile_copy_sources_exist_in_the_build_context() -> None:
    copies = _instruction("COPY")
    assert copies
    for arguments in copies:
        words = [word for word in shlex.split(arguments) if not word.startswith("--")]
        if any(word.startswith("--from") for word in shlex.split(arguments)):
            continue
        *sources, _destination = words
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
            assert not _dockerignore_excludes(source), f"COPY {source}: excluded by .dockerignore"
    # What the wheel build needs is in the context, what must never be sent is not.
    needed_paths = ("pyproject.toml", "setup.py", "README.md", "src/pidgate/cli.py")
    for needed in (*needed_paths, "src/pidgate/protocol/_speedups.pyx", "deploy/pidgate.yaml"):
        assert not _dockerignore_excludes(needed), needed
    # A module compiled here is for this machine's Python: the image builds its own.
    built_here = "src/pidgate/protocol/_speedups.cpython-311-x86_64-linux-gnu.so"
    for kept_out in (".venv/bin/python", ".git/HEAD", "tests/__init__.py", built_here):
        assert _dockerignore_excludes(kept_out), kept_out


def test_dockerfile_shape() -> None:
    (python_image,) = [a for a in _instruction("ARG") if a.startswith("PYTHON_IMAGE=")]
    assert python_image == "PYTHON_IMAGE=python:3.11-slim"
    stages = _instruction("FROM")
    assert len(stages) >= 2, "multi-stage: build the wheel, install it in the final stage"
    assert all(stage.startswith("${PYTHON_IMAGE}") for stage in stages)
    (user,) = _instruction("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric non-root user (runAsNonRoot can check it)"
    exposed = " ".join(_instruction("EXPOSE")).split()
    assert "9092" in exposed and "9404" in exposed
    (healthcheck,) = _instruction("HEALTHCHECK")
    assert "http://127.0.0.1:9404/healthz" in healthcheck and "urllib" in healthcheck
    assert "curl" not in healthcheck
    assert _exec_form("ENTRYPOINT") == ["pidgate"]
    assert _exec_form("CMD") == ["serve", "--config", "/etc/pidgate/pidgate.yaml"]


def test_entrypoint_is_pidgates_console_script() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["scripts"]["pidgate"] == "pidgate.cli:console_main"


def test_healthcheck_command_is_valid_python() -> None:
    (healthcheck,) = _instruction("HEALTHCHECK")
    command = json.loads(healthcheck[healthcheck.index("CMD") + 3 :].strip())
    assert command[:2] == ["python", "-c"]
    compile(command[2], "<HEALTHCHECK>", "exec")


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed")
def test_hadolint() -> None:
    result = subprocess.run(
        ["hadolint", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- docker-compose.yml -------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    compose = _load_yaml(COMPOSE)
    assert isinstance(compose, dict)
    return compose


def _compose_interpolate(value: str) -> str:
    """``${VAR:-default}`` / ``${VAR-default}`` as compose expands them with VAR unset."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", value)


def _bind_mounts(service: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, _, rest = volume.partition(":")
            target = rest.split(":")[0]
        else:
            source, target = volume.get("source", ""), volume["target"]
        if source.startswith((".", "/")):
            yield source, target


def test_compose_references_existing_files_and_services() -> None:
    compose = _compose()
    services: dict[str, Any] = compose["services"]
    named_volumes = set(compose.get("volumes") or {})
    for name, service in services.items():
        build = service.get("build")
        if build is not None:
            context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
            assert context.is_dir(), f"{name}: build context {context}"
            dockerfile = build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else None
            assert (context / (dockerfile or "Dockerfile")).is_file(), f"{name}: Dockerfile"
        else:
            assert service.get("image"), f"{name}: neither build nor image"
        for source, _target in _bind_mounts(service):
            assert (ROOT / source).exists(), f"{name}: bind mount source {source} does not exist"
        for volume in service.get("volumes", []):
            if isinstance(volume, str) and not volume.startswith((".", "/")):
                assert volume.split(":")[0] in named_volumes, f"{name}: volume {volume}"
        depends_on = service.get("depends_on") or []
        for dependency in depends_on:
            assert dependency in services, f"{name}: depends on unknown service {dependency}"
        network_mode = service.get("network_mode", "")
        if network_mode.startswith("service:"):
            assert network_mode.removeprefix("service:") in services


def test_compose_publishes_ports_on_loopback_only() -> None:
    published = []
    for name, service in _compose()["services"].items():
        for port in service.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name}: {port} binds every interface"
            published.append(name)
    assert {"pidgate", "prometheus", "grafana"} <= set(published)
    assert "kafka" not in published, "clients must not bypass pidgate"


def test_compose_kafka_runs_kraft_and_advertises_the_compose_network() -> None:
    kafka = _compose()["services"]["kafka"]
    environment = kafka["environment"]
    assert kafka["image"].startswith(("apache/kafka:3.9", "bitnami/kafka"))
    assert set(environment["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert environment["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092"


def _container_config(mounts: Iterator[tuple[str, str]], container_path: str) -> Path:
    for source, target in mounts:
        if target == container_path:
            return ROOT / source
    raise AssertionError(f"nothing is mounted at {container_path}")


def _settings_like_main(
    argv: list[str], config_file: Path, environ: Mapping[str, str] | None = None
) -> Settings:
    """What ``pidgate <argv>`` would run with: the real parser, the real overrides, the real
    loader (which also rejects any unknown PIDGATE_* variable)."""
    args = build_parser().parse_args(argv)
    assert args.command == "serve"
    return load_settings(config_file, dict(environ or {}), serve_overrides(args))


def test_compose_pidgate_config_loads_and_matches_its_neighbours() -> None:
    compose = _compose()
    services = compose["services"]
    pidgate = services["pidgate"]
    argv = pidgate["command"]
    assert argv[argv.index("--config") + 1] == "/etc/pidgate/pidgate.yaml"
    config_file = _container_config(_bind_mounts(pidgate), "/etc/pidgate/pidgate.yaml")
    assert config_file == DEPLOY / "pidgate.yaml"
    environ = {key: _compose_interpolate(str(v)) for key, v in pidgate["environment"].items()}

    settings = _settings_like_main(argv, config_file, environ)

    assert settings.proxy.mode == "gateway"
    assert settings.proxy.listen.port == 9092
    (upstream,) = settings.proxy.upstream
    assert upstream.host == "kafka" and upstream.port == 9092
    # The admin endpoint is reachable from the Prometheus container, on the port it scrapes
    # and the image's HEALTHCHECK probes.
    assert (settings.admin.listen.host, settings.admin.listen.port) == ("0.0.0.0", 9404)
    # The per-broker listener of node 1 is published.
    node_id = int(services["kafka"]["environment"]["KAFKA_NODE_ID"])
    broker_port = settings.proxy.broker_listen_port(node_id)
    assert f"127.0.0.1:{broker_port}:{broker_port}" in pidgate["ports"]
    assert settings.state.path is not None
    assert any(target == str(settings.state.path.parent) for target in _volume_targets(pidgate))


def _volume_targets(service: Mapping[str, Any]) -> Iterator[str]:
    for volume in service.get("volumes", []):
        yield volume.split(":")[1] if isinstance(volume, str) else volume["target"]


def test_image_default_command_loads_the_shipped_config() -> None:
    argv = _exec_form("CMD")
    settings = _settings_like_main(argv, DEPLOY / "pidgate.yaml")
    assert settings.proxy.upstream


def test_every_flag_the_deploy_files_pass_is_in_serve_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pidgate", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    used = {
        "dockerfile CMD": _exec_form("CMD"),
        "compose pidgate": _compose()["services"]["pidgate"]["command"],
        "kubernetes sidecar": _pidgate_container()["args"],
    }
    for where, argv in used.items():
        assert argv[0] == "serve", where
        for flag in (word for word in argv if word.startswith("--")):
            assert re.search(rf"(^|\s){re.escape(flag)}\b", result.stdout), f"{where}: {flag}"


def test_prometheus_scrapes_pidgates_admin_port_and_grafana_reads_prometheus() -> None:
    config = _load_yaml(PROMETHEUS_CONFIG)
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "pidgate"]
    targets = [t for static in job["static_configs"] for t in static["targets"]]
    assert targets == ["pidgate:9404"]
    assert (PROMETHEUS_CONFIG.parent / config["rule_files"][0]).resolve() == ALERTS

    services = _compose()["services"]
    prometheus_mounts = dict(_bind_mounts(services["prometheus"]))
    for name in ("prometheus.yml", "alerts.yml"):
        assert prometheus_mounts[f"./deploy/prometheus/{name}"] == f"/etc/prometheus/{name}"

    grafana_mounts = dict(_bind_mounts(services["grafana"]))
    provisioning = ROOT / "deploy/grafana/provisioning"
    assert grafana_mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    (datasource,) = _load_yaml(provisioning / "datasources/prometheus.yml")["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    (provider,) = _load_yaml(provisioning / "dashboards/pidgate.yml")["providers"]
    assert grafana_mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]


# -- Kubernetes ---------------------------------------------------------------------------------


def _kubernetes_objects() -> list[dict[str, Any]]:
    objects = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        objects.extend(doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")))
    return objects


def _kind(kind: str) -> list[dict[str, Any]]:
    return [obj for obj in _kubernetes_objects() if obj["kind"] == kind]


def _pidgate_container() -> dict[str, Any]:
    (statefulset,) = _kind("StatefulSet")
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == "pidgate"]
    return dict(container)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = _load_yaml(KUBERNETES / "kustomization.yaml")
    manifests = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == manifests


def test_kubernetes_objects_are_well_formed() -> None:
    for obj in _kubernetes_objects():
        assert obj.get("apiVersion") and obj.get("kind"), obj
        assert obj["metadata"]["name"] and obj["metadata"]["namespace"] == "kafka"


def _expand_kubernetes_env(container: Mapping[str, Any], pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it: fieldRef metadata.name resolved,
    ``$(VAR)`` expanded from variables defined earlier in the list."""
    environ: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            environ[item["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: environ.get(m.group(1), m.group(0)),
                item["value"],
            )
        elif item["valueFrom"].get("fieldRef", {}).get("fieldPath") == "metadata.name":
            environ[item["name"]] = pod_name
    return environ


def test_kubernetes_sidecar_config_loads_and_matches_the_pod(tmp_path: Path) -> None:
    (configmap,) = _kind("ConfigMap")
    (statefulset,) = _kind("StatefulSet")
    config_file = tmp_path / "pidgate.yaml"
    config_file.write_text(configmap["data"]["pidgate.yaml"], encoding="utf-8")
    container = _pidgate_container()
    pod = statefulset["spec"]["template"]["spec"]
    (kafka,) = [c for c in pod["containers"] if c["name"] == "kafka"]
    replicas = statefulset["spec"]["replicas"]
    headless = statefulset["spec"]["serviceName"]

    # The ConfigMap is mounted where --config points.
    (config_volume,) = [v for v in pod["volumes"] if v.get("configMap", {}).get("name")]
    assert config_volume["configMap"]["name"] == configmap["metadata"]["name"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == config_volume["name"]]
    argv = container["args"]
    assert argv[argv.index("--config") + 1] == f"{mount['mountPath']}/pidgate.yaml"

    for ordinal in range(replicas):
        pod_name = f"{statefulset['metadata']['name']}-{ordinal}"
        environ = _expand_kubernetes_env(container, pod_name)
        environ.pop("POD_NAME")  # not a PIDGATE_* variable; the loader ignores it anyway
        settings = _settings_like_main(argv, config_file, environ)

        assert settings.proxy.mode == "sidecar"
        own_name = f"{pod_name}.{headless}.kafka.svc.cluster.local"
        assert settings.proxy.advertised_host == own_name
        # Forwards to the broker's loopback CLIENT listener in the same pod.
        (upstream,) = settings.proxy.upstream
        kafka_env = _expand_kubernetes_env(kafka, pod_name)
        assert f"CLIENT://{upstream.host}:{upstream.port}" in kafka_env["KAFKA_LISTENERS"]
        # What the broker advertises for CLIENT is mapped to this pod's sidecar.
        advertised = dict(
            entry.split("://") for entry in kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(",")
        )["CLIENT"]
        target = settings.proxy.advertised_endpoints[advertised]
        assert (target.host, target.port) == (own_name, settings.proxy.listen.port)
        # Probes and Prometheus reach the admin listener on the pod IP.
        assert settings.admin.listen.host == "0.0.0.0"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["pidgate-admin"] == settings.admin.listen.port
        assert ports["pidgate-client"] == settings.proxy.listen.port
        assert settings.state.path is not None
        assert any(
            m["mountPath"] == str(settings.state.path.parent) for m in container["volumeMounts"]
        )


def test_kubernetes_sidecar_is_hardened_and_probed() -> None:
    container = _pidgate_container()
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    port_names = {p["name"] for p in container["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in port_names
    service_targets = {
        port["targetPort"] for service in _kind("Service") for port in service["spec"]["ports"]
    }
    assert "pidgate-client" in service_targets


# -- alert rules --------------------------------------------------------------------------------

_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def test_alert_rules_are_well_formed() -> None:
    document = _load_yaml(ALERTS)
    assert set(document) == {"groups"}
    names = []
    for group in document["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"])
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            if "for" in rule:
                assert _DURATION.match(rule["for"]), rule["for"]
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}
            assert {"summary", "description", "runbook"} <= set(rule["annotations"])
            names.append(rule["alert"])
    assert len(names) == len(set(names))


def test_every_alert_has_a_runbook_section() -> None:
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    headings = {
        _github_anchor(line.lstrip("#").strip())
        for line in readme.splitlines()
        if line.startswith("#")
    }
    for rule in _rules():
        runbook = rule["annotations"]["runbook"]
        path, _, anchor = runbook.partition("#")
        assert path == "deploy/README.md"
        assert anchor in headings, f"{rule['alert']}: no heading for #{anchor}"


def _github_anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def test_the_requested_alerts_exist() -> None:
    exprs = {rule["alert"]: rule["expr"] for rule in _rules()}
    assert "pidgate_produce_requests_rejected_total" in exprs["PidgateThrottlingSustained"]
    waiting = exprs["PidgateProducerIdsWaitingPastDeliveryTimeout"]
    assert "pidgate_producer_ids_waiting_over_delivery_timeout" in waiting
    assert "pidgate_bloom_false_positive_rate_estimate" in exprs["PidgateBloomNearSaturation"]
    assert "up{" in exprs["PidgateDown"]
    assert "pidgate_principals_evicted_total" in exprs["PidgatePrincipalsEvicted"]


promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not installed (Debian: apt-get install prometheus)",
)


def _promtool(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["promtool", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


@promtool
def test_promtool_checks_config_and_rules() -> None:
    _promtool("check", "config", PROMETHEUS_CONFIG.name, cwd=PROMETHEUS_CONFIG.parent)
    _promtool("check", "rules", ALERTS.name, cwd=ALERTS.parent)


#: promtool unit tests: each alert fires on the series it is written for, with these labels.
_ALERT_CASES: list[dict[str, Any]] = [
    {
        "series": {
            'pidgate_produce_requests_rejected_total{job="pidgate",instance="p:9404",user="alice"}': "0+60x40",  # noqa: E501
            'pidgate_produce_requests_rejected_total{job="pidgate",instance="p:9404",user="bob"}': "0x40",  # noqa: E501
        },
        "alert": "PidgateThrottlingSustained",
        "quiet_at": "10m",
        "fires_at": "25m",
        "labels": [{"severity": "warning", "user": "alice"}],
    },
    {
        "series": {
            # The alert counts PIDs past half the delivery timeout (it used to read the longest
            # wait; this case still fed that series and failed where promtool is installed).
            'pidgate_producer_ids_waiting_over_half_delivery_timeout{job="pidgate",instance="p:9404",user="bob"}': "0 0 0 2 2 2 2",  # noqa: E501
        },
        "alert": "PidgateProducerIdsWaitingLong",
        "quiet_at": "1m",
        "fires_at": "5m",
        "labels": [{"severity": "warning", "user": "bob"}],
    },
    {
        "series": {
            'pidgate_producer_ids_waiting_over_delivery_timeout{job="pidgate",instance="p:9404",user="bob"}': "0 0 0 2 2 2 2",  # noqa: E501
        },
        "alert": "PidgateProducerIdsWaitingPastDeliveryTimeout",
        "quiet_at": "3m",
        "fires_at": "5m",
        "labels": [{"severity": "critical", "user": "bob"}],
    },
    {
        "series": {
            'pidgate_bloom_false_positive_rate_estimate{job="pidgate",instance="p:9404",user="carol"}': "0.0025x20",  # noqa: E501
            'pidgate_bloom_false_positive_rate_estimate{job="pidgate",instance="p:9404",user="dave"}': "0.001x20",  # noqa: E501
        },
        "alert": "PidgateBloomNearSaturation",
        "quiet_at": "5m",
        "fires_at": "15m",
        "labels": [{"severity": "warning", "instance": "p:9404", "user": "carol"}],
    },
    {
        "series": {
            'up{job="pidgate",instance="p:9404"}': "1 1 0 0 0 0 0",
            'up{job="pidgate",instance="q:9404"}': "1 1 1 1 1 1 1",
        },
        "alert": "PidgateDown",
        "quiet_at": "3m",
        "fires_at": "5m",
        "labels": [{"severity": "critical", "job": "pidgate", "instance": "p:9404"}],
    },
    {
        "series": {
            # p: clients connect and brokers answer. q: clients connect, no broker answers.
            'pidgate_connections_total{job="pidgate",instance="p:9404"}': "0+10x20",
            'pidgate_upstream_latency_seconds_count{job="pidgate",instance="p:9404",api_key="ApiVersions"}': "0+10x20",  # noqa: E501
            'pidgate_connections_total{job="pidgate",instance="q:9404"}': "0+10x20",
            'pidgate_upstream_latency_seconds_count{job="pidgate",instance="q:9404",api_key="ApiVersions"}': "0x20",  # noqa: E501
        },
        "alert": "PidgateUpstreamUnreachable",
        "quiet_at": "3m",
        "fires_at": "15m",
        "labels": [{"severity": "critical", "instance": "q:9404"}],
    },
    {
        "series": {
            'pidgate_principals_evicted_total{job="pidgate",instance="p:9404"}': "0 0 0 5 5 5",
        },
        "alert": "PidgatePrincipalsEvicted",
        "quiet_at": "2m",
        "fires_at": "5m",
        "labels": [{"severity": "warning", "job": "pidgate", "instance": "p:9404"}],
    },
    {
        "series": {
            'pidgate_quota_failures_total{job="pidgate",instance="p:9404"}': "0 0 0 3 9 9",
            'pidgate_quota_failures_total{job="pidgate",instance="q:9404"}': "0 0 0 0 0 0",
        },
        "alert": "PidgateQuotaFailing",
        "quiet_at": "2m",
        "fires_at": "5m",
        "labels": [{"severity": "critical", "job": "pidgate", "instance": "p:9404"}],
    },
    {
        "series": {
            'pidgate_event_log_events_dropped_total{job="pidgate",instance="p:9404"}': "0 0 0 40 40",  # noqa: E501
            'pidgate_event_log_write_errors_total{job="pidgate",instance="p:9404"}': "0 0 0 0 0",
        },
        "alert": "PidgateEventLogDropping",
        "quiet_at": "2m",
        "fires_at": "4m",
        "labels": [{"severity": "warning", "job": "pidgate", "instance": "p:9404"}],
    },
    {
        "series": {
            'pidgate_config_reloads_total{job="pidgate",instance="p:9404",result="failure"}': "0 0 1 1",  # noqa: E501
            'pidgate_config_reloads_total{job="pidgate",instance="p:9404",result="success"}': "0 1 1 2",  # noqa: E501
        },
        "alert": "PidgateConfigReloadFailed",
        "quiet_at": "1m",
        "fires_at": "3m",
        "labels": [
            {"severity": "warning", "job": "pidgate", "instance": "p:9404", "result": "failure"}
        ],
    },
]


def test_every_alert_has_a_promtool_case() -> None:
    assert {case["alert"] for case in _ALERT_CASES} == {rule["alert"] for rule in _rules()}


@promtool
def test_promtool_alerts_fire_on_their_series(tmp_path: Path) -> None:
    # Annotations are rendered and compared by promtool; their templates are already checked
    # by `promtool check rules`, so the unit tests compare labels on a copy without them.
    document = _load_yaml(ALERTS)
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(document), encoding="utf-8")
    tests = []
    for case in _ALERT_CASES:
        tests.append(
            {
                "interval": "1m",
                "input_series": [
                    {"series": series, "values": values}
                    for series, values in case["series"].items()
                ],
                "alert_rule_test": [
                    {"eval_time": case["quiet_at"], "alertname": case["alert"], "exp_alerts": []},
                    {
                        "eval_time": case["fires_at"],
                        "alertname": case["alert"],
                        "exp_alerts": [{"exp_labels": labels} for labels in case["labels"]],
                    },
                ],
            }
        )
    unit_tests = {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(unit_tests), encoding="utf-8")
    _promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)


# -- metric names -------------------------------------------------------------------------------


def _panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [t["expr"] for panel in _panels(dashboard) for t in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def _alert_exprs() -> list[str]:
    return [rule["expr"] for rule in _rules()]


def _referenced_metrics() -> set[str]:
    names = set()
    for expr in [*_dashboard_exprs(), *_alert_exprs()]:
        names.update(_METRIC_NAME.findall(expr))
    return names


def _in_contract(name: str) -> bool:
    if name in CONTRACT_METRICS:
        return True
    for suffix in _HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in _HISTOGRAMS:
            return True
    return False


def test_alerts_and_dashboard_only_query_contract_metrics() -> None:
    referenced = _referenced_metrics()
    assert len(referenced) >= 15
    unknown = sorted(name for name in referenced if not _in_contract(name))
    assert not unknown, f"not in the metric contract: {unknown}"


def test_dashboard_shows_what_the_operator_needs() -> None:
    exprs = "\n".join(_dashboard_exprs())
    for name in (
        "pidgate_producer_ids_rate",
        "pidgate_producer_ids_tokens",
        "pidgate_producer_ids_throttle_time_seconds",
        "pidgate_producer_ids_new_total",
        "pidgate_producer_ids_rejected_total",
        "pidgate_requests_total",
        "pidgate_upstream_latency_seconds_bucket",
        "pidgate_connections",
        "pidgate_bloom_filter_bytes",
        "pidgate_bloom_layers",
        "pidgate_bloom_false_positive_rate_estimate",
        "pidgate_principals_tracked",
        "pidgate_principals_evicted_total",
        "pidgate_producer_ids_waiting_over_delivery_timeout",
    ):
        assert name in exprs, name


def _grafana_to_promql(expr: str) -> str:
    return (
        expr.replace("$__rate_interval", "1m")
        .replace("$__range", "1h")
        .replace("$instance", ".*")
        .replace("$user", ".*")
    )


@promtool
def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    # promtool has no offline "parse this expression"; recording rules are checked by it.
    rules = [
        {"record": f"pidgate:dashboard_query:{i}", "expr": _grafana_to_promql(expr)}
        for i, expr in enumerate(_dashboard_exprs())
        if not expr.startswith("label_values(")
    ]
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": rules}]}), encoding="utf-8")
    _promtool("check", "rules", path.name, cwd=tmp_path)


def _exported_metric_names() -> set[str]:
    """Every series name a real ProxyMetrics exposes on /metrics, families without samples
    included (per-user families are empty until a user shows up)."""
    from prometheus_client.parser import text_string_to_metric_families

    from pidgate.proxy.operations.event_log import EventLogStats
    from pidgate.proxy.operations.metrics import ProxyMetrics
    from pidgate.quota.manager import QuotaManager
    from pidgate.quota.policy import QuotaPolicy

    quota = QuotaManager(QuotaPolicy(default_producer_ids_rate=5))
    quota.admit("User:alice", [42], 0)
    metrics = ProxyMetrics(quota, now_ms=lambda: 1_000)
    metrics.connection_opened()
    metrics.request(0, 100)
    metrics.response(0, 60, 0.002)
    metrics.protocol_error("oversized_frame")
    metrics.config_reloaded(False)
    metrics.event_log_stats = lambda: EventLogStats(1, 0, 0, 0, 0, 1)

    names: set[str] = set()
    for family in text_string_to_metric_families(metrics.render().decode("utf-8")):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + suffix for suffix in _HISTOGRAM_SUFFIXES)
    return names


def test_every_referenced_metric_is_exported_by_pidgate() -> None:
    if importlib.util.find_spec("pidgate.proxy.operations.metrics") is None:
        pytest.skip(
            "pidgate.proxy.operations.metrics does not exist yet: nothing to check names against"
        )
    exported = _exported_metric_names()
    missing = sorted(_referenced_metrics() - exported)
    assert not missing, f"queried by deploy/ but not exported: {missing}"
    not_exported = sorted(CONTRACT_METRICS - exported)
    assert not not_exported, f"in the metric contract but not exported: {not_exported}"
