"""Driver: what ``dualtrain run``, ``compare`` and ``export`` do in the launcher process.

``runs``: validate -> plan (:class:`~dualtrain.driver.runs.RunPlan`) -> run directory -> launch ->
restart (``launching``: the workers launched and restarted); ``dryrun``: the plan printed;
``compare``: the four runs of a compare and their report (``compare_plan``: which runs;
``compare_out``: its output folder); ``export``: a finished run's weights for use without
dualtrain; ``outdir``: is --out usable.
"""
