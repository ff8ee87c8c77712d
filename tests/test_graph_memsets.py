"""A captured graph's memset nodes replayed as fill kernels (``_cuda_graph_memsets``): the
same bytes, in the same order with the work around them (GPU tests; skipped without one)."""

import ctypes

import numpy as np
import pytest

import fuseflow as ff
from fuseflow import nn

gpu = pytest.mark.gpu


def _cuda():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU")
    except Exception:
        pytest.skip("no GPU")
    return cp


def _memset(cp, kind, a, value, count, pitch=0, rows=1):
    """A driver memset of ``a``'s first elements on the current stream (a memset node when
    captured): ``kind`` 8 / 16 / 32 bits per element, or "2d" (32-bit, pitched rows)."""
    from fuseflow.backend import _libcuda

    stream = ctypes.c_void_p(cp.cuda.get_current_stream().ptr)
    dst = ctypes.c_uint64(a.data.ptr)
    if kind == "2d":
        err = _libcuda.entry("cuMemsetD2D32Async")(dst, ctypes.c_size_t(pitch),
                                                   ctypes.c_uint(value), ctypes.c_size_t(count),
                                                   ctypes.c_size_t(rows), stream)
    else:
        fn, ctype = {8: ("cuMemsetD8Async", ctypes.c_ubyte),
                     16: ("cuMemsetD16Async", ctypes.c_ushort),
                     32: ("cuMemsetD32Async", ctypes.c_uint)}[kind]
        err = _libcuda.entry(fn)(dst, ctype(value), ctypes.c_size_t(count), stream)
    assert err == 0, f"memset failed (CUresult {err})"


def _node_types(graph):
    from fuseflow.backend import _libcuda

    return [_libcuda.node_type(n) for n in _libcuda.graph_nodes(graph.graph)]


def _expected(src, kind):
    """What ``step`` below computes on the host, from ``src`` (uint32, 4096 elements)."""
    x = src.copy()
    b = x.view(np.uint8)
    if kind == 8:
        b[3:1003] = 0xA5
    elif kind == 16:
        x.view(np.uint16)[1:2001] = 0xBEEF
    elif kind == 32:
        x[5:3005] = 0xDEADBEEF
    else:  # 7 rows of 100 32-bit words, 128 words apart, from word 9
        for r in range(7):
            x[9 + 128 * r:9 + 128 * r + 100] = 0x01020304
    return x * np.uint32(3) + np.uint32(1)


@gpu
@pytest.mark.parametrize("kind", [8, 16, 32, "2d"])
def test_memset_nodes_become_kernels_with_the_same_bytes_and_order(kind):
    """kernel -> memset -> kernel that reads what it set: after the rewrite no memset node
    is left, and every replay (fresh source data each time) gives the host's result."""
    cp = _cuda()
    from fuseflow.backend import _cuda_graph_memsets as M
    from fuseflow.backend import _libcuda
    from fuseflow.backend._cuda_graph import GraphCapture

    cap = GraphCapture()
    src, x = cap.run(lambda: (cp.zeros(4096, cp.uint32), cp.zeros(4096, cp.uint32)))

    def step():
        x[...] = src  # a kernel before the memset
        if kind == 8:
            _memset(cp, 8, x.view(cp.uint8)[3:], 0xA5, 1000)
        elif kind == 16:
            _memset(cp, 16, x.view(cp.uint16)[1:], 0xBEEF, 2000)
        elif kind == 32:
            _memset(cp, 32, x[5:], 0xDEADBEEF, 3000)
        else:
            _memset(cp, "2d", x[9:], 0x01020304, 100, pitch=128 * 4, rows=7)
        return x * cp.uint32(3) + cp.uint32(1)  # a kernel after it, reading it

    out, graph, _ = cap.capture(step)
    assert isinstance(graph, M.Graph) and graph.replaced == 1
    assert _libcuda.MEMSET_NODE not in _node_types(graph)
    rng = np.random.default_rng(0)
    for _ in range(3):
        host = rng.integers(0, 2 ** 32, 4096, dtype=np.uint32)
        src.set(host)
        graph.launch(cp.cuda.get_current_stream())
        np.testing.assert_array_equal(cp.asnumpy(out), _expected(host, kind))


@gpu
def test_memset_on_a_side_stream_keeps_its_edges():
    """A memset forked to a second stream and joined back (two incoming and outgoing
    orders): the kernel after the join sees its bytes, the one beside it does not wait."""
    cp = _cuda()
    from fuseflow.backend import _cuda_graph_memsets as M
    from fuseflow.backend._cuda_graph import GraphCapture

    cap = GraphCapture()
    a, b = cap.run(lambda: (cp.zeros(1 << 16, cp.uint32), cp.zeros(1 << 16, cp.uint32)))
    side = cp.cuda.Stream(non_blocking=True)

    def step():
        main = cp.cuda.get_current_stream()
        a[...] = b + 1
        fork = main.record()
        side.wait_event(fork)
        with side:
            _memset(cp, 32, a[100:], 7, 5000)
            _memset(cp, 8, b.view(cp.uint8)[8:], 0, 64)
        c = b * 2  # beside the side stream's memsets
        main.wait_event(side.record())
        return a + c

    out, graph, _ = cap.capture(step)
    assert isinstance(graph, M.Graph) and graph.replaced == 2
    rng = np.random.default_rng(1)
    for _ in range(3):
        hb = rng.integers(0, 2 ** 20, 1 << 16, dtype=np.uint32)
        b.set(hb)
        graph.launch(cp.cuda.get_current_stream())
        ha = hb + 1
        ha[100:5100] = 7
        # c may read b before or after the side stream zeroes bytes 8..71: either is allowed
        got = cp.asnumpy(out)
        hb_zeroed = hb.copy()
        hb_zeroed.view(np.uint8)[8:72] = 0
        ok_before, ok_after = ha + hb * 2, ha + hb_zeroed * 2
        assert np.all((got == ok_before) | (got == ok_after))
        np.testing.assert_array_equal(cp.asnumpy(b).view(np.uint8)[8:72], 0)


@gpu
def test_rewrite_off_keeps_the_captured_graph(monkeypatch):
    """FUSEFLOW_GRAPH_MEMSETS=keep (``ENABLED`` False): CuPy's graph, memset node included."""
    cp = _cuda()
    from fuseflow.backend import _cuda_graph_memsets as M
    from fuseflow.backend import _libcuda
    from fuseflow.backend._cuda_graph import GraphCapture

    monkeypatch.setattr(M, "ENABLED", False)
    cap = GraphCapture()
    x = cap.run(lambda: cp.ones(256, cp.uint32))

    def step():
        _memset(cp, 32, x, 5, 128)
        return x + 1

    out, graph, _ = cap.capture(step)
    assert not isinstance(graph, M.Graph)
    assert _libcuda.MEMSET_NODE in _node_types(graph)
    graph.launch(cp.cuda.get_current_stream())
    np.testing.assert_array_equal(cp.asnumpy(out), [6] * 128 + [2] * 128)


@gpu
def test_compiled_16bit_step_with_cublaslt_memsets_matches_eager():
    """The large model's 16-bit Adam step (784-4096-4096-10 at batch 8192: cuBLASLt zeroes
    workspace before its big float16 matmuls): replayed without memset nodes, it gives the
    eager step's losses and params."""
    cp = _cuda()
    from fuseflow.backend import _libcuda

    model = nn.Serial(nn.Dense(4096, "relu"), nn.Dense(4096, "relu"), nn.Dense(10))
    _, params = model.init(ff.random.key(3), (784,))
    opt = ff.mixed_precision.dynamic_loss_scaling(ff.optim.adam(1e-4), compute_dtype="float16")
    step = ff.train.make_step(model, ff.losses.softmax_cross_entropy, opt,
                              compute_dtype="float16")
    rng = np.random.default_rng(3)
    xs = cp.asarray(rng.random((2, 8192, 784), dtype=np.float32))
    ys = cp.asarray(rng.integers(0, 10, (2, 8192)))
    pe, se = ff.device_put((params, opt.init(params)), "cuda")
    pc, sc = ff.tree.map(lambda a: a.copy(), (pe, se))
    compiled = ff.compile(step)
    for i in range(4):
        pe, se, me = step(pe, se, xs[i % 2], ys[i % 2])
        pc, sc, mc = compiled(pc, sc, xs[i % 2], ys[i % 2])
        np.testing.assert_allclose(float(mc["loss"]), float(me["loss"]), rtol=1e-5)
    for a, b in zip(ff.tree.leaves(pc), ff.tree.leaves(pe)):
        np.testing.assert_allclose(cp.asnumpy(a), cp.asnumpy(b), rtol=1e-5, atol=1e-6)
    assert _libcuda.MEMSET_NODE not in _node_types(compiled._last.graph)


def test_memset_setting(monkeypatch):
    """FUSEFLOW_GRAPH_MEMSETS: "kernel" (default) or "keep"; anything else warns and keeps
    the default. Read when the module loads."""
    pytest.importorskip("cupy")
    import importlib

    from fuseflow.backend import _cuda_graph_memsets as M

    try:
        for raw, want in (("kernel", True), ("keep", False)):
            monkeypatch.setenv("FUSEFLOW_GRAPH_MEMSETS", raw)
            assert importlib.reload(M).ENABLED is want
        monkeypatch.setenv("FUSEFLOW_GRAPH_MEMSETS", "off")
        with pytest.warns(UserWarning, match="not one of"):
            assert importlib.reload(M).ENABLED is True
    finally:
        monkeypatch.delenv("FUSEFLOW_GRAPH_MEMSETS")
        importlib.reload(M)
