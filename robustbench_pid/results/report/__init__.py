"""What a reader sees beyond tables: the HTML report, plots, gradient-masking diagnostics, the evidence and
attention sections and the run summary printed after evaluate."""
