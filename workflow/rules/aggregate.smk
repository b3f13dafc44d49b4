# Every run's summary in one table (results/summary.parquet and .csv), provenance included.


rule aggregate:
    input:
        summaries=summary_paths() + config.get("extra_runs", []),
    output:
        parquet="results/summary.parquet",
        csv=report("results/summary.csv", caption="../report/summary.rst", category="Tables"),
    log:
        "logs/aggregate.log",
    run:
        from feather.pipeline.aggregate import aggregate

        with logged_to(log[0]):
            aggregate(list(input.summaries), output.parquet, output.csv, labels=LABELS)
