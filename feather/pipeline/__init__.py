"""What the Snakemake pipeline needs from Python: experiments, aggregation, figures."""
