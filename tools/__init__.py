"""The `kstrata` command line, benchmark drivers and report rendering."""
