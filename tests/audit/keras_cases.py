"""The Keras recorder's cases (tests/audit/test_keras_recorder_cases.py), run in one TF process:
``python -m tests.audit.keras_cases OUT`` prints one line a case, ``NAME VALUES...`` (or ``NAME
ERROR ...``), each case's records written under OUT."""

import sys

from tests.audit import keras_case_kit as kit
from tests.audit import keras_cases_fit, keras_cases_model

if __name__ == "__main__":
    kit.OUT = sys.argv[1]
    for name, fn in [*keras_cases_model.CASES, *keras_cases_fit.CASES]:
        kit.case(name, fn)
