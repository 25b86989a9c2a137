"""Parallelism, applied from outside a plain model (docs/distributed.md): the model under dormouse/model/
uses no torch.distributed; a torchrun job's rank builds it as one process does, then `parallelize`s it.

- world.py: torchrun's process group and the collectives the trainer and the eval need (`World`);
- parallelize.py: the parallelize step (the engram tables' rows, then DDP or FSDP2);
- ddp.py: DDP replicas and the engram tables' sparse gradients averaged over the ranks;
- fsdp.py: FSDP2 sharding and checkpoints' moves between sharded and whole state;
- engram_shard.py: the engram tables' rows split over the ranks (`--engram-shard`).
"""
