"""The autoscaler of one host's GPU workers, in one place.

``policy``: from one worker family's readings to up, down or hold (pure); ``profiles``: the learned
peaks in Redis; ``supervisor``: worker processes started, warm-stopped and restarted; ``families``:
a GPU's queues (gpuN, gpuN.<stage>) and their workers' commands; ``service``: the tick that reads,
decides and acts; ``cli``: ``python -m tasks.autoscaler`` (scripts/autoscaler.py). Nothing here
touches CUDA; importing this package imports none of its modules.
"""
