"""Probes over several processes: FSDP2 launch, the per-rank side, tensor parallelism."""
