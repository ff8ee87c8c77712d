"""A compiled step's graph runs its kernels at their streams' priorities
(``_cuda_overlap.PRIORITY``): the same numbers under every policy, and the priorities really
recorded in the graph's kernel nodes (GPU tests are marked and skip without a GPU)."""

import ctypes

import numpy as np
import pytest

import fuseflow as ff
from fuseflow.backend import _cuda_overlap, _libcuda
from tests.test_compile import _cuda, gpu, make_problem, run_side_by_side

#: CUlaunchAttributeID of a kernel node's priority
_PRIORITY_ATTR = 8


def test_priority_off_asks_the_device_nothing(monkeypatch):
    """"off" gives every stream CuPy's default priority (no device query: runs anywhere)."""
    monkeypatch.setattr(_cuda_overlap, "PRIORITY", "off")
    assert _cuda_overlap.stream_priority("main") is None
    assert _cuda_overlap.stream_priority("side") is None


def test_a_bad_setting_warns_and_keeps_the_default(monkeypatch):
    from fuseflow.backend._env import env_choice
    monkeypatch.setenv("FUSEFLOW_STREAM_PRIORITY", "high")
    with pytest.warns(UserWarning, match="FUSEFLOW_STREAM_PRIORITY='high' is not one of"):
        assert env_choice("FUSEFLOW_STREAM_PRIORITY",
                          {k: k for k in ("main", "side", "off")}, "main") == "main"


def _node_priorities(graph):
    """The priority attribute of every kernel node of ``graph``'s CUgraph."""
    get = _libcuda.entry("cuGraphKernelNodeGetAttribute")
    out = []
    for node in _libcuda.graph_nodes(graph.graph):
        if _libcuda.node_type(node) != _libcuda.KERNEL_NODE:
            continue
        value = (ctypes.c_int * 16)()  # CUlaunchAttributeValue: a 64-byte union
        assert get(ctypes.c_void_p(node), ctypes.c_int(_PRIORITY_ATTR), value) == 0
        out.append(value[0])
    return out


def _runs(monkeypatch, policies, steps=12):
    """Per policy: (eager losses, compiled losses, compiled params, node priorities) of a
    784-512-512-10 Adam step at batch 256 (its weight gradients overlap), same start."""
    cp = _cuda()
    params, state, step, xs, ys = make_problem(sizes=(784, 512, 512, 10), batch=256)
    params, state = ff.device_put((params, state), "cuda")
    xs, ys = cp.asarray(xs), cp.asarray(ys)
    out = {}
    for policy in policies:
        monkeypatch.setattr(_cuda_overlap, "PRIORITY", policy)
        compiled = ff.compile(step)
        eager, graphed, _, pc = run_side_by_side(step, compiled, params, state, xs, ys, steps)
        (g,) = compiled._graphs.values()
        out[policy] = (eager, graphed, pc, g.graph)
    return out


@gpu
def test_every_policy_gives_the_same_numbers(monkeypatch):
    """The priorities change when blocks start, never what they compute: the losses and
    params of every policy are the "off" graph's bit for bit, and the eager step's to
    1e-5; "main" and "side" run a graph instantiated with the node-priority flag."""
    cp = _cuda()
    runs = _runs(monkeypatch, ("off", "main", "side"))
    eager, graphed, params, graph = runs["off"]
    np.testing.assert_allclose(graphed, eager, rtol=1e-5)
    assert not isinstance(graph, _libcuda.GraphExec)
    for policy in ("main", "side"):
        _, other, other_params, other_graph = runs[policy]
        assert isinstance(other_graph, _libcuda.GraphExec)
        assert other == graphed
        for a, b in zip(ff.tree.leaves(other_params), ff.tree.leaves(params)):
            np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b))


@gpu
def test_the_graph_records_its_streams_priorities(monkeypatch):
    """Under "main" the capture stream's kernels (the batch copy first of all) carry the
    device's highest priority and the side streams' the lowest; "side" the other way round;
    "off" one priority for all."""
    _cuda()
    lowest, highest = _libcuda.stream_priority_range()
    assert highest < lowest  # else there is nothing to order
    runs = _runs(monkeypatch, ("off", "main", "side"), steps=1)
    be = ff.backend.get("cuda")
    assert be.stats()["overlapped_wgrad"] > 0
    main = _node_priorities(runs["main"][3])
    side = _node_priorities(runs["side"][3])
    assert set(main) == {lowest, highest} and set(side) == {lowest, highest}
    assert main.count(highest) == side.count(lowest)  # the same nodes, swapped
    assert len(set(_node_priorities(runs["off"][3]))) == 1
