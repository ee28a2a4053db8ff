"""radixserve's runtime: config, messages, IPC, launch, the in-process Engine, the model runner."""
