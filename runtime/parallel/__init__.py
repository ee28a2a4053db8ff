"""Tensor parallelism: the rank group and its collectives (torch.distributed or shared memory),
the shard plan, and the parallel layers the models are built from. Imports the contracts and the
kernels, never the models or the runner above it."""
