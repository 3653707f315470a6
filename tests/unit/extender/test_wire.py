"""The extender wire models accept what kube-scheduler sends and answer in its spelling."""

from __future__ import annotations

import json

import msgspec
import pytest

from extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderFilterResult,
    HostPriority,
    WireError,
    decode,
    encode,
    filter_result,
    host_priorities_json,
    passed_names,
)

POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"a": "b"}},
    "spec": {"schedulerName": "tessera"},
    "status": {},
}


def test_args_with_node_names() -> None:
    body = json.dumps({"Pod": POD, "Nodes": None, "NodeNames": ["n1", "n2"]}).encode()
    args = decode(ExtenderArgs, body)
    assert args.candidate_names() == ["n1", "n2"]
    assert args.Pod == POD  # the pod stays plain Kubernetes JSON
    assert (args.pod.key, args.pod.uid) == ("ns/p", "u1")


def test_args_with_node_list_keeps_whole_nodes_in_the_answer() -> None:
    nodes = {
        "apiVersion": "v1",
        "kind": "NodeList",
        "metadata": {},
        "items": [
            {"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "4"}}},
            {"metadata": {"name": "n2"}},
        ],
    }
    args = decode(ExtenderArgs, json.dumps({"Pod": POD, "Nodes": nodes, "NodeNames": None}).encode())
    assert args.candidate_names() == ["n1", "n2"]
    result = filter_result(args, ["n1"], {"n2": "full"})
    assert passed_names(result) == ["n1"]
    answer = json.loads(encode(result))
    assert answer["NodeNames"] is None
    assert answer["Nodes"]["kind"] == "NodeList"
    assert answer["Nodes"]["items"] == [{"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "4"}}}]
    assert answer["FailedNodes"] == {"n2": "full"}


def test_filter_result_with_names_answers_an_empty_list_not_null() -> None:
    args = decode(ExtenderArgs, json.dumps({"Pod": POD, "NodeNames": ["n1"]}).encode())
    answer = json.loads(encode(filter_result(args, [], {"n1": "no"})))
    assert answer["NodeNames"] == []
    assert answer["Error"] == ""
    assert set(answer) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"Pod": {"spec": {}}, "NodeNames": []}, "Pod.metadata"),
        ({"Pod": {"metadata": {"name": 1}}, "NodeNames": []}, "must be strings"),
        ({"Pod": POD, "NodeNames": "n1"}, "$.NodeNames"),
        ({"Pod": POD, "Nodes": {"items": [{"metadata": "n1"}]}}, "Nodes.items"),
    ],
)
def test_malformed_args_are_rejected_with_where(body: dict[str, object], needle: str) -> None:
    with pytest.raises(WireError, match=needle.replace("$", r"\$")):
        decode(ExtenderArgs, json.dumps(body).encode())


def test_binding_args_need_pod_and_node() -> None:
    body = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n"}
    args = decode(ExtenderBindingArgs, json.dumps(body).encode())
    assert (args.PodName, args.Node) == ("p", "n")
    with pytest.raises(WireError, match="Node"):
        decode(ExtenderBindingArgs, b'{"PodName": "p", "PodNamespace": "ns", "Node": ""}')


def test_priority_scores_stay_in_the_extender_range() -> None:
    assert msgspec.to_builtins(HostPriority(Host="n", Score=10)) == {"Host": "n", "Score": 10}
    with pytest.raises(WireError):
        decode(HostPriority, b'{"Host": "n", "Score": 11}')


def test_unknown_envelope_keys_are_ignored() -> None:
    result = decode(ExtenderFilterResult, b'{"NodeNames": ["a"], "SomethingNew": 1}')
    assert result.NodeNames == ["a"]


def test_priorities_json_has_the_shape_of_a_host_priority_list() -> None:
    scores = {"n1": 10, 'n"odd\u00e9': 0}
    expected = [msgspec.to_builtins(HostPriority(Host=h, Score=s)) for h, s in scores.items()]
    assert json.loads(host_priorities_json(list(scores), scores.values())) == expected
    assert json.loads(host_priorities_json(["n1", "n1"], [10, 10])) == [expected[0], expected[0]]
    assert json.loads(host_priorities_json([], [])) == []
