"""Benchmark server processes: the real extender app over a synthetic picture, or the HTTP floor.

Run as ``python -m bench.servers {tessera|floor|fast-floor} --nodes N --pods P``. It builds what it serves,
listens on a free local port and prints ``READY <port> <rss_mib> <objects held>`` on stdout, then serves until
its stdin closes (so it never outlives the benchmark that started it).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from extender.binder import Binder
from extender.metrics import ExtenderMetrics
from extender.picture.store import project
from extender.server import build_app
from extender.serving import SERVER_SETTINGS
from extender.status import WaitingPods

from .picture import Picture, build_picture, load_picture, queue_tree

MAX_BODY_BYTES = 256 * 2**20  # a NodeList of 5000 nodes is ~8 MB; leave room


def rss_mib() -> float:
    """Current resident set size of this process, after a full garbage collection."""
    gc.collect()
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _write_pages(path: str, nodes: int, pods: int, tree: bool) -> None:
    """In a child process: the picture as the API server would list it, pages of 500 objects."""
    built = build_picture(nodes, pods, tree=queue_tree() if tree else None)
    listed = {
        "pages": {
            kind: [msgspec.json.encode(items[i : i + 500]) for i in range(0, len(items), 500)]
            for kind, items in built.objects.items()
        },
        "node_names": built.node_names,
        "pending_pods": built.pending_pods,
    }
    with open(path, "wb") as out:
        out.write(msgspec.msgpack.encode(listed))


def _listed(nodes: int, pods: int, tree: bool) -> tuple[Picture, dict[str, list[bytes]]]:
    """The picture's list pages, built in a forked child, so this process never holds the whole
    objects (as the extender, which decodes one page at a time, never does)."""
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "pages")
        child = multiprocessing.get_context("fork").Process(
            target=_write_pages, args=(path, nodes, pods, tree)
        )
        child.start()
        child.join()
        with open(path, "rb") as listed_file:
            listed = msgspec.msgpack.decode(listed_file.read())
    built = Picture(objects={}, node_names=listed["node_names"], pending_pods=listed["pending_pods"])
    return built, listed["pages"]


def tessera_app(nodes: int, pods: int, api: ApiClient, tree: bool = False) -> tuple[web.Application, int]:
    """The extender app over a synthetic picture, and how many objects the picture holds.

    The objects reach the picture as the watcher's do: JSON list pages of 500, decoded and
    projected one page at a time (built in Python they would share strings a real list never
    shares, and the memory benchmark would flatter).
    """
    built, pages = _listed(nodes, pods, tree)
    built.objects = {
        kind: [project(kind, obj) for page in kind_pages for obj in msgspec.json.decode(page)]
        for kind, kind_pages in pages.items()
    }
    del pages
    gc.collect()
    objects = sum(built.count().values())
    picture = load_picture(built, projected=True)
    built.objects.clear()  # the objects are the picture's now
    # The binder is never called by the benchmark; its client makes no connection until used.
    app = build_app(
        picture, Binder(api, picture), WaitingPods(), ExtenderMetrics(picture), max_body_bytes=MAX_BODY_BYTES
    )
    return app, objects


Codec = tuple[Callable[[bytes], Any], Callable[[Any], bytes]]  # decode, encode
# The floors' codecs: the standard library's, and the one the extender uses (msgspec).
CODECS: dict[str, Codec] = {
    "floor": (json.loads, lambda answer: json.dumps(answer).encode()),
    "fast-floor": (msgspec.json.decode, msgspec.json.encode),
}


def floor_app(kind: str = "floor") -> web.Application:
    """A do-nothing extender: the cost of HTTP and JSON alone, with the codec of `kind`.

    Filter decodes the body like any extender must, then passes every candidate node; prioritize
    scores every node 0.
    """
    loads, dumps = CODECS[kind]

    def answer(value: object) -> web.Response:
        return web.Response(body=dumps(value), content_type="application/json")

    async def filter_(request: web.Request) -> web.Response:
        args = loads(await request.read())
        if args.get("NodeNames") is not None:
            return answer({"NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""})
        return answer({"Nodes": args.get("Nodes"), "FailedNodes": {}, "Error": ""})

    async def prioritize(request: web.Request) -> web.Response:
        args = loads(await request.read())
        names = args.get("NodeNames")
        if names is None:
            names = [node["metadata"]["name"] for node in (args.get("Nodes") or {}).get("items", [])]
        return answer([{"Host": name, "Score": 0} for name in names])

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/filter", filter_)
    app.router.add_post("/prioritize", prioritize)
    return app


async def _serve(kind: str, nodes: int, pods: int, tree: bool, port: int = 0) -> None:
    # Built inside the running loop: the extender's API client wants one.
    api = ApiClient()
    app, objects = tessera_app(nodes, pods, api, tree) if kind == "tessera" else (floor_app(kind), 0)
    runner = web.AppRunner(app, access_log=None, **SERVER_SETTINGS)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    port = runner.addresses[0][1]
    print(f"READY {port} {rss_mib():.1f} {objects}", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # returns when the parent closes our stdin
    await runner.cleanup()
    await api.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.servers")
    parser.add_argument("kind", choices=("tessera", *CODECS))
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--queue-tree", action="store_true", help="1000 queues in three levels")
    parser.add_argument("--port", type=int, default=0, help="listen on this port (default: a free one)")
    args = parser.parse_args()
    asyncio.run(_serve(args.kind, args.nodes, args.pods, args.queue_tree, args.port))


if __name__ == "__main__":
    main()
