"""Process plumbing, knowing nothing of what the processes compute: a cluster's ports and
``TF_CONFIG`` (``cluster``), the one supervisor of child processes (``supervisor``), a Vertex AI
custom job at run time (``vertex``) and the ``Launcher`` protocol over them (``launcher``).
Imports only the standard library (Google Cloud's client when a custom job is submitted).
docs/scaling-out.md."""
from dpbert.launch.launcher import (InProcessLauncher, Job, Launcher, LocalWorkersLauncher,
                                    VertexCustomJobLauncher)
from dpbert.launch.supervisor import LaunchFailed, WorkerFailed
from dpbert.launch.vertex import CustomJobFailed

__all__ = ["Job", "Launcher", "InProcessLauncher", "LocalWorkersLauncher", "VertexCustomJobLauncher",
           "LaunchFailed", "WorkerFailed", "CustomJobFailed"]
