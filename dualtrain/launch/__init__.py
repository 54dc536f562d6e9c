"""Launch: starting and watching worker processes (framework-free).

``local``: the workers of one host, their signals and exit codes (``child``: a child process's
environment, a question asked in one); ``cluster``: the standard launch
conventions (torchrun, TF_CONFIG, Slurm, MPI) read into one shape; ``netif``/``peers``: which
interface reaches the other hosts and which peer was lost.
"""
