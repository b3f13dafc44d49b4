"""Decode-attention kernels for one step of a batch over a paged KV cache (claims C1, C2, C7).

Nothing is imported here: the kernels need torch (and triton), which the rest of the package
does not; import the modules explicitly:

- `plan`: what each kernel reads (paged, cascade, pat), as segments; `tree`: the batch's
  prefix tree (built by `feather.batch_tree.BatchTree`); `merge`: the log-sum-exp merge;
- `attend_torch` (CPU/GPU) and `attend_triton` (GPU; CPU under TRITON_INTERPRET) execute a
  plan; `paged_decode`: the plain paged Triton kernel (also used by gpu/l2_probe.py);
- `decode`: kernels by name; `traffic`: bytes each kernel moves; `batches`: synthetic
  block tables.
"""
