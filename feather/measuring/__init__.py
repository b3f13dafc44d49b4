"""The one protocol every real timing follows (engine runs, the engine-trained learners'
held-out evaluation, online serving, the kernel and CPU-attention benches, the overhead bench).

- `order`: the arms compared are interleaved within each repeat, the order rotated from one
  repeat to the next, so drift and a neighbour's bursts fall on every arm alike.
- `quiet`: each measurement records what else ran during it (other processes' CPU time and
  our own threads' wait for a core, from /proc; the load) and a short fixed reference probe
  before and after; a repeat taken on a busy machine is taken again, a bounded number of times.
- `stats`: ratios paired within a repeat; a median with a distribution-free 95% interval
  (order statistics) and its n.
- `protocol`: the loop that runs repeats in that order, watches them and retakes them.

A simulator's number is deterministic and goes through none of this.
"""
