"""What the Keras recorder's cases share (tests/audit/keras_cases.py runs them): where they write,
the strategy scope, a recorder closed after each case, reading a record's files."""

import json

import numpy as np
import tensorflow as tf

import dualtrain.audit as audit

OUT = ""  # set by tests/audit/keras_cases.py
SCOPE = tf.distribute.MirroredStrategy(["/cpu:0"]).scope
recs = []


def recorder(name, model, **kw):
    recs.append(audit.keras_recorder(OUT + "/" + name, model=model, **kw))
    return recs[-1]


def case(name, fn):
    try:
        print(name, *fn())
    except Exception as e:
        print(name, "ERROR", type(e).__name__, str(e).splitlines()[0][:300])
    for r in recs:
        r.close()  # a case that failed half-way leaves the process free for the next


def lines(name, file):
    return [json.loads(line) for line in open(f"{OUT}/{name}/{file}")]


def weights(name):
    return np.load(f"{OUT}/{name}/weights_init.npz")
