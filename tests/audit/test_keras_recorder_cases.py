"""The Keras recorder on what real scripts feed and build (in one child process, one case a line):
inputs whose width is unknown when traced (digested on the host, as NumPy's row_digests), two
sub-models with layers of one name, a custom layer's add_weight and BatchNorm's statistics, a dict
input in either key order, a model compiled again after the recorder was made, the dtype policy,
and an error inside fit before its callbacks run."""

from __future__ import annotations

import pytest

from dualtrain.audit.read import read_recorded
from testkit.tf_runs import run_python


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("keras_cases")
    proc = run_python("-m", "tests.audit.keras_cases", str(out), timeout=180)
    cases = (
        "generator",
        "towers",
        "custom",
        "dict",
        "recompiled",
        "xla",
        "precision",
        "early",
        "lr",
        "twice",
        "fits",
        "decay",
        "restored",
        "data",
        "frozen",
        "lrcb",
        "stop",
        "own",
    )
    lines = {line.split(" ", 1)[0]: line for line in proc.stdout.splitlines()}
    missing = [c for c in cases if c not in lines]
    assert not missing, f"{missing}: {proc.stdout}\n{proc.stderr[-3000:]}"
    return lines


def test_inputs_of_a_width_unknown_when_traced_are_digested_on_the_host(printed):
    # a from_generator dataset with None dimensions: two batches of different widths, each
    # replica's digests NumPy's row_digests of the rows fed; two steps (none for the batch fit
    # began when the generator's length was not yet known)
    assert printed["generator"] == "generator 2 2 True True"


def test_two_sub_models_with_layers_of_one_name_keep_every_array(printed):
    # 10 variables, 10 arrays: each tower's fc1 named by its tower (left.fc1.weight); a weight
    # map, which names Keras variables by path, cannot tell them apart: a one-line error
    assert printed["towers"] == (
        "towers 10 10 True True |weight_map names Keras variables by path, and the model has 2 "
        "variables at 'fc1/kernel': give its layers distinct names"
    )


def test_a_custom_layers_weights_and_batchnorm_statistics_are_recorded(printed):
    # add_weight's own names (layout kept), BatchNorm's moving statistics, no seed state; a
    # BatchNormalization(synchronized=True) recorded as synchronised over the replicas
    want = "bn.bias,bn.running_mean,bn.running_var,bn.weight,fc.bias,fc.weight,scale.s,scale.w"
    assert printed["custom"] == f"custom {want} True True"


def test_a_dict_input_is_digested_by_its_key_not_its_insertion_order(printed):
    assert printed["dict"] == "dict True True"


def test_a_model_compiled_again_after_the_recorder_has_its_grad_norm(printed):
    # every step's norm finite: the new optimizer's, unwrapped after fit
    assert printed["recompiled"] == "recompiled 2 True False False"


def test_a_model_compiled_again_with_jit_compile_fits_without_xla_while_recorded(printed):
    # the new compile's jit_compile=True: fit runs without XLA (the recorder's tf.py_function),
    # then the model is as compiled
    assert printed["xla"] == "xla 2 True False True"


def test_the_dtype_policy_is_recorded(printed):
    want = '{"policy": "mixed_float16", "compute_dtype": "float16", "variable_dtype": "float32"}'
    assert printed["precision"] == f"precision {want}"


def test_a_fit_failing_before_its_callbacks_and_an_uncompiled_model(printed):
    # fit's own error before on_train_begin: no folder written (the recorder writes from fit's
    # start), the model unwrapped; an uncompiled model: a one-line error before anything is
    # written or claimed
    want = "early False False False |keras_recorder needs a compiled model (call model.compile"
    assert printed["early"].startswith(want), printed["early"]


def test_only_the_fit_given_the_recorder_is_recorded_and_once(printed):
    """A warm-up fit before the recorded one used to leave rows of step 0 and reuse its train
    function (no gradient norm at any recorded step); a second fit given the closed recorder
    trained unrecorded, silently."""
    assert printed["fits"] == (
        "fits 2 [1, 2] True this_audit_recorder_is_closed;_make_a_new_one_for_another_fit"
    ), printed["fits"]


def test_the_variables_left_out_of_weight_decay_are_recorded(printed):
    assert printed["decay"] == "decay ['fc.bias'] True", printed["decay"]


def test_the_lr_is_the_one_the_update_used(printed):
    # read in the optimizer's all-reduce wrapper, so a per-batch callback placed after the
    # recorder is seen (at the batch's start the recorder would read the previous batch's lr)
    assert printed["lr"] == "lr 0.1 0.2 0.3"


def test_a_recorder_listed_twice_in_callbacks_records_once(printed):
    # fit calls it twice at every event; the second on_train_end wrote into removed parts/
    assert printed["twice"] == "twice complete 2 2"


def test_the_initial_weights_are_those_the_first_step_uses(printed):
    # a callback after the recorder that restores weights (BackupAndRestore resuming): before,
    # the weights read at on_train_begin were the fresh ones, and a resumed run passed the
    # initial-weights check against a fresh one
    assert printed["restored"] == "restored 2 True"


@pytest.mark.slow  # two TF worker processes, twice (~20 s alone, ~60 s in CI's load): the sweep
@pytest.mark.sweep
def test_multi_worker_with_a_chief_task_and_a_recorder_on_the_chief_only(tmp_path):
    """TF_CONFIG with a chief task and a worker (both task_id 0): the recorder numbers them as
    MWMS does (0 and 1), where both used to write part 0 and fail; a recorder on the chief only
    is a one-line error as fit begins, with nothing written (it used to train, then wait at its
    end for the worker's part and leave the folder 'recording')."""
    script = ("-m", "tests.audit.keras_mwms_case")
    both = run_python(*script, str(tmp_path / "a"), "--chief-task", timeout=240)
    assert "codes [0, 0]" in both.stdout, both.stderr[-3000:]
    run = read_recorded(tmp_path / "a")
    assert sorted({rep for _, rep in run.replicas}) == [0, 1] and len(run.steps) == 8
    lone = run_python(*script, str(tmp_path / "b"), "--chief-only", timeout=240)
    assert "codes [3, " in lone.stdout, lone.stdout + lone.stderr[-3000:]
    error = (tmp_path / "b.rank0.err").read_text()
    assert error.count("\n") == 1 and "worker(s) [1] made none in 5 s" in error
    assert not (tmp_path / "b").exists()


def test_the_datasets_split_over_workers_is_recorded(printed):
    # a tf.data dataset's auto-shard policy (compare names a different one); arrays: their kind
    # and fit's own shuffle of them (its default, True)
    assert printed["data"] == (
        'data {"auto_shard_policy":"FILE","kind":"tf.data.Dataset","workers":1} '
        '{"fit_shuffle":true,"kind":"ndarray","workers":1}'
    )


def test_a_frozen_layers_parameters_are_recorded_not_its_statistics(printed):
    assert printed["frozen"] == 'frozen {"body.bias":4,"body.weight":12}'


def test_fits_lr_callbacks_and_its_shuffle_of_arrays_are_recorded(printed):
    assert printed["lrcb"] == "lrcb ReduceLROnPlateau 3 0.2 loss False", printed["lrcb"]


def test_the_final_weights_are_those_an_early_stopping_restores(printed):
    # stopped after epoch 2 (index 1), its best weights (epoch 1's) restored after the
    # recorder's on_train_end: the record holds them, not epoch 2's
    assert printed["stop"] == "stop 1 True True True", printed["stop"]


def test_callbacks_called_by_a_loop_of_the_scripts_own_are_one_line(printed):
    # a strategy.run loop calling the recorder's callbacks: the record held steps without rows
    # or losses, complete, and compare PASSed its samples
    assert printed["own"] == "own UserError keras_recorder records model.fit failed", printed["own"]
