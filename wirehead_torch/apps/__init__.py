"""Applications built on the library: the `wirehead-torch` command (cli),
the monitor, the SLURM job commands (jobs), the demo and its procedural
generator (synth). The library (wirehead_torch) never imports these."""
