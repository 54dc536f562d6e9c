"""Records: what a run leaves on disk and how it is read back (framework-free).

``record``: the run directory's files (spec.yaml, metrics.jsonl, summary.json, weights) and
:class:`~dualtrain.records.record.RunRecord`; ``tbevents``: TensorBoard event files written without
TensorFlow; ``envinfo``: the facts about the machine and packages a run records.
"""
