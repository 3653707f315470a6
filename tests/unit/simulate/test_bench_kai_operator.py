"""The KAI contender is configured as KAI's operator configures it at the pinned commit: its tables
in bench/kai.py (plugin and action priorities, placement, scenario search budgets, the binder's
plugins, the client QPS/burst) against the operator's defaults read from KAI's source tree.

The tree is $KAI_SRC or the one hack/build-kai.sh built from (``source_tree``); without one these
tests are skipped, saying how to get it. Nothing of KAI is kept here: the values are read out of
its Go source and chart with regular expressions over the few declarations they live in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from bench.kai import (
    ACTION_PRIORITIES,
    BIND_TIMEOUT_S,
    BINDER_PLUGINS,
    BINPACK_ONLY_PLUGINS,
    COMPONENTS,
    GPU_FRACTION_ANNOTATION,
    GPU_GROUP_LABEL,
    KAI_PODGROUPS_PATH,
    KAI_TOPOLOGIES_PATH,
    OPERATOR_CLIENT,
    PIN_FILE,
    PLACEMENT,
    PLUGIN_PRIORITIES,
    POD_GROUP_ANNOTATION,
    PODGROUPER_PRIORITY_CLASS,
    RESERVATION,
    RESERVED_GPU_ANNOTATION,
    SCENARIO_SEARCH_BUDGETS,
    SHARED_GPU_CONFIGMAP_ANNOTATION,
    SKIP_PODGROUPER_ANNOTATION,
    SPREAD_ONLY_PLUGINS,
    component_args,
    find_kai,
    kai_directory,
    kai_pod_group,
    kai_topology,
    read_pin,
    source_tree,
)

TREE = source_tree(kai_directory(), os.environ)
pytestmark = pytest.mark.skipif(
    TREE is None,
    reason=(
        "no KAI source tree: set KAI_SRC to a checkout at the pinned commit, or build with "
        "`KAI_SRC=<fetched repository> bash hack/build-kai.sh` (docs/benchmarks.md)"
    ),
)


def go_source(relative: str) -> str:
    assert TREE is not None
    return (TREE / relative).read_text()


def go_map(source: str, variable: str) -> dict[str, int]:
    """The entries of `var <variable> = map[string]int{ "name": 123, Constant: 45, ... }`, keyed
    by the quoted name or the constant's identifier."""
    body = re.search(rf"var {variable} = map\[string\]int\{{(.*?)\n\}}", source, re.S)
    assert body, f"{variable} not found"
    return {name: int(value) for name, value in re.findall(r'"?([\w-]+)"?:\s*(\d+)', body.group(1))}


def go_constants(source: str) -> dict[str, str]:
    """`Name = "value"` string constants."""
    return dict(re.findall(r'^\s*(\w+)\s*=\s*"([^"]*)"', source, re.M))


SHARD = "pkg/apis/kai/v1/schedulingshard_types.go"
BINDER = "pkg/apis/kai/v1/binder/binder.go"


def test_the_tree_is_the_pinned_module() -> None:
    pin = read_pin(PIN_FILE.read_text())
    assert re.search(rf"^module {re.escape(pin['KAI_MODULE'])}$", go_source("go.mod"), re.M)


def test_plugin_and_action_priorities_are_the_shards_defaults() -> None:
    shard = go_source(SHARD)
    assert go_map(shard, "defaultPluginPriorities") == PLUGIN_PRIORITIES
    assert go_map(shard, "defaultActionPriorities") == ACTION_PRIORITIES
    # Which plugins GPU binpack turns on (`ptr.To(isGpuBinpackStrategy)`) and which off (`!`).
    toggle = r'updateMap\(defaults, "(\w+)", func\(o \*PluginConfig\) \{ o\.Enabled = ptr\.To\((!?)'
    toggles = dict(re.findall(toggle + r"isGpuBinpackStrategy\)", shard))
    assert sorted(name for name, negated in toggles.items() if not negated) == sorted(BINPACK_ONLY_PLUGINS)
    assert sorted(name for name, negated in toggles.items() if negated) == sorted(SPREAD_ONLY_PLUGINS)
    # Consolidation is off only under spread; the chart's default placement is binpack.
    assert "isConsolidationEnabled := *s.PlacementStrategy.GPU != spreadStrategy" in shard
    values = yaml.safe_load(go_source("deployments/kai-scheduler/values.yaml"))
    assert values["scheduler"]["placementStrategy"] == PLACEMENT
    assert (values["scheduler"]["plugins"], values["scheduler"]["actions"]) == ({}, {})  # no overrides


def test_scenario_search_budgets_are_the_shards_defaults() -> None:
    constants = go_constants(go_source("pkg/common/constants/constants.go"))
    generators = {constants["GeneratorNodeLocalGreedy"]: constants["DefaultNodeLocalGreedy"]}
    generators[constants["GeneratorMultiNodeGang"]] = constants["DefaultMultiNodeGang"]
    default = constants["ActionDefault"]
    assert {
        "maxActionSearchDuration": {default: constants["DefaultActionBudget"]},
        "maxJobSearchDuration": constants["DefaultJobBudget"],
        "minJobSearchDuration": constants["DefaultMinJobBudget"],
        "maxGeneratorSearchDuration": {default: constants["DefaultGeneratorBudget"], **generators},
    } == SCENARIO_SEARCH_BUDGETS


def test_the_binders_plugins_and_flags_are_the_operators() -> None:
    binder = go_source(BINDER)
    names = dict(re.findall(r'(\w+PluginName)\s*=\s*"(\w+)"', binder))  # identifier -> plugin name
    priorities = {names[key]: value for key, value in go_map(binder, "defaultPluginPriorities").items()}
    assert {name: plugin["priority"] for name, plugin in BINDER_PLUGINS.items()} == priorities
    assert re.search(rf"DefaultBindTimeoutSeconds\s*=\s*{BIND_TIMEOUT_S}\b", binder)
    assert re.search(r"DefaultCDIEnabled\s*=\s*false\b", binder)
    assert re.search(r"HamiCorePluginName: \{\s*Enabled:\s*ptr\.To\(false\)", binder)
    # Every flag bench/kai.py gives the binder exists in its flag set at the pin.
    options = go_source("cmd/binder/app/options.go")
    defined = set(re.findall(r'^\s*"([a-z][a-z0-9-]*)",', options, re.M))
    given = component_args("binder", Path("/c.yaml"), {"metrics": 1, "probe": 2})
    flags = {flag[2:].split("=", 1)[0] for flag in given if flag.startswith("--")}
    assert flags <= defined, flags - defined
    assert "cdi-enabled" not in defined  # gone at the pin: CDI is the gpusharing plugin's argument
    plugins = json.loads(given[given.index("--plugins") + 1])
    assert plugins["gpusharing"]["arguments"] == {"cdiEnabled": "false"}


def test_client_qps_and_burst_are_the_operators_defaults() -> None:
    client = go_source("pkg/apis/kai/v1/common/client_config.go")
    qps = re.search(r"c\.QPS = SetDefault\(c\.QPS, ptr\.To\((\d+)\)\)", client)
    burst = re.search(r"c\.Burst = SetDefault\(c\.Burst, ptr\.To\((\d+)\)\)", client)
    assert qps and burst
    assert (int(qps.group(1)), int(burst.group(1))) == OPERATOR_CLIENT


UNREACHABLE_KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    "users": [{"name": "u", "user": {}}],
    "current-context": "c",
}


@pytest.mark.parametrize("name", COMPONENTS)
def test_every_flag_given_is_one_the_built_component_knows(name: str, tmp_path: Path) -> None:
    # The binaries' own --help, where built: pflag lists each flag as "--name", Go's flag package
    # (which also takes "--name") as "-name", each at the start of an indented line.
    install = find_kai()
    if install is None:
        pytest.skip("no KAI build (bash hack/build-kai.sh)")
    binary = install.directory / "bin" / name
    # pflag prints the usage on stderr and exits 0 for --help (some versions exit 2): either is fine.
    # The podgroupcontroller loads its kubeconfig before it parses flags: give it one (never dialled).
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(UNREACHABLE_KUBECONFIG))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    shown = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60, env=env)
    known = set(re.findall(r"^\s+(?:-\w, )?--?([a-z][a-z0-9-]*)", shown.stdout + shown.stderr, re.M))
    given = component_args(name, Path("/c.yaml"), {"metrics": 1, "probe": 2})
    flags = {flag[2:].split("=", 1)[0] for flag in given if flag.startswith("--")}
    assert flags <= known, flags - known


CRDS = "deployments/kai-scheduler/crds"


def crd_schema(file: str, version: str) -> dict[str, object]:
    """The openAPIV3Schema of ``version`` in one of the chart's CRDs."""
    crd = yaml.safe_load(go_source(f"{CRDS}/{file}"))
    served = {v["name"]: v for v in crd["spec"]["versions"]}
    assert served[version]["served"], f"{file} does not serve {version}"
    schema: dict[str, object] = served[version]["schema"]["openAPIV3Schema"]
    return schema


def unknown_fields(value: object, schema: dict[str, object], where: str = "") -> list[str]:
    """Every key of ``value`` its schema does not declare (metadata is the apiserver's)."""
    if isinstance(value, list):
        items = schema.get("items")
        return (
            [bad for item in value for bad in unknown_fields(item, items, f"{where}[]")]
            if isinstance(items, dict)
            else []
        )
    if not isinstance(value, dict):
        return []
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return []  # a free-form object
    missing = [f"{where}.{key}" for key in value if key not in properties]
    return missing + [
        bad
        for key, item in value.items()
        if key in properties and key != "metadata"
        for bad in unknown_fields(item, properties[key], f"{where}.{key}")
    ]


def test_the_topology_and_pod_group_a_gang_gets_use_only_fields_of_kais_crds() -> None:
    topology = kai_topology("racks", ["example.com/block", "example.com/rack", "kubernetes.io/hostname"])
    group = kai_pod_group("ns", "g", "train", 4, "racks", "example.com/rack")
    for obj, file in (
        (topology, "kai.scheduler_topologies.yaml"),
        (group, "scheduling.run.ai_podgroups.yaml"),
    ):
        group_name, version = obj["apiVersion"].split("/")
        crd = yaml.safe_load(go_source(f"{CRDS}/{file}"))
        assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (group_name, obj["kind"])
        assert unknown_fields(obj, crd_schema(file, version)) == []
    scope = yaml.safe_load(go_source(f"{CRDS}/kai.scheduler_topologies.yaml"))["spec"]["scope"]
    assert scope == "Cluster" and KAI_TOPOLOGIES_PATH.endswith("/v1alpha1/topologies")
    assert KAI_PODGROUPS_PATH.startswith("/apis/scheduling.run.ai/v2alpha2/")


def test_a_members_annotations_and_the_priority_class_are_kais_constants() -> None:
    constants = go_constants(go_source("pkg/common/constants/constants.go"))
    assert constants["PodGroupAnnotationForPod"] == POD_GROUP_ANNOTATION
    assert constants["SkipPodGrouperAnnotation"] == SKIP_PODGROUPER_ANNOTATION
    grouper = go_constants(go_source("pkg/podgrouper/podgrouper/plugins/constants/constants.go"))
    assert grouper["TrainPriorityClass"] == PODGROUPER_PRIORITY_CLASS


def test_the_gpu_sharing_names_bench_fragmented_plays_its_part_with_are_kais() -> None:
    # The fraction's annotation, the webhook's ConfigMap annotation and the binder's GPU group
    # label are constants; the reservation pods' namespace is the binder's default, and the
    # annotation the reservation image writes is the same string in the binder and the image.
    constants = go_constants(go_source("pkg/common/constants/constants.go"))
    assert constants["GpuFraction"] == GPU_FRACTION_ANNOTATION
    assert constants["GpuSharingConfigMapAnnotation"] == SHARED_GPU_CONFIGMAP_ANNOTATION
    assert constants["GPUGroup"] == GPU_GROUP_LABEL
    assert constants["DefaultResourceReservationName"] == RESERVATION
    binder = go_constants(go_source("pkg/binder/binding/resourcereservation/resource_reservation.go"))
    image = go_constants(go_source("pkg/resourcereservation/patcher/pod_patcher.go"))
    assert binder["gpuIndexAnnotationName"] == image["reservedGpuIndexAnnotation"] == RESERVED_GPU_ANNOTATION
