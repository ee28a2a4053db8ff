"""Model execution: resolving the config for this machine, loading weights, the ModelRunner (one
forward step: inputs, attention backend, sampling) and the parts it calls (batch planning, CUDA
graphs, the tensor-parallel follower). Runs in the scheduler process; the main process only calls
its config resolution."""
