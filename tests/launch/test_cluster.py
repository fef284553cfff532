"""A loopback cluster's layout (dpbert/launch/cluster.py): free ports below the ephemeral range,
one TF_CONFIG per rank and the rank read back (loopback and Vertex AI's chief + workers), and the
child command that runs this checkout's module from a folder that would shadow it."""
import json
import socket
import subprocess

import pytest

from dpbert.launch.cluster import ephemeral_range, free_ports, loopback_tf_configs, module_command, tf_config_rank


def test_ranks_from_tf_config():
    assert [tf_config_rank(c) for c in loopback_tf_configs(3)] == [0, 1, 2]
    vertex = {"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "task": {"type": "worker", "index": 1}}
    assert tf_config_rank(json.dumps(vertex)) == 2
    assert tf_config_rank(json.dumps(dict(vertex, task={"type": "chief", "index": 0}))) == 0
    with pytest.raises(ValueError, match="ps"):
        tf_config_rank(json.dumps({"cluster": {}, "task": {"type": "ps", "index": 0}}))
    with pytest.raises(ValueError, match="workers must be >= 1"):
        loopback_tf_configs(0)


def test_cluster_ports_are_free_distinct_and_below_the_ephemeral_range():
    """Not from the range port-0 binds and outgoing connections draw from (another process could
    take such a port before the worker binds it, and the cluster would hang)."""
    low, _ = ephemeral_range()
    ports = free_ports(4)
    assert len(set(ports)) == 4 and all(10000 <= p < low for p in ports)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_the_child_command_runs_this_checkout_from_a_folder_that_shadows_it(tmp_path):
    from dpbert.trainer_workers import MODULE

    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "__init__.py").write_text("")
    (tmp_path / "pipeline" / "workers.py").write_text("print('the shadow ran')\n")
    # and a folder named like the package, with no __init__.py (the clone, seen from its parent):
    # ``python -m`` imported it as a namespace package and the noise check's workers failed
    (tmp_path / "dpbert").mkdir()
    (tmp_path / "dpbert" / "README.md").write_text("not the package\n")
    result = subprocess.run(module_command(MODULE), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "the shadow ran" not in result.stdout
    assert result.returncode == 2 and "usage: python -m dpbert.trainer_workers" in result.stderr
