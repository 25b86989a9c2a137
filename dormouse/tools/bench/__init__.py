"""`dormouse bench`: time the trainer's own step (or a same-size baseline, or the KDA op alone); one row
per model in a history TSV, the full log of each in a log folder.

By job:

- command.py: the flags, the models to time, the rows appended;
- step.py: the trainer's training step; baselines.py (models in baseline_models.py): a plain GPT or
  fla's KDA model at the same size; op.py: the KDA op alone;
- timing.py: what the models of one bench share (per-step timer, log head and tail, common cells);
- flops.py: FLOPs per step (MFU's numerator); device.py: device name, peak (MFU's denominator), memory;
- profiling.py: `--profile`'s tables and the device's idle time;
- rows.py: the history's columns and appending a row; provenance.py: commit and code fingerprint.
"""
