"""Distributed training on torch.distributed: what a process knows of its job (:mod:`.job`), the job's
communication (:mod:`.comm`), micrograph schedules (:mod:`.schedule`) and the local launcher (:mod:`.launch`)."""
