"""libnvc-share (native/) against the fake driver, graph memory: allocation nodes made, captured and
updated stay inside the memory limit, stay charged while an executable or a launch holds them, and
are released by free nodes and trims (the escape first seen on the H100, one allocation node per
graph, is the first test).

Programs run with LD_PRELOAD=native/libnvc-share.so and the fake driver's libraries
(tests/harness/shim.py). Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import pytest

from harness.shim import GIB, MIB, meminfo, share  # noqa: F401  (fixtures)


def graph_run(share, *ops: object, limit: str = "1Gi") -> list[list[str]]:
    return share.probe(*ops, limits={"NVC_SHARE_MEMORY_LIMIT": limit})


@pytest.mark.parametrize("how", ["memalloc", "addnode", "addnode2", "capture"])
def test_graph_allocations_cannot_pass_the_limit(share, how):
    """The escape seen on the H100: graphs with one allocation node each, instantiated and launched, kept:
    8 x 512 MiB fit a 4 GiB budget, the ninth node is refused when it is created."""
    ops: list[object] = []
    for slot in range(8):
        ops += ["gnode", how, 512 * MIB, "ginst", slot, "flags", "glaunch", slot]
    out = graph_run(share, *ops, "gnode", how, 512 * MIB, "meminfo", limit="4Gi")
    assert [line[:2] for line in out[0:24]] == [
        ["gnode", "CUDA_SUCCESS"],
        ["ginst", "CUDA_SUCCESS"],
        ["glaunch", "CUDA_SUCCESS"],
    ] * 8
    assert out[24][:2] == ["gnode", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert meminfo(out[-1])[0] == 0


def test_launched_graph_memory_stays_charged_until_freed(share):
    """A launched allocation outlives its graph and executable until it is freed; freed, it still
    holds its charge while its graph could launch it again. (gtrim: the driver's reserve of freed graph
    memory is charged until trimmed, test_graph_reserve_beyond_the_nodes_is_charged_until_trimmed.)"""
    out = graph_run(
        share,
        "gnode",
        "memalloc",
        600 * MIB,
        "ginst",
        0,
        "params",
        "glaunch",
        0,
        "gexecdestroy",
        0,
        "gdestroy",
        0,
        "meminfo",
        "gmemfree",
        0,
        "gtrim",
        "meminfo",
        "gnode",
        "addnode2",
        300 * MIB,
        "ginst",
        1,
        "flags",
        "glaunch",
        1,
        "gfreeasync",
        1,
        "gtrim",
        "meminfo",
        "gexecdestroy",
        1,
        "meminfo",
        "gdestroy",
        1,
        "meminfo",
    )
    assert all(line[1] == "CUDA_SUCCESS" for line in out), out
    assert meminfo(out[5])[0] == GIB - 600 * MIB  # graph and executable gone, memory live
    assert meminfo(out[8])[0] == GIB  # cuMemFree
    assert meminfo(out[14])[0] == GIB - 300 * MIB  # freed, but its graph can launch it again
    assert meminfo(out[16])[0] == GIB - 300 * MIB
    assert meminfo(out[18])[0] == GIB


@pytest.mark.parametrize("how", ["memalloc", "addnode", "capture"])
def test_free_nodes_release_graph_memory(share, how):
    out = graph_run(
        share,
        "gnode",
        "memalloc",
        600 * MIB,
        "ginst",
        0,
        "autofree",
        "glaunch",
        0,
        "glaunch",
        0,
        "gexecdestroy",
        0,
        "gdestroy",
        0,
        "meminfo",
        "gfreenode",
        0,
        how,
        "gtrim",
        "meminfo",
        "gmemfree",
        0,
        "meminfo",
    )
    assert [line[1] for line in out[:6]] == ["CUDA_SUCCESS"] * 6
    assert meminfo(out[6])[0] == GIB - 600 * MIB
    assert out[7] == ["gfreenode", "CUDA_SUCCESS"]
    assert meminfo(out[9])[0] == GIB  # freed by the other graph's free node
    assert out[10][1] != "CUDA_SUCCESS"  # already freed: the driver refuses
    assert meminfo(out[11])[0] == GIB  # and nothing is refunded twice


def test_executable_keeps_graph_memory_after_its_graph(share):
    out = graph_run(
        share,
        "gnode",
        "memalloc",
        600 * MIB,
        "ginst",
        0,
        "flags",
        "gdestroy",
        0,
        "meminfo",
        "gexecdestroy",
        0,
        "meminfo",
    )
    assert meminfo(out[3])[0] == GIB - 600 * MIB
    assert meminfo(out[5])[0] == GIB


def test_memory_node_parameters_cannot_change(share):
    out = graph_run(
        share,
        "gnode",
        "memalloc",
        100 * MIB,
        "ginst",
        0,
        "flags",
        "gset",
        0,
        900 * MIB,
        "gexecset",
        0,
        900 * MIB,
        "meminfo",
    )
    assert out[2] == ["gset", "CUDA_ERROR_NOT_SUPPORTED"]
    assert out[3] == ["gexecset", "CUDA_ERROR_NOT_SUPPORTED"]
    assert meminfo(out[4])[0] == GIB - 100 * MIB


def test_exec_update_follows_the_new_graph(share):
    """After cuGraphExecUpdate the executable launches the other graph's allocation."""
    out = graph_run(
        share,
        "gnode",
        "memalloc",
        100 * MIB,
        "ginst",
        0,
        "flags",
        "gnode",
        "memalloc",
        200 * MIB,
        "gupdate",
        0,
        1,
        "gdestroy",
        1,
        "meminfo",
        "glaunch",
        0,
        "gexecdestroy",
        0,
        "meminfo",
    )
    assert all(line[1] == "CUDA_SUCCESS" for line in out), out
    assert meminfo(out[5])[0] == GIB - 300 * MIB  # graph 1 gone, but the executable runs it
    assert meminfo(out[8])[0] == GIB - 300 * MIB  # launched: live until freed; graph 0 still there


def test_graph_reserve_beyond_the_nodes_is_charged_until_trimmed(share):
    """Freed graph memory the driver keeps in its reserve counts until cuDeviceGraphMemTrim."""
    out = graph_run(
        share,
        "gnode",
        "memalloc",
        600 * MIB,
        "ginst",
        0,
        "flags",
        "glaunch",
        0,
        "gexecdestroy",
        0,
        "gdestroy",
        0,
        "gmemfree",
        0,
        "greserve",
        "meminfo",
        "alloc",
        600 * MIB,
        "gtrim",
        "meminfo",
        "alloc",
        600 * MIB,
    )
    assert out[6] == ["greserve", "CUDA_SUCCESS", str(600 * MIB)]
    assert meminfo(out[7])[0] == GIB - 600 * MIB
    assert out[8][:2] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert meminfo(out[10])[0] == GIB
    assert out[11][:2] == ["alloc", "CUDA_SUCCESS"]
