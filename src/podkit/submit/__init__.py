"""Cluster engines: a run as a SLURM batch job (`slurm.py`, its job-side steps in
`slurm_job.py`) or as Kubernetes manifests (`k8s.py`); `cli.py` is `podkit submit`."""
