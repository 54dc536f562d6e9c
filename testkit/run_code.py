"""``python -m testkit.run_code CODE [ARG ...]`` runs CODE as ``python -c CODE [ARG ...]`` does, so
a test's script can be forked from a warm server, which runs modules
(dualtrain.launch.forkserver; testkit.tf_runs.run_python)."""

import sys

if __name__ == "__main__":
    code = sys.argv[1]
    sys.argv = ["-c", *sys.argv[2:]]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
