"""The import environment that names a warm server (dualtrain.launch.forkserver): what a
framework can read at import, with PYTHONPATH as the interpreter takes it."""

from dualtrain.launch.forkserver import import_environment


def test_the_same_folders_written_differently_share_a_server(tmp_path):
    root, other = str(tmp_path / "checkout"), str(tmp_path / "elsewhere")
    # the CLI prepends the checkout to an empty PYTHONPATH ("root:"), the launcher prepends it
    # again ("root:root:"), an in-process tool's environment has it once
    keys = [
        import_environment({"PYTHONPATH": p, "A": "1"}, set(), {}, cwd=root)
        for p in (root, f"{root}:", f"{root}:{root}:", f"{root}/x/..:")
    ]
    assert all(k == {"PYTHONPATH": root, "A": "1"} for k in keys), keys
    # an empty entry is the worker's own directory (sys.path takes it so): elsewhere, another path
    assert import_environment({"PYTHONPATH": f"{root}:"}, set(), {}, cwd=other) == {
        "PYTHONPATH": f"{root}:{other}"
    }
    # relative entries are the worker's directory's; the order of distinct folders is kept
    assert import_environment({"PYTHONPATH": f"sub:{root}"}, set(), {}, cwd=other) == {
        "PYTHONPATH": f"{other}/sub:{root}"
    }


def test_per_worker_and_dualtrain_variables_are_left_out_and_preimport_added():
    env = {"RANK": "1", "DUALTRAIN_X": "y", "PYTEST_CURRENT_TEST": "t", "OMP_NUM_THREADS": "1"}
    env |= {"TF_CONFIG": '{"task": {"type": "chief"}}', "SLURM_PROCID": "0"}
    # an external cluster's tasks differ in TF_CONFIG only: read when the strategy is made, not
    # at TF's import, so they share a server
    assert import_environment(env, set(), {"TF_CPP_MIN_LOG_LEVEL": "2"}) == {
        "OMP_NUM_THREADS": "1",
        "SLURM_PROCID": "0",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    assert import_environment(env, {"SLURM_PROCID"}, {"TF_CPP_MIN_LOG_LEVEL": "2"}) == {
        "OMP_NUM_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    # what the worker's environment sets already wins over the backend's default
    assert import_environment(
        {"TF_CPP_MIN_LOG_LEVEL": "3"}, set(), {"TF_CPP_MIN_LOG_LEVEL": "2"}
    ) == {"TF_CPP_MIN_LOG_LEVEL": "3"}
