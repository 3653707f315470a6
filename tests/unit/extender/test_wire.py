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


@pytest.mark.parametrize(
    ("hosts", "classes", "score_of"),
    [
        # Names that need no escaping: joined around the text after each name, by its class's score.
        (["n1", "n2", "n3"], ["a", "b", "a"], {"a": 10, "b": 0}),
        (["n1"], ["a"], {"a": 7}),
        (["n1", "n1"], ["a", "a"], {"a": 10}),
        (["n\u00e9", "n2"], ["a", "b"], {"a": 3, "b": 4}),  # not ASCII: UTF-8, unescaped
        # A quote, a backslash, a control character: encoded as structs instead.
        (['n"odd', "n2"], ["a", "b"], {"a": 10, "b": 0}),
        (["n\\", "n2"], ["a", "a"], {"a": 1}),
        (["n\n", "n2"], ["a", "b"], {"a": 1, "b": 2}),
        ([], [], {}),
    ],
)
def test_priorities_json_is_the_host_priority_list_byte_for_byte(
    hosts: list[str], classes: list[str], score_of: dict[str, int]
) -> None:
    structs = [HostPriority(Host=host, Score=score_of[cls]) for host, cls in zip(hosts, classes, strict=True)]
    assert host_priorities_json(hosts, classes, score_of) == encode(structs)


def test_priorities_json_text_for_two_hosts() -> None:
    # n1 is of class a (score 10), n2 of class b (score 0): the text between them is n1's score.
    assert host_priorities_json(["n1", "n2"], ["a", "b"], {"a": 10, "b": 0}) == (
        b'[{"Host":"n1","Score":10},{"Host":"n2","Score":0}]'
    )


def test_priorities_json_refuses_a_score_out_of_range() -> None:
    with pytest.raises(KeyError):
        host_priorities_json(["n1", "n2"], ["a", "b"], {"a": 11, "b": 0})
