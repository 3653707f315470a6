"""The extender wire models accept what kube-scheduler sends and answer in its spelling."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderFilterResult,
    HostPriority,
    filter_result,
    host_priorities_json,
)

POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"a": "b"}},
    "spec": {"schedulerName": "tessera"},
    "status": {},
}


def test_args_with_node_names() -> None:
    body = json.dumps({"Pod": POD, "Nodes": None, "NodeNames": ["n1", "n2"]})
    args = ExtenderArgs.model_validate_json(body)
    assert args.candidate_names() == ["n1", "n2"]
    assert args.Pod.metadata.labels == {"a": "b"}
    assert args.Pod.raw()["spec"] == {"schedulerName": "tessera"}


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
    args = ExtenderArgs.model_validate_json(json.dumps({"Pod": POD, "Nodes": nodes, "NodeNames": None}))
    assert args.candidate_names() == ["n1", "n2"]
    answer = json.loads(filter_result(args, ["n1"], {"n2": "full"}).model_dump_json())
    assert answer["NodeNames"] is None
    assert answer["Nodes"]["kind"] == "NodeList"
    assert answer["Nodes"]["items"] == [{"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "4"}}}]
    assert answer["FailedNodes"] == {"n2": "full"}


def test_filter_result_with_names_answers_an_empty_list_not_null() -> None:
    args = ExtenderArgs.model_validate({"Pod": POD, "NodeNames": ["n1"]})
    answer = json.loads(filter_result(args, [], {"n1": "no"}).model_dump_json())
    assert answer["NodeNames"] == []
    assert answer["Error"] == ""
    assert set(answer) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


def test_pod_without_metadata_is_rejected() -> None:
    with pytest.raises(ValidationError):
        ExtenderArgs.model_validate({"Pod": {"spec": {}}, "NodeNames": []})


def test_binding_args_need_pod_and_node() -> None:
    body = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n"}
    args = ExtenderBindingArgs.model_validate(body)
    assert (args.PodName, args.Node) == ("p", "n")
    with pytest.raises(ValidationError):
        ExtenderBindingArgs.model_validate({"PodName": "p", "PodNamespace": "ns", "Node": ""})


def test_priority_scores_stay_in_the_extender_range() -> None:
    assert HostPriority(Host="n", Score=10).model_dump() == {"Host": "n", "Score": 10}
    with pytest.raises(ValidationError):
        HostPriority(Host="n", Score=11)


def test_unknown_envelope_keys_are_ignored() -> None:
    result = ExtenderFilterResult.model_validate({"NodeNames": ["a"], "SomethingNew": 1})
    assert result.NodeNames == ["a"]


def test_priorities_json_has_the_shape_of_a_host_priority_list() -> None:
    scores = {"n1": 10, 'n"odd\u00e9': 0}
    expected = [HostPriority(Host=host, Score=score).model_dump() for host, score in scores.items()]
    assert json.loads(host_priorities_json(scores, scores)) == expected
    assert json.loads(host_priorities_json(["n1", "n1"], scores)) == [expected[0], expected[0]]
    assert json.loads(host_priorities_json([], {})) == []
